/* tools.c — tool calls and constrained output for the server (tools.h). A required or named tool call and a
 * JSON response_format are generated under a grammar (src/sample/grammar.h), so that even a model that never
 * saw a chat returns a call that parses and whose arguments validate against the function's parameters. */
#include "server/tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/grammar.h"
#include "tokenizer/toolcall.h"

#define MAX_PARALLEL_CALLS 8

typedef struct tools_job {
    grammar *g;
    grammar_mask mask;
    int has_mask;
    int32_t ban[2];            /* tool_choice none: the ids that open a call */
    int n_ban;
    int32_t one_call;          /* parallel_tool_calls false (K2): the id that opens a second call, or -1 */
    chat_tool_parser *parser;
    int *sent_head;            /* streaming: call i's id and name were sent */
    size_t *sent_args;         /* streaming: bytes of call i's arguments sent */
    int n_sent;
} tools_job;

/* ---- prompt ---- */

typedef struct chat_keep {
    chat_message_tools *mt;
    chat_tool_call *calls;
} chat_keep;

void tools_chat_opts(const srv_request *r, chat_opts *co, void **keep) {
    chat_keep *k = xcalloc(1, sizeof *k);
    *keep = k;
    int total = 0;
    for (int i = 0; i < r->n_msgs; i++) total += r->msgs[i].n_tool_calls;
    k->mt = xcalloc((size_t)(r->n_msgs ? r->n_msgs : 1), sizeof *k->mt);
    k->calls = xcalloc((size_t)(total ? total : 1), sizeof *k->calls);
    chat_tool_call *c = k->calls;
    for (int i = 0; i < r->n_msgs; i++) {
        const srv_message *m = &r->msgs[i];
        k->mt[i] = (chat_message_tools){.tool_calls = c, .n_tool_calls = m->n_tool_calls,
                                        .tool_call_id = m->tool_call_id, .name = m->name};
        for (int j = 0; j < m->n_tool_calls; j++)
            *c++ = (chat_tool_call){m->tool_calls[j].id, m->tool_calls[j].name, m->tool_calls[j].arguments};
    }
    co->msg_tools = k->mt;
    co->tools_json = r->tools_json;
    co->tool_choice = r->tool_choice == SRV_TOOLS_NONE ? "none" : r->tool_choice != SRV_TOOLS_AUTO ? "required" : NULL;
    co->response_format = r->response_format == SRV_FORMAT_JSON_OBJECT   ? "json_object"
                          : r->response_format == SRV_FORMAT_JSON_SCHEMA ? "json_schema"
                                                                         : NULL;
    co->response_schema = r->response_schema;
}

void tools_chat_free(void *keep) {
    chat_keep *k = keep;
    if (!k) return;
    free(k->mt);
    free(k->calls);
    free(k);
}

int tools_constrained(const srv_request *r) {
    return r->response_format != SRV_FORMAT_TEXT || r->tool_choice == SRV_TOOLS_REQUIRED ||
           r->tool_choice == SRV_TOOLS_NAMED;
}

/* ---- the grammar of a forced tool call ---- */

static int args_node(grammar *g, const srv_tool *t, df_error *err) {
    if (!t->parameters || !strcmp(t->parameters, "{}")) return grammar_add_json_any(g, 1);
    return grammar_add_schema(g, t->parameters, strlen(t->parameters), err);
}

enum { TK_SEC_BEGIN, TK_SEC_END, TK_CALL_BEGIN, TK_ARG_BEGIN, TK_CALL_END, TK_OPEN, TK_CLOSE, TK_SEP, TK_N };

/* One call of any allowed function: its name as a literal, then that function's own arguments schema.
 * K2: NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|> (after "functions.").
 * K3: NAME" index="N"<|sep|><|open|>json type="object"<|sep|>ARGS<|close|>json<|sep|><|close|>call<|sep|>
 *     (after `<|open|>call tool="`; names are [A-Za-z0-9_-], nothing to escape). */
