/* chat.c — chat prompt rendering (Kimi K3 "XTML" and the Kimi-Linear/K2 template), tool declarations,
 * calls and results included, and the streaming splitter that separates the assistant's reasoning from its
 * answer in generated ids. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

static const char K2_DEFAULT_SYSTEM[] = "You are Kimi, an AI assistant created by Moonshot AI.";

void chat_opts_default(chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->add_generation_prompt = 1;
    o->thinking = 1;
    o->effort = NULL;
}

static int has_all(const tokenizer *t, const char *const *names) {
    for (; *names; names++)
        if (tokenizer_special_id(t, *names) < 0) return 0;
    return 1;
}

int chat_detect_format(const tokenizer *t, chat_format *fmt, df_error *err) {
    static const char *const k3[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", NULL};
    static const char *const k2[] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>",
                                     NULL};
    if (has_all(t, k3)) *fmt = CHAT_K3;
    else if (has_all(t, k2)) *fmt = CHAT_K2;
    else {
        df_error_set(err, DF_EUNSUPPORTED,
                     "tokenizer has neither the K3 chat tokens (<|open|> <|close|> <|sep|> <|end_of_msg|>) nor the "
                     "Kimi-Linear/K2 ones (<|im_system|> <|im_user|> <|im_assistant|> <|im_middle|> <|im_end|>)");
        return DF_EUNSUPPORTED;
    }
    return DF_OK;
}

typedef struct render {
    const tokenizer *t;
    tok_ids *out;
    df_error *err;
    int rc;
} render;

static void r_text(render *r, const char *s) {
    if (r->rc || !s || !*s) return;
    r->rc = tokenizer_encode(r->t, s, strlen(s), 0, r->out, r->err);
}

static void r_special(render *r, const char *name) {
    if (r->rc) return;
    int32_t id = tokenizer_special_id(r->t, name);
    if (id < 0) {
        df_error_set(r->err, DF_EUNSUPPORTED, "chat format needs special token %s, which the tokenizer lacks", name);
        r->rc = DF_EUNSUPPORTED;
        return;
    }
    tok_ids_push(r->out, id);
}

/* ---- K3 XTML ---- */

/* tag + ` key="value"`… with `&` and `"` escaped in values; attrs is a NULL-terminated key/value list. */
static void k3_open(render *r, const char *tag, const char *const *attrs) {
    size_t cap = 64 + strlen(tag), len = 0;
    for (const char *const *a = attrs; a && *a; a += 2) cap += strlen(a[0]) + 6 * strlen(a[1]) + 4;
    char *s = xmalloc(cap);
    len += (size_t)sprintf(s, "%s", tag);
    for (const char *const *a = attrs; a && *a; a += 2) {
        len += (size_t)sprintf(s + len, " %s=\"", a[0]);
        for (const char *v = a[1]; *v; v++)
            len += (size_t)(*v == '&' ? sprintf(s + len, "&amp;") : *v == '"' ? sprintf(s + len, "&quot;")
                                                                             : sprintf(s + len, "%c", *v));
        s[len++] = '"';
        s[len] = 0;
    }
    r_special(r, "<|open|>");
    r_text(r, s);
    r_special(r, "<|sep|>");
    free(s);
}

static void k3_close(render *r, const char *tag) {
    r_special(r, "<|close|>");
    r_text(r, tag);
    r_special(r, "<|sep|>");
}

static void k3_message(render *r, const char *const *attrs, const char *body) {
    k3_open(r, "message", attrs);
    r_text(r, body);
    k3_close(r, "message");
    r_special(r, "<|end_of_msg|>");
}

/* JSON text re-serialised compactly with sorted keys, as the K3 encoder writes tools and schemas. */
static char *k3_sorted_json(render *r, const char *json, const char *what) {
    json_error_t je;
    json_t *v = json_loads(json, JSON_DECODE_ANY, &je);
    char *out = v ? json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    if (!out && !r->rc) {
        df_error_set(r->err, DF_EINVAL, "%s is not valid JSON", what);
        r->rc = DF_EINVAL;
    }
    return out;
}

