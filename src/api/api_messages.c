/* api_messages.c — the Anthropic Messages API: POST /v1/messages (JSON, or SSE with the named events
 * message_start, content_block_start/delta/stop, message_delta, message_stop, ping and error) and
 * /v1/messages/count_tokens. The request becomes a chat request: system text first, tool_use blocks become
 * the assistant's tool calls and tool_result blocks tool messages, thinking blocks the assistant's
 * reasoning; the answer's reasoning, text and tool calls come back as thinking, text and tool_use blocks.
 * Claude Code's per-request billing-header system block is dropped, or it would differ in the first tokens
 * of every prompt and no slot or prompt-cache prefix would ever be reused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "api/api.h"

#define BILLING_HEADER "x-anthropic-billing-header:"

enum { BLK_NONE = 0, BLK_TEXT, BLK_THINKING, BLK_TOOL };

typedef struct msg_state {
    char id[64];
    int block;          /* the open content block's kind */
    int n_blocks;       /* blocks opened so far (the open one is n_blocks - 1) */
    int n_calls;        /* tool calls given a tool_use block */
    size_t args_sent;   /* bytes of the open tool_use block's arguments sent */
    char *stop;         /* the stop sequence that ended the answer */
} msg_state;

/* ---- request ---- */

static int block_type(json_t *blk, const char **type) {
    json_t *t = json_object_get(blk, "type");
    *type = json_is_string(t) ? json_string_value(t) : NULL;
    return json_is_object(blk) && *type;
}

/* The text of a tool_result's content: a string, or blocks (text kept, images named). */
static int tool_result_text(api_build *b, json_t *content, const char *param, char **out) {
    *out = xstrdup("");
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        api_append_text(out, json_string_value(content), json_string_length(content), NULL);
        return 0;
    }
    if (!json_is_array(content)) return api_refuse(b, param, "'content' must be a string or an array of blocks.");
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        const char *type;
        if (!block_type(blk, &type)) return api_refuse(b, param, "Each content block needs a 'type'.");
        json_t *text = json_object_get(blk, "text");
        if (!strcmp(type, "text") && json_is_string(text))
            api_append_text(out, json_string_value(text), json_string_length(text), "\n");
        else if (!strcmp(type, "image") || !strcmp(type, "document"))
            api_append_text(out, "[image omitted: this model reads text only]", 43, "\n");
    }
    return 0;
}

static const char *call_name(const srv_request *r, const char *id) {
    for (int i = r->n_msgs - 1; i >= 0; i--)
        for (int k = 0; k < r->msgs[i].n_tool_calls; k++)
            if (r->msgs[i].tool_calls[k].id && !strcmp(r->msgs[i].tool_calls[k].id, id)) return r->msgs[i].tool_calls[k].name;
    return NULL;
}

static int parse_user_blocks(api_build *b, json_t *content, size_t i) {
    char *text = NULL;
    int n_results = 0;
    size_t k;
    json_t *blk;
    char param[96];
    json_array_foreach(content, k, blk) {
        const char *type;
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!block_type(blk, &type)) {
            free(text);
            return api_refuse(b, param, "Each content block needs a 'type'.");
        }
        json_t *t = json_object_get(blk, "text");
        if (!strcmp(type, "text")) {
            if (!json_is_string(t)) {
                free(text);
                return api_refuse(b, param, "A text block needs a string 'text'.");
            }
            api_append_text(&text, json_string_value(t), json_string_length(t), "\n");
        } else if (!strcmp(type, "tool_result")) {
            json_t *id = json_object_get(blk, "tool_use_id");
            char *body;
            if (!json_is_string(id)) {
                free(text);
                return api_refuse(b, param, "A tool_result block needs a string 'tool_use_id'.");
            }
            if (tool_result_text(b, json_object_get(blk, "content"), param, &body)) {
                free(body);
                free(text);
                return -1;
            }
            srv_message *m = api_add_message(b, "tool");
            free(m->content);
            m->content = NULL;
            if (json_is_true(json_object_get(blk, "is_error"))) api_append_text(&m->content, "Error: ", 7, NULL);
            api_append_text(&m->content, body, strlen(body), NULL);
            free(body);
            m->tool_call_id = xstrdup(json_string_value(id));
            const char *name = call_name(b->r, m->tool_call_id);
            if (name) m->name = xstrdup(name);
            n_results++;
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            free(text);
            srv_err_set(b->err, 400, "invalid_request_error", "unsupported_content", param,
                        "Content blocks of type '%s' are not supported: this model reads text only.", type);
            return -1;
        } else {
            char f[64];
            snprintf(f, sizeof f, "content.%.40s", type);
            api_note_ignored(&b->ignored, f);
        }
    }
    if (text || !n_results) {
        srv_message *m = api_add_message(b, "user");
        if (text) {
            free(m->content);
            m->content = text;
        }
    }
    return 0;
}