static int call_select(const srv_request *r, grammar *g, chat_format fmt, const int32_t *tk, df_error *err) {
    const char *lits[SRV_MAX_TOOLS];
    char *names[SRV_MAX_TOOLS];
    int kids[SRV_MAX_TOOLS], n = 0, rc = 0;
    for (int i = 0; i < r->n_tools && !rc; i++) {
        if (r->tool_choice == SRV_TOOLS_NAMED && strcmp(r->tools[i].name, r->tool_choice_name)) continue;
        int a = args_node(g, &r->tools[i], err);
        if (a < 0) {
            rc = -1;
            break;
        }
        size_t len = strlen(r->tools[i].name) + 16;
        names[n] = xmalloc(len);
        if (fmt == CHAT_K3) {
            snprintf(names[n], len, "%s\" index=\"", r->tools[i].name);
            int tail[] = {grammar_add_int(g, 1, 999), grammar_add_text(g, "\""), grammar_add_token(g, tk[TK_SEP]),
                          grammar_add_token(g, tk[TK_OPEN]), grammar_add_text(g, "json type=\"object\""),
                          grammar_add_token(g, tk[TK_SEP]), a, grammar_add_token(g, tk[TK_CLOSE]),
                          grammar_add_text(g, "json"), grammar_add_token(g, tk[TK_SEP]),
                          grammar_add_token(g, tk[TK_CLOSE]), grammar_add_text(g, "call"),
                          grammar_add_token(g, tk[TK_SEP])};
            kids[n] = grammar_add_seq(g, tail, (int)(sizeof tail / sizeof *tail));
        } else {
            snprintf(names[n], len, "%s:", r->tools[i].name);
            int tail[] = {grammar_add_int(g, 0, 999), grammar_add_token(g, tk[TK_ARG_BEGIN]), a,
                          grammar_add_token(g, tk[TK_CALL_END])};
            kids[n] = grammar_add_seq(g, tail, 4);
        }
        lits[n] = names[n];
        n++;
    }
    int sel = rc ? -1 : grammar_add_select(g, lits, kids, n);
    for (int k = 0; k < n; k++) free(names[k]);
    return sel;
}

/* K2: <|tool_calls_section_begin|> (<|tool_call_begin|>functions.CALL)+ <|tool_calls_section_end|>
 * K3 (the prompt opened the response): close it, then <|open|>tools<|sep|> (<|open|>call tool="CALL)+
 * <|close|>tools<|sep|><|close|>message<|sep|> */
static int call_grammar(const srv *s, const srv_request *r, grammar *g, df_error *err) {
    static const char *const names[TK_N] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                            "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                            "<|tool_call_end|>", "<|open|>", "<|close|>", "<|sep|>"};
    int32_t tk[TK_N];
    for (int i = 0; i < TK_N; i++) {
        tk[i] = tokenizer_special_id(s->tok, names[i]);
        if (tk[i] < 0 && (s->fmt == CHAT_K3) == (i >= TK_OPEN)) {
            df_error_set(err, DF_EUNSUPPORTED, "this model's tokenizer has no %s token for tool calls", names[i]);
            return -1;
        }
    }
    int sel = call_select(r, g, s->fmt, tk, err);
    if (sel < 0) return -1;
    int max = r->parallel_tool_calls >= 0 && r->tool_choice != SRV_TOOLS_NAMED ? MAX_PARALLEL_CALLS : 1;
    if (s->fmt == CHAT_K3) {
        int call[] = {grammar_add_token(g, tk[TK_OPEN]), grammar_add_text(g, "call tool=\""), sel};
        int root[] = {grammar_add_token(g, tk[TK_CLOSE]), grammar_add_text(g, "response"), grammar_add_token(g, tk[TK_SEP]),
                      grammar_add_token(g, tk[TK_OPEN]), grammar_add_text(g, "tools"), grammar_add_token(g, tk[TK_SEP]),
                      grammar_add_repeat(g, grammar_add_seq(g, call, 3), 1, max),
                      grammar_add_token(g, tk[TK_CLOSE]), grammar_add_text(g, "tools"), grammar_add_token(g, tk[TK_SEP]),
                      grammar_add_token(g, tk[TK_CLOSE]), grammar_add_text(g, "message"), grammar_add_token(g, tk[TK_SEP])};
        return grammar_add_seq(g, root, (int)(sizeof root / sizeof *root));
    }
    int call[] = {grammar_add_token(g, tk[TK_CALL_BEGIN]), grammar_add_text(g, "functions."), sel};
    int root[] = {grammar_add_token(g, tk[TK_SEC_BEGIN]), grammar_add_repeat(g, grammar_add_seq(g, call, 3), 1, max),
                  grammar_add_token(g, tk[TK_SEC_END])};
    return grammar_add_seq(g, root, 3);
}

