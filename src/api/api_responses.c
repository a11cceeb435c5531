/* api_responses.c — the OpenAI Responses API, stateless (as Codex uses it with store=false): POST
 * /v1/responses answers a response object, or streams response.created, response.in_progress (also the
 * keepalive while the prompt waits or is prefilled), output items with their deltas, and always a final
 * response.completed or response.failed. Input items become a chat request: messages, function and custom
 * tool calls with their outputs, reasoning items as the assistant's reasoning. A custom tool (Codex's
 * freeform apply_patch) is declared to the model as a function with one string argument "input" and
 * answered as a custom_tool_call carrying that raw text; its grammar is shown to the model, not enforced.
 * Tools of other types (web_search, …) are ignored. previous_response_id is refused: nothing is stored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "api/api.h"

enum { IT_REASONING = 1, IT_MESSAGE, IT_FUNCTION, IT_CUSTOM };

typedef struct resp_item {
    int kind;
    int call;            /* tool calls: the parser's index */
    size_t from, to;     /* reasoning / message: the item's bytes of the answer's reasoning / content */
    size_t args_sent;    /* function: bytes of arguments streamed */
    int done;
    char id[80];
} resp_item;

typedef struct resp_state {
    char id[64];
    int seq;             /* the next event's sequence_number */
    resp_item *items;
    int n_items, cap_items;
    int n_calls;         /* tool calls given an item */
    int reasoning_tokens;
    char **custom;       /* the custom tools' names */
    int n_custom;
    char *pending_reasoning;   /* request: a reasoning item waiting for its assistant message */
} resp_state;

/* ---- request ---- */

static int is_custom(const resp_state *st, const char *name) {
    for (int i = 0; i < st->n_custom; i++)
        if (!strcmp(st->custom[i], name)) return 1;
    return 0;
}

/* Text of a content value: a string, or parts of type input_text / output_text / text / refusal. */
static int content_text(api_build *b, json_t *v, const char *param, char **out) {
    *out = xstrdup("");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        api_append_text(out, json_string_value(v), json_string_length(v), NULL);
        return 0;
    }
    if (!json_is_array(v)) return api_refuse(b, param, "'content' must be a string or an array of content parts.");
    size_t i;
    json_t *part;
    json_array_foreach(v, i, part) {
        json_t *type = json_object_get(part, "type");
        const char *t = json_string_value(type);
        json_t *text = json_object_get(part, "text");
        if (!t) return api_refuse(b, param, "Each content part needs a 'type'.");
        if (!strcmp(t, "refusal")) text = json_object_get(part, "refusal");
        if (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text") || !strcmp(t, "refusal")) {
            if (!json_is_string(text)) return api_refuse(b, param, "A '%s' part needs a string 'text'.", t);
            api_append_text(out, json_string_value(text), json_string_length(text), "\n");
        } else {
            srv_err_set(b->err, 400, "invalid_request_error", "unsupported_content", param,
                        "Content parts of type '%.40s' are not supported: this model reads text only.", t);
            return -1;
        }
    }
    return 0;
}

static const char *call_name(const srv_request *r, const char *id) {
    for (int i = r->n_msgs - 1; i >= 0; i--)
        for (int k = 0; k < r->msgs[i].n_tool_calls; k++)
            if (r->msgs[i].tool_calls[k].id && !strcmp(r->msgs[i].tool_calls[k].id, id)) return r->msgs[i].tool_calls[k].name;
    return NULL;
}

static srv_message *assistant_turn(api_build *b, resp_state *st, int reuse) {
    srv_message *m = reuse ? api_last_message(b, "assistant") : NULL;
    if (!m) m = api_add_message(b, "assistant");
    if (st->pending_reasoning) {
        api_append_text(&m->reasoning, st->pending_reasoning, strlen(st->pending_reasoning), "\n");
        free(st->pending_reasoning);
        st->pending_reasoning = NULL;
    }
    return m;
}