static void k3_system_note(render *r, const char *type, const char *body) {
    const char *const attrs[] = {"role", "system", "type", type, NULL};
    k3_message(r, attrs, body);
}

static void k3_tool_declare(render *r, const char *tools_json) {
    char *j = k3_sorted_json(r, tools_json, "tools");
    if (!j) return;
    size_t n = strlen(j) + 128;
    char *body = xmalloc(n);
    snprintf(body, n, "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n%s\n```", j);
    k3_system_note(r, "tool-declare", body);
    free(body);
    free(j);
}

/* One call: its arguments as typed <argument> tags when they are a JSON object, else a raw json block. */
static void k3_call(render *r, const chat_tool_call *c, int index) {
    char idx[16];
    snprintf(idx, sizeof idx, "%d", index);
    const char *const attrs[] = {"tool", c->name ? c->name : "", "index", idx, NULL};
    k3_open(r, "call", attrs);
    const char *a = c->arguments ? c->arguments : "";
    while (*a == ' ' || *a == '\n' || *a == '\t' || *a == '\r') a++;
    json_t *args = *a ? json_loads(a, 0, NULL) : json_object();
    if (json_is_object(args)) {
        const char *key;
        json_t *v;
        json_object_foreach(args, key, v) {
            const char *type = json_is_string(v) ? "string" : json_is_boolean(v) ? "boolean" : json_is_null(v) ? "null"
                             : json_is_number(v) ? "number" : json_is_object(v) ? "object" : "array";
            const char *const aa[] = {"key", key, "type", type, NULL};
            k3_open(r, "argument", aa);
            if (json_is_string(v)) {
                r_text(r, json_string_value(v));
            } else {
                char *t = json_dumps(v, JSON_ENCODE_ANY);
                r_text(r, t);
                free(t);
            }
            k3_close(r, "argument");
        }
    } else {
        static const char *const ja[] = {"type", "object", NULL};
        k3_open(r, "json", ja);
        r_text(r, c->arguments);
        k3_close(r, "json");
    }
    json_decref(args);
    k3_close(r, "call");
}

/* 1-based position of the call a tool result answers among the last assistant turn's calls, or -1. */
static int k3_call_position(const chat_message_tools *m, const chat_message_tools *last_asst) {
    for (int k = 0; m->tool_call_id && k < last_asst->n_tool_calls; k++)
        if (last_asst->tool_calls[k].id && !strcmp(m->tool_call_id, last_asst->tool_calls[k].id)) return k + 1;
    return -1;
}

/* The function a tool result answers: its own name, else the matching call of the last assistant turn. */
static const char *k3_tool_name(const chat_message_tools *m, const chat_message_tools *last_asst, int index) {
    if (m->name && *m->name) return m->name;
    if (!last_asst) return NULL;
    for (int k = 0; k < last_asst->n_tool_calls; k++)
        if (m->tool_call_id && last_asst->tool_calls[k].id && !strcmp(m->tool_call_id, last_asst->tool_calls[k].id))
            return last_asst->tool_calls[k].name;
    return index >= 1 && index <= last_asst->n_tool_calls ? last_asst->tool_calls[index - 1].name : NULL;
}