int tools_prepare(srv *s, srv_job *j, srv_err *err) {
    const srv_request *r = &j->req;
    if (r->ep != SRV_EP_CHAT) return 0;
    tools_job *t = xcalloc(1, sizeof *t);
    j->tools = t;
    t->one_call = -1;
    if (r->n_tools) t->parser = chat_tool_parser_new(s->tok, s->fmt);
    /* parallel_tool_calls false: once a call is over the section must close (K2); any later call is left out
     * of the answer either way (tools_n_calls) */
    if (r->n_tools && r->parallel_tool_calls < 0 && s->fmt == CHAT_K2)
        t->one_call = tokenizer_special_id(s->tok, "<|tool_call_begin|>");
    if (r->n_tools && r->tool_choice == SRV_TOOLS_NONE && s->fmt == CHAT_K2) {
        int32_t a = tokenizer_special_id(s->tok, "<|tool_calls_section_begin|>"),
                b = tokenizer_special_id(s->tok, "<|tool_call_begin|>");
        if (a >= 0) t->ban[t->n_ban++] = a;
        if (b >= 0) t->ban[t->n_ban++] = b;
    }
    if (!tools_constrained(r)) return 0;
    df_error de = {0};
    t->g = grammar_new();
    int root;
    if (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED)
        root = call_grammar(s, r, t->g, &de);
    else if (r->response_format == SRV_FORMAT_JSON_SCHEMA)
        root = grammar_add_schema(t->g, r->response_schema, strlen(r->response_schema), &de);
    else
        root = grammar_add_json_any(t->g, 1);
    if (root < 0 || grammar_finish(t->g, root, &de)) {
        srv_err_set(err, 400, "invalid_request_error", "unsupported_constraint",
                    r->response_format != SRV_FORMAT_TEXT && r->tool_choice == SRV_TOOLS_AUTO ? "response_format" : "tools",
                    "%s", de.msg);
        return -1;
    }
    return 0;
}

static int tools_mask(void *ctx, float *logits, int n_vocab, int budget) {
    tools_job *t = ctx;
    int n = t->has_mask ? grammar_mask_apply(&t->mask, logits, n_vocab, budget) : n_vocab;
    for (int i = 0; i < t->n_ban; i++)
        if (t->ban[i] < n_vocab) logits[t->ban[i]] = -INFINITY;
    if (t->one_call >= 0 && t->one_call < n_vocab && chat_tool_parser_count(t->parser) &&
        chat_tool_parser_call(t->parser, 0)->done && logits[t->one_call] != -INFINITY) {
        logits[t->one_call] = -INFINITY;
        n--;
    }
    return n;
}

static int tools_mask_accept(void *ctx, int32_t id) {
    tools_job *t = ctx;
    return t->has_mask ? grammar_mask_accept(&t->mask, id) : 0;
}

void tools_gen_config(srv *s, srv_job *j, gen_config *cfg) {
    tools_job *t = j->tools;
    if (!t) return;
    if (t->g) {
        if (!s->gvocab) s->gvocab = grammar_vocab_new(s->tok);
        grammar_mask_init(&t->mask, t->g, s->gvocab, s->info->eos_id);
        t->has_mask = 1;
    }
    if (t->g || t->n_ban || t->one_call >= 0) {
        cfg->mask = tools_mask;
        cfg->mask_accept = tools_mask_accept;
        cfg->mask_ctx = t;
    }
    cfg->tools = t->parser;
}

void tools_job_free(srv_job *j) {
    tools_job *t = j->tools;
    if (!t) return;
    if (t->has_mask) grammar_mask_free(&t->mask);
    grammar_free(t->g);
    chat_tool_parser_free(t->parser);
    free(t->sent_head);
    free(t->sent_args);
    free(t);
    j->tools = NULL;
}

/* ---- responses ---- */

/* Valid UTF-8 prefix length of p[0..n), stopping before an incomplete or invalid sequence. */
static size_t utf8_prefix(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        int k = utf8_valid_len((const uint8_t *)p + i, n - i);
        if (k <= 0) break;
        i += (size_t)k;
    }
    return i;
}

int tools_n_calls(const srv_job *j) {
    const tools_job *t = j->tools;
    if (!t || !t->parser) return 0;
    int n = chat_tool_parser_count(t->parser);
    return j->req.parallel_tool_calls < 0 ? DF_MIN(n, 1) : n;
}