static int parse_item(api_build *b, resp_state *st, json_t *it, size_t i) {
    char param[64];
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!json_is_object(it)) return api_refuse(b, param, "An input item must be an object.");
    json_t *type = json_object_get(it, "type"), *role = json_object_get(it, "role");
    const char *t = json_is_string(type) ? json_string_value(type) : role ? "message" : NULL;
    if (!t) return api_refuse(b, param, "An input item needs a 'type' (or a 'role' for a message).");
    json_t *call_id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    if (!strcmp(t, "message")) {
        const char *rs = json_string_value(role);
        if (!rs || (strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "system") && strcmp(rs, "developer")))
            return api_refuse(b, param, "A message's role must be user, assistant, system or developer.");
        char *text;
        if (content_text(b, json_object_get(it, "content"), param, &text)) {
            free(text);
            return -1;
        }
        srv_message *m = !strcmp(rs, "assistant") ? assistant_turn(b, st, 0)
                                                  : api_add_message(b, !strcmp(rs, "user") ? "user" : "system");
        free(m->content);
        m->content = text;
    } else if (!strcmp(t, "function_call") || !strcmp(t, "custom_tool_call")) {
        int custom = t[0] == 'c';
        json_t *args = json_object_get(it, custom ? "input" : "arguments");
        if (!json_is_string(call_id) || !json_is_string(name) || !json_is_string(args))
            return api_refuse(b, param, "A %s item needs string 'call_id', 'name' and '%s'.", t, custom ? "input" : "arguments");
        srv_message *m = assistant_turn(b, st, 1);
        char *a = NULL;
        if (custom) {
            json_t *o = json_pack("{s:O}", "input", args);
            a = json_dumps(o, JSON_COMPACT);
            json_decref(o);
        }
        api_add_tool_call(m, json_string_value(call_id), json_string_value(name), a ? a : json_string_value(args));
        free(a);
    } else if (!strcmp(t, "function_call_output") || !strcmp(t, "custom_tool_call_output")) {
        if (!json_is_string(call_id)) return api_refuse(b, param, "A %s item needs a string 'call_id'.", t);
        char *text;
        if (content_text(b, json_object_get(it, "output"), param, &text)) {
            free(text);
            return -1;
        }
        srv_message *m = api_add_message(b, "tool");
        free(m->content);
        m->content = text;
        m->tool_call_id = xstrdup(json_string_value(call_id));
        const char *fn = call_name(b->r, m->tool_call_id);
        if (fn) m->name = xstrdup(fn);
    } else if (!strcmp(t, "reasoning")) {
        json_t *parts[2] = {json_object_get(it, "content"), json_object_get(it, "summary")};
        for (int p = 0; p < 2; p++) {   /* the reasoning text itself, else its summary */
            size_t k;
            json_t *part;
            int any = 0;
            json_array_foreach(parts[p], k, part) {
                json_t *text = json_object_get(part, "text");
                if (!json_is_string(text)) continue;
                api_append_text(&st->pending_reasoning, json_string_value(text), json_string_length(text), "\n");
                any = 1;
            }
            if (any) break;
        }
    } else {
        char f[64];
        snprintf(f, sizeof f, "input.%.40s", t);
        api_note_ignored(&b->ignored, f);   /* items of hosted tools (web_search_call, …) and references */
    }
    return 0;
}

static int parse_input(api_build *b, resp_state *st, json_t *v) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        srv_message *m = api_add_message(b, "user");
        free(m->content);
        m->content = xstrdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) return api_refuse(b, "input", "'input' must be a string or an array of items.");
    size_t i;
    json_t *it;
    json_array_foreach(v, i, it) if (parse_item(b, st, it, i)) return -1;
    return 0;
}

