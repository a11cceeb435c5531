/* toolcall.c — reading tool calls back out of generated ids (toolcall.h), one id at a time so that a
 * streaming client can be sent each call's name as soon as it is known and its arguments as they grow. */
#include "tokenizer/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "tokenizer/tok_internal.h"

enum { K2_OUT, K2_SECTION, K2_HEADER, K2_ARGS };
enum { TAG_NO, TAG_OPEN, TAG_CLOSE };

struct chat_tool_parser {
    const tokenizer *t;
    chat_format fmt;
    chat_call *calls;
    int n, cap;
    /* K2 */
    int32_t sec_begin, sec_end, call_begin, arg_begin, call_end;
    int k2;
    char *hdr;
    size_t hdr_len, hdr_cap;
    /* K3 */
    int32_t open, close, sep;
    int tag;
    char *tagbuf;
    size_t tag_len, tag_cap;
    int in_tools, in_call, in_value, in_json, value_is_string, n_args;
};

chat_tool_parser *chat_tool_parser_new(const tokenizer *t, chat_format fmt) {
    chat_tool_parser *p = xcalloc(1, sizeof *p);
    p->t = t;
    p->fmt = fmt;
    p->sec_begin = tokenizer_special_id(t, "<|tool_calls_section_begin|>");
    p->sec_end = tokenizer_special_id(t, "<|tool_calls_section_end|>");
    p->call_begin = tokenizer_special_id(t, "<|tool_call_begin|>");
    p->arg_begin = tokenizer_special_id(t, "<|tool_call_argument_begin|>");
    p->call_end = tokenizer_special_id(t, "<|tool_call_end|>");
    p->open = tokenizer_special_id(t, "<|open|>");
    p->close = tokenizer_special_id(t, "<|close|>");
    p->sep = tokenizer_special_id(t, "<|sep|>");
    return p;
}

void chat_tool_parser_free(chat_tool_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].args);
    }
    free(p->calls);
    free(p->hdr);
    free(p->tagbuf);
    free(p);
}

int chat_tool_parser_count(const chat_tool_parser *p) { return p->n; }
const chat_call *chat_tool_parser_call(const chat_tool_parser *p, int i) { return &p->calls[i]; }

static chat_call *new_call(chat_tool_parser *p) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 4;
        p->calls = xrealloc(p->calls, (size_t)p->cap * sizeof *p->calls);
    }
    chat_call *c = &p->calls[p->n++];
    memset(c, 0, sizeof *c);
    c->args = xcalloc(1, 1);
    c->args_cap = 1;
    return c;
}

static void args_add(chat_call *c, const char *s, size_t n) {
    tok_buf_append(&c->args, &c->args_len, &c->args_cap, s, n);
    tok_buf_append(&c->args, &c->args_len, &c->args_cap, "", 1);
    c->args_len--;   /* keep it NUL-terminated */
}

/* Appends bytes as the inside of a JSON string. */
static void args_add_escaped(chat_call *c, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char e[8];
        if (s[i] == '"' || s[i] == '\\') {
            e[0] = '\\';
            e[1] = (char)s[i];
            args_add(c, e, 2);
        } else if (s[i] == '\n' || s[i] == '\t' || s[i] == '\r') {
            e[0] = '\\';
            e[1] = s[i] == '\n' ? 'n' : s[i] == '\t' ? 't' : 'r';
            args_add(c, e, 2);
        } else if (s[i] < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", s[i]);
            args_add(c, e, 6);
        } else {
            args_add(c, (const char *)s + i, 1);
        }
    }
}

/* ---- K2 ---- */

static void k2_header_done(chat_tool_parser *p) {
    chat_call *c = &p->calls[p->n - 1];
    const char *h = p->hdr ? p->hdr : "";
    size_t n = p->hdr_len;
    while (n && (h[0] == ' ' || h[0] == '\n')) h++, n--;
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\n')) n--;
    c->id = xmalloc(n + 1);
    memcpy(c->id, h, n);
    c->id[n] = 0;
    const char *name = h;
    size_t nl = n;
    if (nl > 10 && !memcmp(name, "functions.", 10)) name += 10, nl -= 10;
    size_t k = nl;   /* drop a :IDX suffix */
    while (k && name[k - 1] >= '0' && name[k - 1] <= '9') k--;
    if (k && k < nl && name[k - 1] == ':') nl = k - 1;
    c->name = xmalloc(nl + 1);
    memcpy(c->name, name, nl);
    c->name[nl] = 0;
    if (!n) {
        free(c->id);
        c->id = xmalloc(32);
        snprintf(c->id, 32, "call_%d", p->n - 1);
    }
}