static int parse_assistant_blocks(api_build *b, json_t *content, size_t i) {
    srv_message *m = api_add_message(b, "assistant");
    size_t k;
    json_t *blk;
    char param[96];
    json_array_foreach(content, k, blk) {
        const char *type;
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!block_type(blk, &type)) return api_refuse(b, param, "Each content block needs a 'type'.");
        json_t *t = json_object_get(blk, "text");
        if (!strcmp(type, "text")) {
            if (!json_is_string(t)) return api_refuse(b, param, "A text block needs a string 'text'.");
            api_append_text(&m->content, json_string_value(t), json_string_length(t), "\n");
        } else if (!strcmp(type, "thinking")) {   /* its signature is accepted and not checked */
            json_t *th = json_object_get(blk, "thinking");
            if (!json_is_string(th)) return api_refuse(b, param, "A thinking block needs a string 'thinking'.");
            api_append_text(&m->reasoning, json_string_value(th), json_string_length(th), "\n");
        } else if (!strcmp(type, "tool_use")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name"),
                   *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name))
                return api_refuse(b, param, "A tool_use block needs string 'id' and 'name'.");
            char *args = input && !json_is_null(input) ? json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            api_add_tool_call(m, json_string_value(id), json_string_value(name), args);
            free(args);
        } else if (strcmp(type, "redacted_thinking")) {
            char f[64];
            snprintf(f, sizeof f, "content.%.40s", type);
            api_note_ignored(&b->ignored, f);
        }
    }
    return 0;
}

static int parse_messages_field(api_build *b, json_t *v) {
    if (!json_is_array(v) || !json_array_size(v))
        return api_refuse(b, "messages", "'messages' must be a non-empty array of messages.");
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return api_refuse(b, param, "A message must be an object with a 'role'.");
        const char *rs = json_string_value(role);
        int user = !strcmp(rs, "user");
        if (!user && strcmp(rs, "assistant"))
            return api_refuse(b, param, "Unsupported role '%.40s' (user, assistant; the system prompt is 'system').", rs);
        if (json_is_string(content)) {
            srv_message *msg = api_add_message(b, rs);
            free(msg->content);
            msg->content = xstrdup(json_string_value(content));
        } else if (json_is_array(content)) {
            if (user ? parse_user_blocks(b, content, i) : parse_assistant_blocks(b, content, i)) return -1;
        } else {
            return api_refuse(b, param, "'content' must be a string or an array of content blocks.");
        }
    }
    return 0;
}