static int parse_tools_field(api_build *b, resp_state *st, json_t *v) {
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return api_refuse(b, "tools", "'tools' must be an array.");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *desc = json_string_value(json_object_get(t, "description"));
        if (!json_is_object(t) || !type) return api_refuse(b, param, "A tool must be an object with a 'type'.");
        if (!strcmp(type, "function")) {
            if (api_add_tool(b, param, name, desc, json_object_get(t, "parameters"))) return -1;
        } else if (!strcmp(type, "custom")) {
            json_t *fmt = json_object_get(t, "format");
            const char *def = json_string_value(json_object_get(fmt, "definition"));
            const char *syntax = json_string_value(json_object_get(fmt, "syntax"));
            char *d = desc ? xstrdup(desc) : NULL;
            if (def) {
                char head[96];
                snprintf(head, sizeof head, "The input follows this %.40s grammar:\n", syntax ? syntax : "");
                api_append_text(&d, head, strlen(head), "\n\n");
                api_append_text(&d, def, strlen(def), NULL);
            }
            json_t *schema = json_pack("{s:s,s:{s:{s:s}},s:[s],s:b}", "type", "object", "properties", "input", "type",
                                       "string", "required", "input", "additionalProperties", 0);
            int rc = api_add_tool(b, param, name, d, schema);
            json_decref(schema);
            free(d);
            if (rc) return -1;
            st->custom = xrealloc(st->custom, (size_t)(st->n_custom + 1) * sizeof *st->custom);
            st->custom[st->n_custom++] = xstrdup(name);
        } else {
            char f[80];
            snprintf(f, sizeof f, "tools.%.60s", type);
            api_note_ignored(&b->ignored, f);   /* hosted tools: web_search, image_generation, namespace, … */
        }
    }
    return 0;
}

static int parse_tool_choice_field(api_build *b, json_t *v) {
    srv_request *r = b->r;
    if (json_is_null(v)) return 0;
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (!strcmp(c, "auto")) r->tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(c, "none")) r->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(c, "required")) r->tool_choice = SRV_TOOLS_REQUIRED;
        else return api_refuse(b, "tool_choice", "Unsupported tool_choice '%.40s' (auto, none, required, or a tool).", c);
        return 0;
    }
    const char *type = json_string_value(json_object_get(v, "type"));
    const char *name = json_string_value(json_object_get(v, "name"));
    if (!json_is_object(v) || !type) return api_refuse(b, "tool_choice", "'tool_choice' must be a string or an object with a 'type'.");
    if (!strcmp(type, "function") || !strcmp(type, "custom")) {
        if (!name) return api_refuse(b, "tool_choice.name", "tool_choice of type '%s' needs a 'name'.", type);
        r->tool_choice = SRV_TOOLS_NAMED;
        free(r->tool_choice_name);
        r->tool_choice_name = xstrdup(name);
    } else {
        r->tool_choice = SRV_TOOLS_AUTO;   /* allowed_tools, hosted tools */
        api_note_ignored(&b->ignored, "tool_choice");
    }
    return 0;
}

static int parse_text_field(api_build *b, json_t *v) {
    json_t *fmt = json_object_get(v, "format");
    const char *type = json_string_value(json_object_get(fmt, "type"));
    if (!type || !strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        b->r->response_format = SRV_FORMAT_JSON_OBJECT;
        return 0;
    }
    if (!strcmp(type, "json_schema")) return api_set_schema(b, "text.format.schema", json_object_get(fmt, "schema"));
    return api_refuse(b, "text.format.type", "Unsupported text.format type '%.40s' (text, json_object, json_schema).", type);
}

static int parse_reasoning_field(api_build *b, json_t *v) {
    const char *e = json_string_value(json_object_get(v, "effort"));
    if (!e) return 0;
    /* the chat template's efforts are low, high and max */
    const char *k = !strcmp(e, "none") ? "none"
                    : !strcmp(e, "minimal") || !strcmp(e, "low") ? "low"
                    : !strcmp(e, "medium") ? "high"
                    : !strcmp(e, "high") || !strcmp(e, "xhigh") ? "max"
                                                                  : NULL;
    if (!k) return api_refuse(b, "reasoning.effort", "Unsupported reasoning effort '%.40s'.", e);
    free(b->r->reasoning_effort);
    b->r->reasoning_effort = xstrdup(k);
    return 0;
}

