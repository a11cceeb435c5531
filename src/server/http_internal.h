/* http_internal.h — what the two halves of the HTTP layer share: the request context, its routes, and the
 * plain responses (http.c), used by the handlers of the POST routes (http_post.c). */
#ifndef DF_HTTP_INTERNAL_H
#define DF_HTTP_INTERNAL_H

#include <microhttpd.h>
#include "server/srv_internal.h"

typedef enum {
    R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_PAGE, R_TOKENIZE, R_DETOKENIZE,
    R_PROPS, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES
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
/* Fills j->req (a chat request, n = 1, for another wire API) from cc's body; -1 with err on a bad request. */
typedef int (*http_parse_fn)(srv *s, conn_ctx *cc, srv_job *j, const srv_limits *lim, srv_err *err);
/* A generation in proto's shapes (NULL: OpenAI's): parsed, tokenised, queued, answered or streamed;
 * count_only: answers proto->count_json once the prompt is tokenised. */
enum MHD_Result http_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_proto *proto,
                              http_parse_fn parse, int count_only);
/* api_messages.c, api_responses.c */
enum MHD_Result api_handle_messages(srv *s, struct MHD_Connection *c, conn_ctx *cc);
enum MHD_Result api_handle_responses(srv *s, struct MHD_Connection *c, conn_ctx *cc);
enum MHD_Result http_handle_tokens(srv *s, struct MHD_Connection *c, conn_ctx *cc);

#endif
