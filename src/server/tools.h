/* tools.h — the server's tool calls and constrained output: parsing `tools`, `tool_choice`,
 * `parallel_tool_calls`, `response_format` and the tool parts of messages; the chat options that render
 * them; the grammar that constrains a required/named tool call or a JSON answer; the tool calls read back
 * from generated ids into OpenAI `tool_calls` (whole, or as streaming deltas). */
#ifndef DF_SRV_TOOLS_H
#define DF_SRV_TOOLS_H

#include <jansson.h>
#include "server/request.h"
#include "server/srv_internal.h"

#define SRV_MAX_TOOLS 64

/* ---- request (tools_request.c; pure: no model) ---- */
/* A tool name as the APIs allow it: 1-64 characters of a-z, A-Z, 0-9, _ and -. */
int tools_name_valid(const char *s);
/* A top-level chat field: 1 = handled, 0 = not one of ours, -1 = refused (err filled). */
int tools_parse_field(srv_request *r, const char *key, json_t *v, srv_err *err);
/* The tool parts of message i (tool_calls, tool_call_id, name) once its role is known; -1 = refused. */
int tools_parse_message(srv_message *m, json_t *obj, size_t i, srv_err *err);
/* Checks across fields (a named tool exists, constrained schemas are supported). */
int tools_check_request(const srv_request *r, srv_err *err);
void tools_request_free(srv_request *r);

/* ---- prompt and generation ---- */
/* Fills co's tool/format fields from the request; *keep holds what they point to (tools_chat_free). */
void tools_chat_opts(const srv_request *r, chat_opts *co, void **keep);
void tools_chat_free(void *keep);
/* The request constrains generation (JSON output, or a required/named tool call): thinking goes off. */
int tools_constrained(const srv_request *r);
/* Builds the job's grammar and tool-call parser (after the prompt); -1 with a 400 when the model cannot. */
int tools_prepare(srv *s, srv_job *j, srv_err *err);
/* Worker: hooks the job's constraint and parser into the decode loop. */
void tools_gen_config(srv *s, srv_job *j, gen_config *cfg);
void tools_job_free(srv_job *j);

/* ---- responses ---- */
/* Streaming: a chunk with the tool-call deltas that appeared since the last call (nothing when none). */
void tools_sse_deltas(const srv *s, srv_job *j, int final, text_buf *out);
/* "tool_calls" when the answer ended normally and every call in it parsed (header, end marker, arguments a
 * JSON object), else dflt. */
const char *tools_finish_reason(const srv_job *j, const char *dflt);
/* Adds message.tool_calls, the calls that parsed (content becomes null when empty); nothing when none did. */
void tools_final_message(const srv_job *j, json_t *msg);
/* The answer's tool calls so far, for other wire formats: how many (at most one when parallel_tool_calls is
 * false), and call i (its id is NULL until its header is complete; done once its end was seen). */
int tools_n_calls(const srv_job *j);
const struct chat_call *tools_call(const srv_job *j, int i);

#endif