int api_responses_parse(const char *body, size_t len, srv_job *j, const srv_limits *lim, srv_err *err) {
    resp_state *st = xcalloc(1, sizeof *st);
    j->wire = &api_responses_wire;
    j->wire_ctx = st;
    snprintf(st->id, sizeof st->id, "resp_%s", j->id);
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
    srv_request *r = &j->req;
    json_t *instr = json_object_get(root, "instructions");
    int rc = 0;
    if (json_is_string(instr) && json_string_length(instr)) {
        srv_message *m = api_add_message(&b, "system");
        free(m->content);
        m->content = xstrdup(json_string_value(instr));
    } else if (instr && !json_is_null(instr) && !json_is_string(instr)) {
        rc = api_refuse(&b, "instructions", "'instructions' must be a string.");
    }
    if (!rc) rc = parse_tools_field(&b, st, json_object_get(root, "tools"));   /* input needs the custom names */
    if (!rc) rc = parse_input(&b, st, json_object_get(root, "input"));
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        long long x;
        if (rc) break;
        if (!strcmp(key, "instructions") || !strcmp(key, "input") || !strcmp(key, "tools")) continue;
        if (!strcmp(key, "model")) rc = api_get_model(&b, v);
        else if (!strcmp(key, "max_output_tokens")) {
            if (!json_is_null(v) && !(rc = api_get_int(&b, v, key, 1, INT32_MAX, &x))) r->max_tokens = (int)x;
        } else if (!strcmp(key, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) rc = api_refuse(&b, key, "'stream' must be a boolean.");
            r->stream = json_is_true(v);
        } else if (!strcmp(key, "temperature")) rc = api_get_number(&b, v, key, 0, 2, &r->sp.temperature);
        else if (!strcmp(key, "top_p")) rc = api_get_number(&b, v, key, 0, 1, &r->sp.top_p);
        else if (!strcmp(key, "top_k")) {
            if (!json_is_null(v) && !(rc = api_get_int(&b, v, key, 0, INT32_MAX, &x))) r->sp.top_k = (int)x;
        } else if (!strcmp(key, "tool_choice")) rc = parse_tool_choice_field(&b, v);
        else if (!strcmp(key, "parallel_tool_calls")) {
            if (json_is_false(v)) r->parallel_tool_calls = -1;
        } else if (!strcmp(key, "text")) rc = parse_text_field(&b, v);
        else if (!strcmp(key, "reasoning")) rc = parse_reasoning_field(&b, v);
        else if (!strcmp(key, "previous_response_id") || !strcmp(key, "conversation")) {
            if (!json_is_null(v)) {
                srv_err_set(err, 400, "invalid_request_error", "unsupported_parameter", key,
                            "'%s' is not supported: this server stores no responses. Send the whole conversation in "
                            "'input' (with store=false).", key);
                rc = -1;
            }
        } else if (!json_is_null(v)) api_note_ignored(&b.ignored, key);   /* store, include, metadata, prompt_cache_key, … */
    }
    if (!rc) rc = api_build_finish(&b);
    api_build_free(&b);
    json_decref(root);
    return rc;
}

/* ---- answer ---- */

static void emit(resp_state *st, text_buf *out, const char *type, json_t *o) {
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(st->seq++));
    api_sse(out, type, o);
}

static json_t *usage_object(const srv_job *j, const resp_state *st) {
    int gen = j->choices[0].n_gen;
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", (int)j->prompt.n, "input_tokens_details",
                     "cached_tokens", j->n_reused, "output_tokens", gen, "output_tokens_details", "reasoning_tokens",
                     st->reasoning_tokens, "total_tokens", (int)j->prompt.n + gen);
}

static const chat_call *item_call(const srv_job *j, const resp_item *it) {
    return tools_call(j, it->call);
}

/* A custom tool's raw input: the "input" string of its arguments (the text itself if they are not JSON). */
static json_t *custom_input(const chat_call *c) {
    json_t *a = json_loadb(c->args, c->args_len, 0, NULL), *in = json_object_get(a, "input");
    json_t *r = json_is_string(in) ? json_incref(in) : api_string(c->args, c->args_len);
    json_decref(a);
    return r;
}