static int k3_render(render *r, const chat_message *msgs, int n, const chat_opts *o) {
    if (o->tools_json) k3_tool_declare(r, o->tools_json);
    if (o->thinking) {
        const char *effort = o->effort ? o->effort : "max";
        if (strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max")) {
            df_error_set(r->err, DF_EINVAL, "reasoning effort '%s': K3 accepts low, high or max", effort);
            return DF_EINVAL;
        }
        char body[400];
        snprintf(body, sizeof body,
                 "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
                 "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                 "Now the system is invoked with `thinking_effort=%s`.",
                 effort);
        static const char *const attrs[] = {"role", "system", "type", "thinking-effort", NULL};
        k3_message(r, attrs, body);
    }
    static const chat_message_tools no_tools;
    const chat_message_tools *last_asst = NULL;
    int tool_index = 0;
    for (int i = 0; i < n && !r->rc; i++) {
        const chat_message *m = &msgs[i];
        const chat_message_tools *mt = o->msg_tools ? &o->msg_tools[i] : &no_tools;
        if (!strcmp(m->role, "system") || !strcmp(m->role, "developer") || !strcmp(m->role, "user")) {
            const char *const attrs[] = {"role", m->role[0] == 'u' ? "user" : "system", NULL};
            k3_message(r, attrs, m->content);
        } else if (!strcmp(m->role, "assistant")) {
            static const char *const attrs[] = {"role", "assistant", NULL};
            k3_open(r, "message", attrs);
            if (o->thinking) {
                k3_open(r, "think", NULL);
                r_text(r, m->reasoning_content);
                k3_close(r, "think");
            }
            k3_open(r, "response", NULL);
            r_text(r, m->content);
            k3_close(r, "response");
            if (mt->n_tool_calls) {
                k3_open(r, "tools", NULL);
                for (int k = 0; k < mt->n_tool_calls; k++) k3_call(r, &mt->tool_calls[k], k + 1);
                k3_close(r, "tools");
            }
            k3_close(r, "message");
            r_special(r, "<|end_of_msg|>");
            last_asst = mt;
            tool_index = 0;
        } else if (!strcmp(m->role, "tool")) {
            /* a run of results that all answer calls of the last assistant turn is re-sorted into call order
             * and named after the calls, as the K3 encoder does; results are numbered as rendered */
            int end = i, all = last_asst != NULL;
            while (end < n && !strcmp(msgs[end].role, "tool")) {
                if (all && k3_call_position(o->msg_tools ? &o->msg_tools[end] : &no_tools, last_asst) < 0) all = 0;
                end++;
            }
            for (int pos = all ? 1 : 0; pos <= (all ? last_asst->n_tool_calls : 0); pos++)
                for (int k = i; k < end && !r->rc; k++) {
                    const chat_message_tools *kt = o->msg_tools ? &o->msg_tools[k] : &no_tools;
                    if (all && k3_call_position(kt, last_asst) != pos) continue;
                    int index = ++tool_index;
                    const char *name = all ? last_asst->tool_calls[pos - 1].name : k3_tool_name(kt, last_asst, index);
                    if (!name) {
                        df_error_set(r->err, DF_EINVAL, "message %d: a tool result needs the function's name (name, "
                                                        "or a tool_call_id of the assistant's calls)", k);
                        return DF_EINVAL;
                    }
                    char idx[16];
                    snprintf(idx, sizeof idx, "%d", index);
                    const char *const attrs[] = {"role", "tool", "tool", name, "index", idx, NULL};
                    k3_message(r, attrs, msgs[k].content);
                }
            i = end - 1;
        } else {
            df_error_set(r->err, DF_EUNSUPPORTED,
                         "message %d: role '%s' is not supported (system, user, assistant, tool)", i, m->role);
            return DF_EUNSUPPORTED;
        }
    }
    if (o->tool_choice && !strcmp(o->tool_choice, "required"))
        k3_system_note(r, "tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in "
                                         "the next message.");
    else if (o->tool_choice && !strcmp(o->tool_choice, "none"))
        k3_system_note(r, "tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools "
                                         "in the next message.");
    static const char RAW_JSON[] = "Your response must be raw JSON data without markdown code blocks (```json) or any "
                                   "additional formatting.";
    if (o->response_format && !strcmp(o->response_format, "json_object")) {
        k3_system_note(r, "response-format", "The system is invoked with `response_format=json_object`.\n" "Your "
                                             "response must be raw JSON data without markdown code blocks (```json) "
                                             "or any additional formatting.");
    } else if (o->response_format && !strcmp(o->response_format, "json_schema")) {
        char *j = k3_sorted_json(r, o->response_schema ? o->response_schema : "null", "response schema");
        if (j) {
            size_t len = strlen(j) + 400;
            char *body = xmalloc(len);
            snprintf(body, len, "The system is invoked with `response_format=json_schema`.\n%s\nThe JSON data must "
                                "match the following schema:\n```json\n%s\n```", RAW_JSON, j);
            k3_system_note(r, "response-format", body);
            free(body);
            free(j);
        }
    }
    if (o->add_generation_prompt) {
        static const char *const attrs[] = {"role", "assistant", NULL};
        k3_open(r, "message", attrs);
        k3_open(r, o->thinking ? "think" : "response", NULL);
    }
    return r->rc;
}