/* The system prompt: a string or text blocks. A leading billing-header line changes with every request. */
static int parse_system(api_build *b, json_t *v) {
    if (!v || json_is_null(v)) return 0;
    char *text = NULL;
    if (json_is_string(v)) {
        const char *p = json_string_value(v);
        if (!strncmp(p, BILLING_HEADER, strlen(BILLING_HEADER))) {
            const char *nl = strchr(p, '\n');
            p = nl ? nl + 1 : p + strlen(p);
        }
        if (*p) api_append_text(&text, p, strlen(p), NULL);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *blk;
        json_array_foreach(v, i, blk) {
            const char *type;
            json_t *t = json_object_get(blk, "text");
            if (!block_type(blk, &type) || strcmp(type, "text") || !json_is_string(t)) {
                free(text);
                return api_refuse(b, "system", "'system' blocks must be text blocks.");
            }
            if (!strncmp(json_string_value(t), BILLING_HEADER, strlen(BILLING_HEADER))) continue;
            api_append_text(&text, json_string_value(t), json_string_length(t), "\n");
        }
    } else {
        return api_refuse(b, "system", "'system' must be a string or an array of text blocks.");
    }
    if (text) {
        srv_message *m = api_add_message(b, "system");
        free(m->content);
        m->content = text;
    }
    return 0;
}

static int parse_tools_field(api_build *b, json_t *v) {
    if (json_is_null(v)) return 0;
    if (!json_is_array(v)) return api_refuse(b, "tools", "'tools' must be an array.");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t)) return api_refuse(b, param, "A tool must be an object.");
        json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name"),
               *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
        /* the server tools (web_search_…, code_execution_…) and Anthropic-defined ones run elsewhere */
        if (json_is_string(type) && strcmp(json_string_value(type), "custom")) {
            char f[80];
            snprintf(f, sizeof f, "tools.%.60s", json_string_value(type));
            api_note_ignored(&b->ignored, f);
            continue;
        }
        if (api_add_tool(b, param, json_string_value(name), json_string_value(desc), schema)) return -1;
    }
    return 0;
}

static int parse_tool_choice_field(api_build *b, json_t *v) {
    if (json_is_null(v)) return 0;
    json_t *type = json_object_get(v, "type"), *name = json_object_get(v, "name");
    if (!json_is_object(v) || !json_is_string(type))
        return api_refuse(b, "tool_choice", "'tool_choice' must be an object with a 'type' (auto, any, tool, none).");
    const char *t = json_string_value(type);
    srv_request *r = b->r;
    if (!strcmp(t, "auto")) r->tool_choice = SRV_TOOLS_AUTO;
    else if (!strcmp(t, "any")) r->tool_choice = SRV_TOOLS_REQUIRED;
    else if (!strcmp(t, "none")) r->tool_choice = SRV_TOOLS_NONE;
    else if (!strcmp(t, "tool")) {
        if (!json_is_string(name)) return api_refuse(b, "tool_choice.name", "tool_choice 'tool' needs a 'name'.");
        r->tool_choice = SRV_TOOLS_NAMED;
        free(r->tool_choice_name);
        r->tool_choice_name = xstrdup(json_string_value(name));
    } else {
        return api_refuse(b, "tool_choice.type", "Unsupported tool_choice type '%.40s' (auto, any, tool, none).", t);
    }
    if (json_is_true(json_object_get(v, "disable_parallel_tool_use"))) r->parallel_tool_calls = -1;
    return 0;
}

static int parse_stop_sequences(api_build *b, json_t *v) {
    if (json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) > SRV_MAX_STOP)
        return api_refuse(b, "stop_sequences", "'stop_sequences' must be an array of at most %d strings.", SRV_MAX_STOP);
    srv_request *r = b->r;
    r->stop = xcalloc(json_array_size(v) + 1, sizeof *r->stop);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) > SRV_MAX_STOP_LEN)
            return api_refuse(b, "stop_sequences", "Each stop sequence must be a string of at most %d bytes.",
                              SRV_MAX_STOP_LEN);
        r->stop[r->n_stop++] = xstrdup(json_string_value(s));
    }
    return 0;
}