static json_t *item_json(const srv_job *j, const resp_item *it, int final) {
    const srv_choice *ch = &j->choices[0];
    const char *status = final ? "completed" : "in_progress";
    if (it->kind == IT_REASONING) {
        json_t *content = json_array();
        if (final) json_array_append_new(content, json_pack("{s:s,s:o}", "type", "reasoning_text", "text",
                                                            api_string(ch->reasoning.p + it->from, it->to - it->from)));
        return json_pack("{s:s,s:s,s:[],s:o}", "id", it->id, "type", "reasoning", "summary", "content", content);
    }
    if (it->kind == IT_MESSAGE) {
        json_t *content = json_array();
        if (final)
            json_array_append_new(content, json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text",
                                                     api_string(ch->content.p + it->from, it->to - it->from),
                                                     "annotations", "logprobs"));
        return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", it->id, "type", "message", "status", status, "role",
                         "assistant", "content", content);
    }
    const chat_call *c = item_call(j, it);
    json_t *name = api_string(c->name, strlen(c->name));
    if (it->kind == IT_CUSTOM)
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o}", "id", it->id, "type", "custom_tool_call", "status", status,
                         "call_id", c->id, "name", name, "input", final ? custom_input(c) : json_string(""));
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o}", "id", it->id, "type", "function_call", "status", status, "call_id",
                     c->id, "name", name, "arguments", final ? api_string(c->args, c->args_len) : json_string(""));
}

static json_t *response_object(const srv *s, const srv_job *j, const char *status, const srv_err *e) {
    const resp_state *st = j->wire_ctx;
    json_t *output = json_array();
    int final = !strcmp(status, "completed") || !strcmp(status, "incomplete");
    for (int i = 0; final && i < st->n_items; i++) json_array_append_new(output, item_json(j, &st->items[i], 1));
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", st->id, "object", "response", "created_at",
                          (json_int_t)j->created, "status", status, "model", j->model_name ? j->model_name : srv_model_id(s),
                          "output", output);
    json_object_set_new(o, "error", e ? json_pack("{s:s,s:s}", "code", e->code[0] ? e->code : e->type, "message", e->msg)
                                      : json_null());
    json_object_set_new(o, "incomplete_details", !strcmp(status, "incomplete")
                                                     ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                     : json_null());
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "parallel_tool_calls", json_boolean(j->req.parallel_tool_calls >= 0));
    json_object_set_new(o, "max_output_tokens", j->req.max_tokens ? json_integer(j->req.max_tokens) : json_null());
    json_object_set_new(o, "temperature", json_real(j->req.sp.temperature));
    json_object_set_new(o, "top_p", json_real(j->req.sp.top_p));
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "tool_choice", json_string("auto"));
    json_object_set_new(o, "metadata", json_object());
    json_object_set_new(o, "usage", final ? usage_object(j, st) : json_null());
    return o;
}

static const char *final_status(const srv_job *j) {
    return j->choices[0].finish == GEN_FINISH_LENGTH ? "incomplete" : "completed";
}

static resp_item *open_item(resp_state *st) {
    return st->n_items && !st->items[st->n_items - 1].done ? &st->items[st->n_items - 1] : NULL;
}

static void part_event(resp_state *st, const resp_item *it, text_buf *out, const char *type, json_t *part) {
    emit(st, out, type, json_pack("{s:s,s:i,s:i,s:o}", "item_id", it->id, "output_index", (int)(it - st->items),
                                  "content_index", 0, "part", part));
}