/* ---- Kimi-Linear / K2 ---- */

/* <think> is a special token from K2.5 on and ordinary text before. */
static void k2_marker(render *r, const char *name) {
    if (tokenizer_special_id(r->t, name) >= 0) r_special(r, name);
    else r_text(r, name);
}

static void k2_turn(render *r, const char *role_token, const char *role, const char *body) {
    r_special(r, role_token);
    r_text(r, role);
    r_special(r, "<|im_middle|>");
    r_text(r, body);
}

/* `<|tool_calls_section_begin|>` + each call + `<|tool_calls_section_end|>`; calls without an id get
 * functions.NAME:IDX with IDX counting every call of the conversation, as the K2 templates number them. */
static void k2_tool_calls(render *r, const chat_message_tools *m, int *counter) {
    r_special(r, "<|tool_calls_section_begin|>");
    for (int k = 0; k < m->n_tool_calls; k++) {
        const chat_tool_call *c = &m->tool_calls[k];
        r_special(r, "<|tool_call_begin|>");
        if (c->id && *c->id) {
            r_text(r, c->id);
        } else {
            size_t len = strlen(c->name ? c->name : "") + 40;
            char *id = xmalloc(len);
            snprintf(id, len, "functions.%s:%d", c->name ? c->name : "", *counter);
            r_text(r, id);
            free(id);
        }
        (*counter)++;
        r_special(r, "<|tool_call_argument_begin|>");
        r_text(r, c->arguments && *c->arguments ? c->arguments : "{}");
        r_special(r, "<|tool_call_end|>");
    }
    r_special(r, "<|tool_calls_section_end|>");
}

static int k2_render(render *r, const chat_message *msgs, int n, const chat_opts *o) {
    int last_user = -1, calls = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "user")) last_user = i;
    if (o->tools_json) {
        k2_turn(r, "<|im_system|>", "tool_declare", o->tools_json);
        r_special(r, "<|im_end|>");
    }
    if (n == 0 || strcmp(msgs[0].role, "system")) {
        k2_turn(r, "<|im_system|>", "system", K2_DEFAULT_SYSTEM);
        r_special(r, "<|im_end|>");
    }
    for (int i = 0; i < n && !r->rc; i++) {
        const chat_message *m = &msgs[i];
        const chat_message_tools *mt = o->msg_tools ? &o->msg_tools[i] : NULL;
        if (!strcmp(m->role, "system") || !strcmp(m->role, "user")) {
            k2_turn(r, m->role[0] == 's' ? "<|im_system|>" : "<|im_user|>", m->role, m->content);
        } else if (!strcmp(m->role, "assistant")) {
            k2_turn(r, "<|im_assistant|>", "assistant", NULL);
            if (o->thinking) {   /* reasoning is kept only for the turn after the last user message */
                k2_marker(r, "<think>");
                if (i > last_user) r_text(r, m->reasoning_content);
                k2_marker(r, "</think>");
            }
            r_text(r, m->content);
            if (mt && mt->n_tool_calls) k2_tool_calls(r, mt, &calls);
        } else if (!strcmp(m->role, "tool")) {
            k2_turn(r, "<|im_system|>", "tool", "## Return of ");
            r_text(r, mt ? mt->tool_call_id : NULL);
            r_text(r, "\n");
            r_text(r, m->content);
        } else {
            df_error_set(r->err, DF_EUNSUPPORTED,
                         "message %d: role '%s' is not supported (system, user, assistant, tool)", i, m->role);
            return DF_EUNSUPPORTED;
        }
        r_special(r, "<|im_end|>");
    }
    if (o->add_generation_prompt) {
        k2_turn(r, "<|im_assistant|>", "assistant", NULL);
        if (o->thinking && tokenizer_special_id(r->t, "<think>") >= 0) r_special(r, "<think>");
    }
    return r->rc;
}