/* Structured output: output_format (beta) or output_config.format, {"type":"json_schema","schema":…}. */
static int parse_output_format(api_build *b, json_t *v, const char *param) {
    if (!json_is_object(v)) return 0;
    json_t *type = json_object_get(v, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "json_schema")) return 0;
    return api_set_schema(b, param, json_object_get(v, "schema"));
}

int api_messages_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err) {
    msg_state *st = xcalloc(1, sizeof *st);
    j->wire = &api_messages_wire;
    j->wire_ctx = st;
    snprintf(st->id, sizeof st->id, "msg_%s", j->id);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                    root ? "The request body must be a JSON object." : "The request body is not valid JSON (line %d: %s).",
                    je.line, je.text);
        json_decref(root);
        return -1;
    }
    api_build b;
    api_build_init(&b, &j->req, err, lim);
    int rc = parse_system(&b, json_object_get(root, "system"));
    if (!rc && !json_object_get(root, "messages"))
        rc = api_refuse(&b, "messages", "Missing required parameter: 'messages'.");
    if (!rc) rc = parse_messages_field(&b, json_object_get(root, "messages"));
    const char *key;
    json_t *v;
    srv_request *r = &j->req;
    json_object_foreach(root, key, v) {
        long long x;
        if (rc) break;
        if (!strcmp(key, "system") || !strcmp(key, "messages")) continue;
        if (!strcmp(key, "model")) rc = api_get_model(&b, v);
        else if (!strcmp(key, "max_tokens")) {
            if (!json_is_null(v) && !(rc = api_get_int(&b, v, key, 1, INT32_MAX, &x))) r->max_tokens = (int)x;
        } else if (!strcmp(key, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) rc = api_refuse(&b, key, "'stream' must be a boolean.");
            r->stream = json_is_true(v);
        } else if (!strcmp(key, "temperature")) rc = api_get_number(&b, v, key, 0, 2, &r->sp.temperature);
        else if (!strcmp(key, "top_p")) rc = api_get_number(&b, v, key, 0, 1, &r->sp.top_p);
        else if (!strcmp(key, "top_k")) {
            if (!json_is_null(v) && !(rc = api_get_int(&b, v, key, 0, INT32_MAX, &x))) r->sp.top_k = (int)x;
        } else if (!strcmp(key, "stop_sequences")) rc = parse_stop_sequences(&b, v);
        else if (!strcmp(key, "tools")) rc = parse_tools_field(&b, v);
        else if (!strcmp(key, "tool_choice")) rc = parse_tool_choice_field(&b, v);
        else if (!strcmp(key, "thinking")) {
            json_t *type = json_object_get(v, "type");
            if (json_is_string(type) && !strcmp(json_string_value(type), "disabled")) {
                free(r->reasoning_effort);
                r->reasoning_effort = xstrdup("none");
            }
        } else if (!strcmp(key, "output_format")) rc = parse_output_format(&b, v, key);
        else if (!strcmp(key, "output_config")) rc = parse_output_format(&b, json_object_get(v, "format"), "output_config.format");
        else if (!json_is_null(v)) api_note_ignored(&b.ignored, key);   /* metadata, context_management, cache_control, … */
    }
    if (!rc) rc = api_build_finish(&b);
    api_build_free(&b);
    json_decref(root);
    return rc;
}

/* ---- answer ---- */

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

static json_t *error_object(const srv_err *e) {
    /* Claude Code compacts the conversation on Anthropic's own wording of an overflow */
    char msg[720];
    unsigned long long have;
    long long ctx;
    if (strcmp(e->code, "context_length_exceeded")) snprintf(msg, sizeof msg, "%s", e->msg);
    else if (sscanf(e->msg, "The prompt has %llu tokens; this model's context is %lld tokens.", &have, &ctx) == 2)
        snprintf(msg, sizeof msg, "prompt is too long: %llu tokens > %lld maximum", have, ctx);
    else snprintf(msg, sizeof msg, "prompt is too long: %s", e->msg);
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", error_type(e->status), "message", msg);
}

