/* api.h — the wire APIs besides OpenAI's chat/completions that clients speak: Anthropic's Messages
 * (api_messages.c) and OpenAI's Responses (api_responses.c), which build the server's chat request
 * (srv_request: messages, tools, tool_choice, constrained output) directly, and ollama's /api/...
 * (api_ollama.c) and llama.cpp's native POST /completion (api_llama.c), which are turned into the OpenAI body
 * request.c validates. Either way prompts, tools, grammars, slots, limits and the prompt cache are the chat
 * path's own, and every answer is written through the API's srv_wire (srv_internal.h): SSE for Messages,
 * Responses and /completion, NDJSON for ollama. */
#ifndef DF_SRV_API_H
#define DF_SRV_API_H

#include <jansson.h>
#include "server/http_internal.h"
#include "server/tools.h"

/* ---- routing (api_ollama.c) ---- */

/* What `deltafin serve` hands the server (srv_opts.api): every route below, answered through the handlers. */
const http_api *api_routes(void);

/* The route of an /api/... path or /completion; R_NONE when it is none of these. */
route api_route_of(const char *url);
int api_route_is_post(route r);
/* Routes that generate (or count a prompt's tokens) through a wire: the access log reports their counts. */
int api_route_generates(route r);
/* Routes that answer without the API key (only what reveals nothing: the version). */
int api_route_is_public(route r);

/* The handlers: Messages and count_tokens, Responses, ollama's chat/generate and /completion (translated),
 * ollama's routes that do not generate (/api/version, /api/tags, /api/ps, /api/show). */
enum MHD_Result api_handle_messages(srv *s, struct MHD_Connection *c, conn_ctx *cc);
enum MHD_Result api_handle_responses(srv *s, struct MHD_Connection *c, conn_ctx *cc);
enum MHD_Result api_handle_translated(srv *s, struct MHD_Connection *c, conn_ctx *cc);
enum MHD_Result api_ollama_handle(srv *s, struct MHD_Connection *c, conn_ctx *cc);
/* GET / and HEAD /: the chat page for a browser (its Accept names text/html), else "Ollama is running" as
 * ollama answers, which is how ollama clients probe a server. */
enum MHD_Result api_send_root(srv *s, struct MHD_Connection *c, conn_ctx *cc);

/* Appends field to a comma-separated list of fields ignored (bounded). */
void api_note_ignored(text_buf *list, const char *field);

/* ---- Messages and Responses: the chat request built directly (api_common.c) ---- */

/* A request being built: messages and tools grow here, then move into the srv_request. */
typedef struct api_build {
    srv_request *r;
    srv_err *err;
    const srv_limits *lim;
    int cap_msgs;
    json_t *tools;        /* the chat tools array (OpenAI shape) the template declares */
    text_buf ignored;     /* fields ignored, comma-separated */
} api_build;

/* r becomes an empty chat request (n = 1, default sampling). */
void api_build_init(api_build *b, srv_request *r, srv_err *err, const srv_limits *lim);
/* Moves the tools into r and runs the chat checks (named tool exists, schemas generate). -1 on a refusal. */
int api_build_finish(api_build *b);
void api_build_free(api_build *b);

/* A new message (role copied; content "" until set). */
srv_message *api_add_message(api_build *b, const char *role);
/* The last message when it has this role, else NULL. */
srv_message *api_last_message(api_build *b, const char *role);
void api_append_text(char **dst, const char *text, size_t len, const char *sep);
/* An assistant tool call (arguments: JSON text, copied). */
void api_add_tool_call(srv_message *m, const char *id, const char *name, const char *arguments);
/* A function tool; parameters may be NULL (any object). -1 (err set) on a bad name, a duplicate or too many. */
int api_add_tool(api_build *b, const char *param, const char *name, const char *description, json_t *parameters);

/* Checks shared by both parsers; each returns -1 with b->err set. */
int api_refuse(api_build *b, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int api_get_number(api_build *b, json_t *v, const char *name, double lo, double hi, float *out);
int api_get_int(api_build *b, json_t *v, const char *name, long long lo, long long hi, long long *out);
int api_get_model(api_build *b, json_t *v);
/* A JSON schema for constrained output (json_schema): -1 when it cannot be generated. */
int api_set_schema(api_build *b, const char *param, json_t *schema);

/* The request parsers (pure: no model, no I/O; fuzzed): fill j->req, as a chat request, and j->wire and
 * j->wire_ctx from a body; -1 with err (an HTTP 4xx) on a bad request. */
int api_messages_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err);
int api_responses_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err);
extern const srv_wire api_messages_wire, api_responses_wire;

/* "event: NAME\ndata: JSON\n\n" (o is consumed; nothing is written when out is NULL). */
void api_sse(text_buf *out, const char *event, json_t *o);
/* Valid UTF-8 prefix length of p[0..n), stopping before an incomplete sequence. */
size_t api_utf8_prefix(const char *p, size_t n);
/* Bytes as a JSON string (invalid UTF-8 replaced). */
json_t *api_string(const char *p, size_t n);

/* ---- ollama and /completion: translated into an OpenAI body (api_ollama.c, api_llama.c) ---- */

/* A foreign request turned into an OpenAI one. */
typedef struct api_call {
    char *body;            /* the OpenAI body (malloc'd), or NULL when answer is set */
    srv_endpoint ep;
    const srv_wire *wire;  /* set as soon as the route is known, so that errors take its shape */
    void *wire_ctx;        /* the wire's per-request state (the job takes it) */
    char *answer;          /* JSON to answer at once, without generating (ollama's "load" of an empty prompt) */
    text_buf ignored;      /* the foreign API's fields that change nothing here, comma-separated */
} api_call;

/* Fills out from a foreign request body; -1 with err on a bad request (out->wire is then still set). */
int api_translate(srv *s, route r, const char *body, size_t len, api_call *out, srv_err *err);
void api_call_free(api_call *c);
int api_ollama_translate(srv *s, route r, json_t *root, api_call *out, srv_err *err);
int api_llama_translate(srv *s, json_t *root, api_call *out, srv_err *err);
/* A served model's name (an ollama ":latest" tag taken off), or NULL. */
const char *api_served_name(const srv *s, const char *asked);

#endif