int chat_render(const tokenizer *t, chat_format fmt, const chat_message *msgs, int n, const chat_opts *o,
                tok_ids *out, df_error *err) {
    for (int i = 0; i < n; i++)
        if (!msgs[i].role) {
            df_error_set(err, DF_EINVAL, "message %d has no role", i);
            return DF_EINVAL;
        }
    render r = {t, out, err, DF_OK};
    return fmt == CHAT_K3 ? k3_render(&r, msgs, n, o) : k2_render(&r, msgs, n, o);
}

/* ---- splitting generated output ---- */

enum { PH_REASONING, PH_CONTENT, PH_BETWEEN, PH_DONE };
enum { TAG_NONE, TAG_OPEN, TAG_CLOSE };

struct chat_splitter {
    const tokenizer *t;
    chat_format fmt;
    int phase;
    int tag;                  /* K3: inside <|open|>…<|sep|> or <|close|>…<|sep|> */
    char tagbuf[64];
    size_t taglen;
    int32_t id_open, id_close, id_sep, id_end, id_eos, id_think, id_unthink;
    int content_started;      /* K2: an opening <think> is only recognised before any answer text */
    char hold[16];            /* K2 textual markers: bytes that may be the start of one */
    size_t nhold;
    utf8_stream u8[2];        /* reasoning, content */
};

chat_splitter *chat_splitter_new(const tokenizer *t, chat_format fmt, int in_reasoning) {
    chat_splitter *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->fmt = fmt;
    s->phase = in_reasoning ? PH_REASONING : PH_CONTENT;
    s->id_open = tokenizer_special_id(t, "<|open|>");
    s->id_close = tokenizer_special_id(t, "<|close|>");
    s->id_sep = tokenizer_special_id(t, "<|sep|>");
    s->id_end = tokenizer_special_id(t, fmt == CHAT_K3 ? "<|end_of_msg|>" : "<|im_end|>");
    s->id_eos = tokenizer_special_id(t, "[EOS]");
    s->id_think = tokenizer_special_id(t, "<think>");
    s->id_unthink = tokenizer_special_id(t, "</think>");
    utf8_stream_init(&s->u8[0]);
    utf8_stream_init(&s->u8[1]);
    return s;
}

void chat_splitter_free(chat_splitter *s) { free(s); }