static void msg_error_json(const srv_err *e, text_buf *out) {
    json_t *o = error_object(e);
    char *t = json_dumps(o, JSON_COMPACT);
    text_buf_puts(out, t);
    free(t);
    json_decref(o);
}

static int n_calls(const srv_job *j) {
    int n = tools_n_calls(j), k = 0;
    for (int i = 0; i < n; i++) k += tools_call(j, i)->id != NULL;
    return k;
}

static const char *stop_reason(const srv_job *j) {
    const msg_state *st = j->wire_ctx;
    gen_finish f = j->choices[0].finish;
    if (f == GEN_FINISH_LENGTH) return "max_tokens";
    if (st->stop) return "stop_sequence";
    return n_calls(j) ? "tool_use" : "end_turn";
}

static json_t *usage_object(const srv_job *j, int final) {
    int reused = final ? j->n_reused : 0;
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", (int)j->prompt.n - reused, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", reused, "output_tokens", final ? j->choices[0].n_gen : 0);
}

static json_t *message_object(const srv *s, const srv_job *j, json_t *content, int final) {
    const msg_state *st = j->wire_ctx;
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", st->id, "type", "message", "role", "assistant", "model",
                          j->model_name ? j->model_name : srv_model_id(s), "content", content);
    json_object_set_new(o, "stop_reason", final ? json_string(stop_reason(j)) : json_null());
    json_object_set_new(o, "stop_sequence", final && st->stop ? json_string(st->stop) : json_null());
    json_object_set_new(o, "usage", usage_object(j, final));
    return o;
}

static json_t *tool_input(const chat_call *c) {
    json_t *in = json_loadb(c->args, c->args_len, 0, NULL);
    if (json_is_object(in)) return in;
    json_decref(in);
    return json_object();   /* only an unconstrained model writes arguments that are not an object */
}

static void msg_start(const srv *s, srv_job *j, text_buf *out) {
    api_sse(out, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message",
                                            message_object(s, j, json_array(), 0)));
    api_sse(out, "ping", json_pack("{s:s}", "type", "ping"));
}

static void block_stop(srv_job *j, text_buf *out) {
    msg_state *st = j->wire_ctx;
    if (st->block == BLK_NONE) return;
    if (st->block == BLK_THINKING)   /* nothing signs it here; clients keep and send back what they get */
        api_sse(out, "content_block_delta",
                json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", st->n_blocks - 1, "delta",
                          "type", "signature_delta", "signature", "deltafin"));
    api_sse(out, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->n_blocks - 1));
    st->block = BLK_NONE;
}

static void block_open(srv_job *j, int kind, json_t *block, text_buf *out) {
    msg_state *st = j->wire_ctx;
    block_stop(j, out);
    api_sse(out, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index",
                                                  st->n_blocks, "content_block", block));
    st->n_blocks++;
    st->block = kind;
    st->args_sent = 0;
}

static void block_delta(srv_job *j, json_t *delta, text_buf *out) {
    msg_state *st = j->wire_ctx;
    api_sse(out, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index",
                                                  st->n_blocks - 1, "delta", delta));
}

/* The open tool_use block's arguments that arrived since the last delta (all when whole). */
static void tool_args(srv_job *j, const chat_call *c, int whole, text_buf *out) {
    msg_state *st = j->wire_ctx;
    size_t avail = c->args_len - st->args_sent;
    size_t take = whole ? avail : api_utf8_prefix(c->args + st->args_sent, avail);
    if (!take) return;
    block_delta(j, json_pack("{s:s,s:o}", "type", "input_json_delta", "partial_json",
                             api_string(c->args + st->args_sent, take)), out);
    st->args_sent += take;
}

