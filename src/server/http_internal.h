/* http_internal.h — what the two halves of the HTTP layer share: the request context, its routes, and the
 * plain responses (http.c), used by the handlers of the POST routes (http_post.c). */
#ifndef DF_HTTP_INTERNAL_H
#define DF_HTTP_INTERNAL_H

#include <microhttpd.h>
#include "server/srv_internal.h"

typedef enum {
    R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_PAGE, R_TOKENIZE, R_DETOKENIZE,
    R_PROPS,
    /* the other wire APIs (src/api, srv_opts.api): Anthropic's /v1/messages, OpenAI's /v1/responses, ollama's /api/... and llama.cpp's /completion */
    R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES, R_OLLAMA_VERSION, R_OLLAMA_TAGS, R_OLLAMA_PS, R_OLLAMA_SHOW,
    R_OLLAMA_CHAT, R_OLLAMA_GENERATE, R_LLAMA_COMPLETION
} route;

/* One request; shared by the connection and, for a stream, its response (refs), so that whoever ends last
 * writes the access-log line. */
typedef struct conn_ctx {
    srv *s;
    int refs;          /* srv.mu */
    route r;
    const char *model_arg;   /* /v1/models/{id} */
    text_buf body;
    int too_big;
    char method[16], path[128], addr[64];
    double t0;
    int status;
    int n_prompt, n_reused, n_gen, restored;
    double ttft;
    char *ignored;
    int context_capped;
    int http11;
} conn_ctx;

/* Drops a reference; the last one writes the access-log line and frees the context. */
void http_conn_unref(conn_ctx *cc);
/* Queues rsp (adding CORS and ignored-field headers), counts its status and destroys it. */
enum MHD_Result http_queue_response(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status,
                                    struct MHD_Response *rsp);
/* allow: the Allow header of a 405, or NULL. */
enum MHD_Result http_send_text(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status, const char *ctype,
                               const char *body, size_t len, const char *allow);
enum MHD_Result http_send_json(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status, const char *json);
enum MHD_Result http_send_error(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_err *e,
                                const char *allow);

/* The POST routes, once the whole body is in (http_post.c). */
enum MHD_Result http_handle_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc);
/* At most a few bodies are parsed at once (each may take as much memory as the body limit allows); 0 when the
 * server is stopping. */
int http_parse_enter(srv *s);
void http_parse_leave(srv *s);
/* Fills j->req (and j->wire_ctx) from cc's body, or from what arg holds; -1 with err on a bad request. */
typedef int (*http_parse_fn)(srv *s, conn_ctx *cc, void *arg, srv_job *j, const srv_limits *lim, srv_err *err);
/* A generation answered in wire's shapes (NULL: OpenAI's): parsed, tokenised, queued, answered or streamed;
 * count_only: answers wire->count_json once the prompt is tokenised. */
enum MHD_Result http_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_wire *wire,
                              http_parse_fn parse, void *arg, int count_only);
/* An error in wire's shape (NULL: OpenAI's). */
enum MHD_Result http_send_wire_error(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_wire *wire,
                                     const srv_err *e);
enum MHD_Result http_handle_tokens(srv *s, struct MHD_Connection *c, conn_ctx *cc);

/* The routes of the wire APIs besides OpenAI's (src/api), as srv_opts.api hands them in. */
typedef struct http_api {
    route (*route_of)(const char *url);   /* R_NONE when the path is none of its routes */
    int (*is_post)(route r);
    int (*generates)(route r);            /* its access-log line carries the prompt's and answer's counts */
    int (*is_public)(route r);            /* answered without the API key */
    enum MHD_Result (*handle)(srv *s, struct MHD_Connection *c, conn_ctx *cc);      /* any route route_of gave */
    enum MHD_Result (*send_root)(srv *s, struct MHD_Connection *c, conn_ctx *cc);   /* GET / and HEAD / */
} http_api;

#endif