/* Ends the open item: its closing deltas and done events. */
static void item_close(srv_job *j, text_buf *out) {
    resp_state *st = j->wire_ctx;
    resp_item *it = open_item(st);
    if (!it) return;
    const srv_choice *ch = &j->choices[0];
    int idx = (int)(it - st->items);
    if (it->kind == IT_REASONING) {
        it->to = ch->reasoning.len;
        json_t *text = api_string(ch->reasoning.p + it->from, it->to - it->from);
        emit(st, out, "response.reasoning_text.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", it->id, "output_index",
                                                                 idx, "content_index", 0, "text", text));
        part_event(st, it, out, "response.content_part.done", json_pack("{s:s,s:o}", "type", "reasoning_text", "text", text));
    } else if (it->kind == IT_MESSAGE) {
        it->to = ch->content.len;
        json_t *text = api_string(ch->content.p + it->from, it->to - it->from);
        emit(st, out, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:O,s:[]}", "item_id", it->id, "output_index",
                                                              idx, "content_index", 0, "text", text, "logprobs"));
        part_event(st, it, out, "response.content_part.done",
                   json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text", text, "annotations"));
    } else {
        const chat_call *c = item_call(j, it);
        if (it->kind == IT_FUNCTION) {
            if (c->args_len > it->args_sent)
                emit(st, out, "response.function_call_arguments.delta",
                     json_pack("{s:s,s:i,s:o}", "item_id", it->id, "output_index", idx, "delta",
                               api_string(c->args + it->args_sent, c->args_len - it->args_sent)));
            it->args_sent = c->args_len;
            emit(st, out, "response.function_call_arguments.done",
                 json_pack("{s:s,s:i,s:o,s:o}", "item_id", it->id, "output_index", idx, "name",
                           api_string(c->name, strlen(c->name)), "arguments", api_string(c->args, c->args_len)));
        } else {   /* its raw input is known once the arguments are whole */
            json_t *in = custom_input(c);
            emit(st, out, "response.custom_tool_call_input.delta",
                 json_pack("{s:s,s:i,s:O}", "item_id", it->id, "output_index", idx, "delta", in));
            emit(st, out, "response.custom_tool_call_input.done",
                 json_pack("{s:s,s:i,s:o}", "item_id", it->id, "output_index", idx, "input", in));
        }
    }
    it->done = 1;
    emit(st, out, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx, "item", item_json(j, it, 1)));
}

static resp_item *item_open(srv_job *j, int kind, int call, size_t from, text_buf *out) {
    resp_state *st = j->wire_ctx;
    item_close(j, out);
    if (st->n_items == st->cap_items) {
        st->cap_items = st->cap_items ? 2 * st->cap_items : 4;
        st->items = xrealloc(st->items, (size_t)st->cap_items * sizeof *st->items);
    }
    resp_item *it = &st->items[st->n_items++];
    *it = (resp_item){.kind = kind, .call = call, .from = from};
    static const char *const prefix[] = {"", "rs", "msg", "fc", "ctc"};
    snprintf(it->id, sizeof it->id, "%s_%s_%d", prefix[kind], j->id, st->n_items - 1);
    int idx = st->n_items - 1;
    emit(st, out, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx, "item", item_json(j, it, 0)));
    if (kind == IT_REASONING)
        part_event(st, it, out, "response.content_part.added", json_pack("{s:s,s:s}", "type", "reasoning_text", "text", ""));
    else if (kind == IT_MESSAGE)
        part_event(st, it, out, "response.content_part.added",
                   json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", "", "annotations"));
    return it;
}

static void resp_start(const srv *s, srv_job *j, text_buf *out) {
    resp_state *st = j->wire_ctx;
    emit(st, out, "response.created", json_pack("{s:o}", "response", response_object(s, j, "in_progress", NULL)));
    emit(st, out, "response.in_progress", json_pack("{s:o}", "response", response_object(s, j, "in_progress", NULL)));
}