const chat_call *tools_call(const srv_job *j, int i) {
    const tools_job *t = j->tools;
    return t && t->parser && i >= 0 && i < tools_n_calls(j) ? chat_tool_parser_call(t->parser, i) : NULL;
}

void tools_sse_deltas(const srv *s, srv_job *j, int final, text_buf *out) {
    tools_job *t = j->tools;
    if (!t || !t->parser) return;
    int n = tools_n_calls(j);
    if (n > t->n_sent) {
        t->sent_head = xrealloc(t->sent_head, (size_t)n * sizeof *t->sent_head);
        t->sent_args = xrealloc(t->sent_args, (size_t)n * sizeof *t->sent_args);
        for (int i = t->n_sent; i < n; i++) t->sent_head[i] = 0, t->sent_args[i] = 0;
        t->n_sent = n;
    }
    json_t *deltas = json_array();
    for (int i = 0; i < n; i++) {
        const chat_call *c = chat_tool_parser_call(t->parser, i);
        if (!c->id) continue;
        json_t *d = json_pack("{s:i}", "index", i), *fn = json_object();
        if (!t->sent_head[i]) {
            json_object_set_new(d, "id", json_string(c->id));
            json_object_set_new(d, "type", json_string("function"));
            json_object_set_new(fn, "name", respond_lossy_string((const uint8_t *)c->name, strlen(c->name)));
            t->sent_head[i] = 1;
        }
        size_t avail = c->args_len - t->sent_args[i];
        size_t take = final ? avail : utf8_prefix(c->args + t->sent_args[i], avail);
        if (take || json_object_get(fn, "name")) json_object_set_new(fn, "arguments", respond_lossy_string((const uint8_t *)c->args + t->sent_args[i], take));
        t->sent_args[i] += take;
        if (json_object_size(fn)) {
            json_object_set_new(d, "function", fn);
            json_array_append_new(deltas, d);
        } else {
            json_decref(fn);
            json_decref(d);
        }
    }
    if (json_array_size(deltas)) {
        json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object", "chat.completion.chunk", "created",
                              (json_int_t)j->created, "model", j->model_name ? j->model_name : srv_model_id(s));
        json_object_set_new(o, "choices", json_pack("[{s:i,s:{s:o},s:n,s:n}]", "index", 0, "delta", "tool_calls",
                                                     deltas, "logprobs", "finish_reason"));
        char *txt = json_dumps(o, JSON_COMPACT);
        text_buf_printf(out, "data: %s\n\n", txt);
        free(txt);
        json_decref(o);
    } else {
        json_decref(deltas);
    }
}

/* A call is reported as one only when it is whole: its header read, its end marker seen and its arguments
 * a JSON object. */
static int call_parsed(const chat_call *c) {
    if (!c->id || !c->done) return 0;
    json_error_t je;
    json_t *v = json_loadb(c->args ? c->args : "", c->args_len, 0, &je);
    int ok = json_is_object(v);
    json_decref(v);
    return ok;
}

/* calls that parsed among those the answer reports (tools_n_calls), and whether every one begun did */
static int calls_parsed(const srv_job *j, int *all) {
    int n = 0;
    *all = 1;
    for (int i = 0; i < tools_n_calls(j); i++) {
        int ok = call_parsed(tools_call(j, i));
        n += ok;
        *all &= ok;
    }
    return n;
}

const char *tools_finish_reason(const srv_job *j, const char *dflt) {
    const tools_job *t = j->tools;
    int all;
    if (!t || !t->parser || strcmp(dflt, "stop") || !calls_parsed(j, &all) || !all) return dflt;
    return "tool_calls";
}

void tools_final_message(const srv_job *j, json_t *msg) {
    const tools_job *t = j->tools;
    int all;
    if (!t || !t->parser || !calls_parsed(j, &all)) return;
    json_t *calls = json_array();
    for (int i = 0; i < tools_n_calls(j); i++) {
        const chat_call *c = chat_tool_parser_call(t->parser, i);
        if (!call_parsed(c)) continue;
        json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", c->id, "type", "function", "function",
                                               "name", respond_lossy_string((const uint8_t *)c->name, strlen(c->name)), "arguments",
                                               respond_lossy_string((const uint8_t *)c->args, c->args_len)));
    }
    json_object_set_new(msg, "tool_calls", calls);
    if (!j->choices[0].content.len) json_object_set_new(msg, "content", json_null());   /* tools: n is 1 */
}