void chat_text_free(chat_text *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

static void sp_emit(chat_splitter *s, const void *p, size_t n, chat_text *rs, chat_text *ct) {
    if (s->phase == PH_REASONING) utf8_stream_feed(&s->u8[0], p, n, &rs->p, &rs->len, &rs->cap);
    else if (s->phase == PH_CONTENT) {
        utf8_stream_feed(&s->u8[1], p, n, &ct->p, &ct->len, &ct->cap);
        if (n) s->content_started = 1;
    }
}

static void sp_set_phase(chat_splitter *s, int phase, chat_text *rs, chat_text *ct) {
    if (phase == s->phase) return;
    if (s->phase == PH_REASONING) utf8_stream_flush(&s->u8[0], &rs->p, &rs->len, &rs->cap);
    if (s->phase == PH_CONTENT) utf8_stream_flush(&s->u8[1], &ct->p, &ct->len, &ct->cap);
    s->phase = phase;
}

static void k3_tag_done(chat_splitter *s, chat_text *rs, chat_text *ct) {
    size_t n = 0;
    while (n < s->taglen && s->tagbuf[n] != ' ') n++;
    int think = n == 5 && !memcmp(s->tagbuf, "think", 5), resp = n == 8 && !memcmp(s->tagbuf, "response", 8);
    if (s->tag == TAG_OPEN && think) sp_set_phase(s, PH_REASONING, rs, ct);
    else if (s->tag == TAG_OPEN && resp) sp_set_phase(s, PH_CONTENT, rs, ct);
    else if (s->tag == TAG_CLOSE && (think || resp)) sp_set_phase(s, PH_BETWEEN, rs, ct);
    s->tag = TAG_NONE;
    s->taglen = 0;
}

/* K2 without special <think> tokens: look for the marker in the text, holding back a possible start of it. */
static void k2_text(chat_splitter *s, const uint8_t *p, size_t n, chat_text *rs, chat_text *ct) {
    for (size_t i = 0; i < n; i++) {
        const char *marker = s->phase == PH_REASONING ? "</think>" : !s->content_started ? "<think>" : NULL;
        if (!marker) {
            sp_emit(s, s->hold, s->nhold, rs, ct);
            s->nhold = 0;
            sp_emit(s, p + i, n - i, rs, ct);
            return;
        }
        size_t ml = strlen(marker);
        s->hold[s->nhold++] = (char)p[i];
        if (s->nhold == ml && !memcmp(s->hold, marker, ml)) {
            s->nhold = 0;
            sp_set_phase(s, s->phase == PH_REASONING ? PH_CONTENT : PH_REASONING, rs, ct);
            if (s->phase == PH_CONTENT) s->content_started = 1;   /* only one think block */
            continue;
        }
        size_t k = 0;   /* drop bytes from the front until what is held could still begin the marker */
        while (k < s->nhold && memcmp(s->hold + k, marker, s->nhold - k)) k++;
        if (k) {   /* in the answer this also ends the search for an opening <think> */
            sp_emit(s, s->hold, k, rs, ct);
            memmove(s->hold, s->hold + k, s->nhold - k);
            s->nhold -= k;
        }
    }
}

int chat_splitter_feed(chat_splitter *s, int32_t id, chat_text *rs, chat_text *ct) {
    if (s->phase == PH_DONE) return 1;
    if (id == s->id_end || (id >= 0 && id == s->id_eos)) {
        chat_splitter_finish(s, rs, ct);
        s->phase = PH_DONE;
        return 1;
    }
    size_t n;
    const uint8_t *b = tokenizer_token_bytes(s->t, id, &n);
    if (!b) return 0;
    if (s->fmt == CHAT_K3) {
        if (id == s->id_open || id == s->id_close) {
            s->tag = id == s->id_open ? TAG_OPEN : TAG_CLOSE;
            s->taglen = 0;
        } else if (id == s->id_sep) {
            if (s->tag != TAG_NONE) k3_tag_done(s, rs, ct);
        } else if (s->tag != TAG_NONE) {
            size_t k = DF_MIN(n, sizeof s->tagbuf - s->taglen);
            memcpy(s->tagbuf + s->taglen, b, k);
            s->taglen += k;
        } else if (!tokenizer_is_special(s->t, id)) {
            sp_emit(s, b, n, rs, ct);
        }
        return 0;
    }
    if (id == s->id_think && !s->content_started) sp_set_phase(s, PH_REASONING, rs, ct);
    else if (id == s->id_unthink && s->phase == PH_REASONING) {
        sp_set_phase(s, PH_CONTENT, rs, ct);
        s->content_started = 1;
    } else if (!tokenizer_is_special(s->t, id)) {
        if (s->id_think < 0) k2_text(s, b, n, rs, ct);
        else sp_emit(s, b, n, rs, ct);
    }
    return 0;
}

void chat_splitter_finish(chat_splitter *s, chat_text *rs, chat_text *ct) {
    if (s->phase == PH_DONE) return;
    if (s->nhold) {
        sp_emit(s, s->hold, s->nhold, rs, ct);
        s->nhold = 0;
    }
    utf8_stream_flush(&s->u8[0], &rs->p, &rs->len, &rs->cap);
    utf8_stream_flush(&s->u8[1], &ct->p, &ct->len, &ct->cap);
}
