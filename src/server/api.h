/* api.h — the wire APIs besides OpenAI's that clients of local engines speak: ollama's /api/... (api_ollama.c)
 * and llama.cpp's native POST /completion (api_llama.c). A generation request of theirs is turned into the
 * OpenAI body request.c validates, so every check and limit is the same, and is answered through its own
 * srv_wire (NDJSON for ollama, SSE with llama-server's fields for /completion). */
#ifndef DF_SRV_API_H
#define DF_SRV_API_H

#include "server/http_internal.h"

/* A foreign request turned into an OpenAI one. */
typedef struct api_call {
    char *body;            /* the OpenAI body (malloc'd), or NULL when answer is set */
    srv_endpoint ep;
    const srv_wire *wire;  /* set as soon as the route is known, so that errors take its shape */
    void *wire_ctx;        /* the wire's per-request state (the job takes it) */
    char *answer;          /* JSON to answer at once, without generating (ollama's "load" of an empty prompt) */
    char *ignored;         /* the foreign API's fields that change nothing here, comma-separated; NULL if none */
} api_call;

/* The route of an /api/... path or /completion; R_NONE when it is none of these. */
route api_route_of(const char *url);
int api_route_is_post(route r);
/* Routes that generate through api_translate. */
int api_is_foreign(route r);
/* Routes that answer without the API key (only what reveals nothing: the version). */
int api_route_is_public(route r);

/* Fills out from a foreign request body; -1 with err on a bad request (out->wire is then still set). */
int api_translate(srv *s, route r, const char *body, size_t len, api_call *out, srv_err *err);
void api_call_free(api_call *c);

/* The ollama routes that do not generate: /api/version, /api/tags, /api/ps, /api/show. */
enum MHD_Result api_ollama_handle(srv *s, struct MHD_Connection *c, conn_ctx *cc);
/* GET / and HEAD /: the chat page for a browser (its Accept names text/html), else "Ollama is running" as
 * ollama answers, which is how ollama clients probe a server. */
enum MHD_Result api_send_root(srv *s, struct MHD_Connection *c, conn_ctx *cc);

/* api_ollama.c / api_llama.c: their translators (api_translate dispatches) */
int api_ollama_translate(srv *s, route r, json_t *root, api_call *out, srv_err *err);
int api_llama_translate(srv *s, json_t *root, api_call *out, srv_err *err);

/* Shared by both: a served model's name (an ollama ":latest" tag taken off), or NULL. */
const char *api_served_name(const srv *s, const char *asked);
/* Appends name to a comma-separated list of ignored fields. */
void api_note_ignored(api_call *c, const char *name);

#endif