static void resp_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out) {
    (void)s;
    resp_state *st = j->wire_ctx;
    const srv_choice *ch = &j->choices[0];
    resp_item *it = open_item(st);
    if (ev->reasoning_len) {
        st->reasoning_tokens++;
        if (!it || it->kind != IT_REASONING) it = item_open(j, IT_REASONING, 0, ch->reasoning.len - ev->reasoning_len, out);
        emit(st, out, "response.reasoning_text.delta",
             json_pack("{s:s,s:i,s:i,s:o}", "item_id", it->id, "output_index", (int)(it - st->items), "content_index", 0,
                       "delta", api_string(ev->reasoning, ev->reasoning_len)));
    }
    if (ev->content_len) {
        if (!it || it->kind != IT_MESSAGE) it = item_open(j, IT_MESSAGE, 0, ch->content.len - ev->content_len, out);
        emit(st, out, "response.output_text.delta",
             json_pack("{s:s,s:i,s:i,s:o,s:[]}", "item_id", it->id, "output_index", (int)(it - st->items),
                       "content_index", 0, "delta", api_string(ev->content, ev->content_len), "logprobs"));
    }
    int n = tools_n_calls(j);
    for (int i = st->n_calls; i < n; i++) {
        const chat_call *c = tools_call(j, i);
        if (!c->id) break;
        item_open(j, is_custom(st, c->name) ? IT_CUSTOM : IT_FUNCTION, i, 0, out);
        st->n_calls++;
    }
    it = open_item(st);
    if (it && it->kind == IT_FUNCTION) {
        const chat_call *c = item_call(j, it);
        size_t take = api_utf8_prefix(c->args + it->args_sent, c->args_len - it->args_sent);
        if (take)
            emit(st, out, "response.function_call_arguments.delta",
                 json_pack("{s:s,s:i,s:o}", "item_id", it->id, "output_index", (int)(it - st->items), "delta",
                           api_string(c->args + it->args_sent, take)));
        it->args_sent += take;
    }
    if (ev->final) item_close(j, out);
}

static void resp_end(const srv *s, srv_job *j, text_buf *out) {
    resp_state *st = j->wire_ctx;
    item_close(j, out);
    emit(st, out, "response.completed", json_pack("{s:o}", "response", response_object(s, j, final_status(j), NULL)));
}

static void resp_fail(const srv *s, srv_job *j, const srv_err *e, text_buf *out) {
    resp_state *st = j->wire_ctx;
    emit(st, out, "response.failed", json_pack("{s:o}", "response", response_object(s, j, "failed", e)));
}

/* Before the first output item a lifecycle event; after it nothing, so the stream's progress comment goes
 * (a lifecycle event carries the whole response, which clients take as their new snapshot). */
static void resp_keepalive(const srv *s, srv_job *j, text_buf *out) {
    resp_state *st = j->wire_ctx;
    if (!st->n_items) emit(st, out, "response.in_progress", json_pack("{s:o}", "response", response_object(s, j, "in_progress", NULL)));
}

static char *resp_final_json(const srv *s, srv_job *j) {
    json_t *o = response_object(s, j, final_status(j), NULL);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return t;
}

static char *resp_count_json(const srv *s, srv_job *j) {
    (void)s;
    json_t *o = json_pack("{s:s,s:i}", "object", "response.input_tokens", "input_tokens", (int)j->prompt.n);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return t;
}

static void resp_error_json(const srv_err *e, text_buf *out) { srv_err_json(e, out); }

static void resp_free_ctx(void *ctx) {
    resp_state *st = ctx;
    if (!st) return;
    for (int i = 0; i < st->n_custom; i++) free(st->custom[i]);
    free(st->custom);
    free(st->items);
    free(st->pending_reasoning);
    free(st);
}

const srv_wire api_responses_wire = {
    .stream_type = "text/event-stream",
    .start = resp_start,
    .event = resp_event,
    .end = resp_end,
    .fail = resp_fail,
    .keepalive = resp_keepalive,
    .error = resp_error_json,
    .final_json = resp_final_json,
    .count_json = resp_count_json,
    .free_ctx = resp_free_ctx,
};

static int parse_body(srv *s, conn_ctx *cc, void *arg, srv_job *j, const srv_limits *lim, srv_err *err) {
    (void)s;
    (void)arg;
    return api_responses_parse(cc->body.p ? cc->body.p : "", cc->body.len, j, lim, err);
}

enum MHD_Result api_handle_responses(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    return http_generate(s, c, cc, &api_responses_wire, parse_body, NULL, 0);
}