static int k2_feed(chat_tool_parser *p, int32_t id) {
    if (p->sec_begin < 0 && p->call_begin < 0) return 0;
    if (id == p->sec_begin) {
        p->k2 = K2_SECTION;
        return 1;
    }
    if (id == p->call_begin) {   /* also opens a section the model forgot to open */
        new_call(p);
        p->hdr_len = 0;
        p->k2 = K2_HEADER;
        return 1;
    }
    if (p->k2 == K2_OUT) return 0;
    if (id == p->sec_end) {
        p->k2 = K2_OUT;
        return 1;
    }
    if (p->k2 == K2_HEADER && id == p->arg_begin) {
        k2_header_done(p);
        p->k2 = K2_ARGS;
        return 1;
    }
    if (p->k2 == K2_ARGS && id == p->call_end) {
        p->calls[p->n - 1].done = 1;
        p->k2 = K2_SECTION;
        return 1;
    }
    if (tokenizer_is_special(p->t, id)) return 1;
    size_t n;
    const uint8_t *b = tokenizer_token_bytes(p->t, id, &n);
    if (!b) return 1;
    if (p->k2 == K2_HEADER) tok_buf_append(&p->hdr, &p->hdr_len, &p->hdr_cap, b, n);
    else if (p->k2 == K2_ARGS) args_add(&p->calls[p->n - 1], (const char *)b, n);
    return 1;
}

/* ---- K3 ---- */

/* The value of attribute `key` in a tag, unescaped (&quot; &amp;); NULL if absent. */
static char *k3_attr(const char *tag, size_t n, const char *key) {
    char pat[40];
    snprintf(pat, sizeof pat, " %s=\"", key);
    size_t pl = strlen(pat);
    for (size_t i = 0; i + pl <= n; i++) {
        if (memcmp(tag + i, pat, pl)) continue;
        size_t j = i + pl, o = 0;
        char *out = xmalloc(n - j + 1);
        while (j < n && tag[j] != '"') {
            if (j + 6 <= n && !memcmp(tag + j, "&quot;", 6)) out[o++] = '"', j += 6;
            else if (j + 5 <= n && !memcmp(tag + j, "&amp;", 5)) out[o++] = '&', j += 5;
            else out[o++] = tag[j++];
        }
        out[o] = 0;
        return out;
    }
    return NULL;
}

static int tag_is(const char *tag, size_t n, const char *name) {
    size_t l = strlen(name);
    return n >= l && !memcmp(tag, name, l) && (n == l || tag[l] == ' ');
}

static void k3_tag(chat_tool_parser *p) {
    const char *tg = p->tagbuf ? p->tagbuf : "";
    size_t n = p->tag_len;
    chat_call *c = p->n ? &p->calls[p->n - 1] : NULL;
    if (p->tag == TAG_OPEN) {
        if (tag_is(tg, n, "tools")) p->in_tools = 1;
        else if (p->in_tools && tag_is(tg, n, "call")) {
            c = new_call(p);
            c->name = k3_attr(tg, n, "tool");
            if (!c->name) c->name = xstrdup("");
            char *idx = k3_attr(tg, n, "index");
            c->id = xmalloc(48);
            snprintf(c->id, 48, "call_%s", idx && *idx ? idx : "0");
            free(idx);
            p->in_call = 1;
            p->n_args = 0;
        } else if (p->in_call && c && tag_is(tg, n, "argument")) {
            char *key = k3_attr(tg, n, "key"), *type = k3_attr(tg, n, "type");
            args_add(c, p->n_args++ ? ",\"" : "{\"", 2);
            args_add_escaped(c, (const uint8_t *)(key ? key : ""), key ? strlen(key) : 0);
            args_add(c, "\":", 2);
            p->value_is_string = !type || !strcmp(type, "string");
            if (p->value_is_string) args_add(c, "\"", 1);
            p->in_value = 1;
            free(key);
            free(type);
        } else if (p->in_call && tag_is(tg, n, "json")) {
            p->in_json = 1;
        }
    } else {
        if (tag_is(tg, n, "argument") && p->in_value && c) {
            if (p->value_is_string) args_add(c, "\"", 1);
            p->in_value = 0;
        } else if (tag_is(tg, n, "json")) {
            p->in_json = 0;
        } else if (tag_is(tg, n, "call") && p->in_call && c) {
            if (p->n_args) args_add(c, "}", 1);
            else if (!c->args_len) args_add(c, "{}", 2);
            c->done = 1;
            p->in_call = 0;
        } else if (tag_is(tg, n, "tools")) {
            p->in_tools = 0;
        }
    }
}

static int k3_feed(chat_tool_parser *p, int32_t id) {
    if (p->open < 0) return 0;
    if (id == p->open || id == p->close) {
        p->tag = id == p->open ? TAG_OPEN : TAG_CLOSE;
        p->tag_len = 0;
        return 0;
    }
    if (id == p->sep) {
        if (p->tag != TAG_NO) k3_tag(p);
        p->tag = TAG_NO;
        return 0;
    }
    if (tokenizer_is_special(p->t, id)) return 0;
    size_t n;
    const uint8_t *b = tokenizer_token_bytes(p->t, id, &n);
    if (!b) return 0;
    if (p->tag != TAG_NO) {
        if (p->tag_len < 4096) tok_buf_append(&p->tagbuf, &p->tag_len, &p->tag_cap, b, n);
        return 0;
    }
    chat_call *c = p->n ? &p->calls[p->n - 1] : NULL;
    if (c && p->in_call && p->in_value) {
        if (p->value_is_string) args_add_escaped(c, b, n);
        else args_add(c, (const char *)b, n);
    } else if (c && p->in_call && p->in_json) {
        args_add(c, (const char *)b, n);
    }
    return 0;
}

int chat_tool_parser_feed(chat_tool_parser *p, int32_t id) {
    return p->fmt == CHAT_K3 ? k3_feed(p, id) : k2_feed(p, id);
}
