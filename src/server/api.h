/* api.h — what the Anthropic Messages (api_messages.c) and OpenAI Responses (api_responses.c) front ends
 * share: both translate their request into the server's chat request (srv_request: messages, tools,
 * tool_choice, constrained output), so that prompts, tools, grammars, slots and the prompt cache are the
 * chat path's own, and write their answers through a srv_proto. */
#ifndef DF_SRV_API_H
#define DF_SRV_API_H

#include <jansson.h>
#include "server/http_internal.h"
#include "server/tools.h"

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
void api_note_ignored(api_build *b, const char *field);

/* Checks shared by both parsers; each returns -1 with b->err set. */
int api_refuse(api_build *b, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int api_get_number(api_build *b, json_t *v, const char *name, double lo, double hi, float *out);
int api_get_int(api_build *b, json_t *v, const char *name, long long lo, long long hi, long long *out);
int api_get_model(api_build *b, json_t *v);
/* A JSON schema for constrained output (json_schema): -1 when it cannot be generated. */
int api_set_schema(api_build *b, const char *param, json_t *schema);

/* The request parsers (pure: no model, no I/O; fuzzed): fill j->req, as a chat request, and j->proto_state
 * from a body; -1 with err (an HTTP 4xx) on a bad request. */
int api_messages_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err);
int api_responses_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err);
extern const srv_proto api_messages_proto, api_responses_proto;

/* "event: NAME\ndata: JSON\n\n" (o is consumed; nothing is written when out is NULL). */
void api_sse(text_buf *out, const char *event, json_t *o);
/* Valid UTF-8 prefix length of p[0..n), stopping before an incomplete sequence. */
size_t api_utf8_prefix(const char *p, size_t n);
/* Bytes as a JSON string (invalid UTF-8 replaced). */
json_t *api_string(const char *p, size_t n);

#endif