static void msg_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out) {
    (void)s;
    msg_state *st = j->wire_ctx;
    if (ev->final && ev->stop && !st->stop) st->stop = xstrdup(ev->stop);
    if (!out) return;
    if (ev->reasoning_len) {
        if (st->block != BLK_THINKING)
            block_open(j, BLK_THINKING, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""), out);
        block_delta(j, json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", api_string(ev->reasoning, ev->reasoning_len)),
                    out);
    }
    if (ev->content_len) {
        if (st->block != BLK_TEXT) block_open(j, BLK_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""), out);
        block_delta(j, json_pack("{s:s,s:o}", "type", "text_delta", "text", api_string(ev->content, ev->content_len)), out);
    }
    int n = tools_n_calls(j);
    for (int i = 0; i < n; i++) {
        const chat_call *c = tools_call(j, i);
        if (!c->id) break;
        if (i < st->n_calls - 1) continue;   /* closed already */
        if (i == st->n_calls - 1 && st->block == BLK_TOOL) {
            tool_args(j, c, i < n - 1 || ev->final, out);
            continue;
        }
        if (i < st->n_calls) continue;
        block_open(j, BLK_TOOL, json_pack("{s:s,s:s,s:o,s:o}", "type", "tool_use", "id", c->id, "name",
                                          api_string(c->name, strlen(c->name)), "input", json_object()), out);
        st->n_calls++;
        tool_args(j, c, i < n - 1 || ev->final, out);
    }
    if (ev->final) block_stop(j, out);
}

static void msg_end(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    msg_state *st = j->wire_ctx;
    block_stop(j, out);
    json_t *usage = usage_object(j, 1);
    api_sse(out, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason",
                                            stop_reason(j), "stop_sequence",
                                            st->stop ? json_string(st->stop) : json_null(), "usage", usage));
    api_sse(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void msg_fail(const srv *s, srv_job *j, const srv_err *e, text_buf *out) {
    (void)s;
    (void)j;
    api_sse(out, "error", error_object(e));
}

static void msg_keepalive(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    (void)j;
    api_sse(out, "ping", json_pack("{s:s}", "type", "ping"));
}

static char *msg_final_json(const srv *s, srv_job *j) {
    const srv_choice *ch = &j->choices[0];
    json_t *content = json_array();
    if (ch->reasoning.len)
        json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                 api_string(ch->reasoning.p, ch->reasoning.len), "signature", "deltafin"));
    if (ch->content.len)
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", api_string(ch->content.p, ch->content.len)));
    for (int i = 0; i < tools_n_calls(j); i++) {
        const chat_call *c = tools_call(j, i);
        if (!c->id) continue;
        json_array_append_new(content, json_pack("{s:s,s:s,s:o,s:o}", "type", "tool_use", "id", c->id, "name",
                                                 api_string(c->name, strlen(c->name)), "input", tool_input(c)));
    }
    json_t *o = message_object(s, j, content, 1);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return t;
}

static char *msg_count_json(const srv *s, srv_job *j) {
    (void)s;
    json_t *o = json_pack("{s:i}", "input_tokens", (int)j->prompt.n);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return t;
}

static void msg_free_ctx(void *ctx) {
    msg_state *st = ctx;
    if (!st) return;
    free(st->stop);
    free(st);
}

const srv_wire api_messages_wire = {
    .stream_type = "text/event-stream",
    .start = msg_start,
    .event = msg_event,
    .end = msg_end,
    .fail = msg_fail,
    .keepalive = msg_keepalive,
    .error = msg_error_json,
    .final_json = msg_final_json,
    .count_json = msg_count_json,
    .free_ctx = msg_free_ctx,
};

static int parse_body(srv *s, conn_ctx *cc, void *arg, srv_job *j, const srv_limits *lim, srv_err *err) {
    (void)s;
    (void)arg;
    return api_messages_parse(cc->body.p ? cc->body.p : "", cc->body.len, j, lim, err);
}

enum MHD_Result api_handle_messages(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    return http_generate(s, c, cc, &api_messages_wire, parse_body, NULL, cc->r == R_COUNT_TOKENS);
}
