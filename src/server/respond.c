/* respond.c — the OpenAI response shapes: chat.completion(.chunk), text_completion, usage, logprobs, model
 * list. Token strings in logprobs may be partial UTF-8 characters, so they are written lossily (U+FFFD) and
 * the exact bytes go in "bytes". */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/srv_internal.h"
#include "server/tools.h"

static const char *finish_name(gen_finish f) { return f == GEN_FINISH_LENGTH ? "length" : "stop"; }

json_t *lossy_string(const uint8_t *p, size_t n) {
    text_buf b = {0};
    text_buf_puts(&b, "");
    for (size_t i = 0; i < n;) {
        int k = utf8_valid_len(p + i, n - i);
        if (k > 0) {
            text_buf_append(&b, (const char *)p + i, (size_t)k);
            i += (size_t)k;
        } else {
            text_buf_puts(&b, "\xEF\xBF\xBD");
            i++;
        }
    }
    json_t *s = json_stringn(b.p, b.len);
    text_buf_free(&b);
    return s ? s : json_string("");
}

static const uint8_t *token_bytes(const srv *s, int32_t id, size_t *n) {
    const uint8_t *b = s->tok ? tokenizer_token_bytes(s->tok, id, n) : NULL;
    if (!b) *n = 0;
    return b ? b : (const uint8_t *)"";
}

static json_t *bytes_array(const uint8_t *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* chat: {"token","logprob","bytes"} (+ "top_logprobs" when top is set) */
static json_t *chat_logprob_entry(const srv *s, int32_t id, float lp, const sample_result *top) {
    size_t n;
    const uint8_t *b = token_bytes(s, id, &n);
    json_t *e = json_pack("{s:o,s:f,s:o}", "token", lossy_string(b, n), "logprob", (double)lp, "bytes",
                          bytes_array(b, n));
    if (top) {
        json_t *alts = json_array();
        for (int i = 0; i < top->n_top; i++)
            json_array_append_new(alts, chat_logprob_entry(s, top->top[i].id, top->top[i].logprob, NULL));
        json_object_set_new(e, "top_logprobs", alts);
    }
    return e;
}

/* completions: parallel arrays */
static void completion_logprobs_add(const srv *s, json_t *o, const sample_result *r, size_t offset) {
    size_t n;
    const uint8_t *b = token_bytes(s, r->id, &n);
    json_array_append_new(json_object_get(o, "tokens"), lossy_string(b, n));
    json_array_append_new(json_object_get(o, "token_logprobs"), json_real(r->logprob));
    json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)offset));
    json_t *top = json_object();
    for (int i = 0; i < r->n_top; i++) {
        const uint8_t *tb = token_bytes(s, r->top[i].id, &n);
        json_t *k = lossy_string(tb, n);
        json_object_set_new(top, json_string_value(k), json_real(r->top[i].logprob));
        json_decref(k);
    }
    json_array_append_new(json_object_get(o, "top_logprobs"), top);
}

static json_t *completion_logprobs_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static json_t *chunk_base(const srv *s, const srv_job *j) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                     j->req.ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", s->model_id);
}

static void sse_write(json_t *o, text_buf *out) {
    char *t = json_dumps(o, JSON_COMPACT);
    DF_ASSERT(t);
    text_buf_printf(out, "data: %s\n\n", t);
    free(t);
    json_decref(o);
}

void respond_sse_role_chunk(const srv *s, srv_job *j, text_buf *out) {
    json_t *o = chunk_base(s, j);
    json_object_set_new(o, "choices",
                        json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", 0, "delta", "role", "assistant", "content",
                                  "", "logprobs", "finish_reason"));
    sse_write(o, out);
}

void respond_sse_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out) {
    int has_text = ev->content_len || ev->reasoning_len;
    if (has_text || j->req.logprobs) {
        json_t *choice = json_pack("{s:i,s:n}", "index", 0, "finish_reason");
        json_t *lp = json_null();
        if (j->req.ep == SRV_EP_CHAT) {
            json_t *delta = json_object();
            if (ev->reasoning_len)
                json_object_set_new(delta, "reasoning_content", json_stringn(ev->reasoning, ev->reasoning_len));
            if (ev->content_len || !ev->reasoning_len)
                json_object_set_new(delta, "content", json_stringn(ev->content, ev->content_len));
            json_object_set_new(choice, "delta", delta);
            if (j->req.logprobs)
                lp = json_pack("{s:[o]}", "content",
                               chat_logprob_entry(s, ev->id, ev->sample->logprob,
                                                  j->req.sp.n_top_logprobs ? ev->sample : NULL));
        } else {
            json_object_set_new(choice, "text", json_stringn(ev->content, ev->content_len));
            if (j->req.logprobs) {
                lp = completion_logprobs_new();
                completion_logprobs_add(s, lp, ev->sample, j->text_offset);
            }
            j->text_offset += ev->content_len;
        }
        json_object_set_new(choice, "logprobs", lp);
        json_t *o = chunk_base(s, j);
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        sse_write(o, out);
    }
    if (ev->final) {
        json_t *choice = json_pack("{s:i,s:n,s:s}", "index", 0, "logprobs", "finish_reason",
                                   tools_finish_reason(j, finish_name(ev->finish)));
        if (j->req.ep == SRV_EP_CHAT) json_object_set_new(choice, "delta", json_object());
        else json_object_set_new(choice, "text", json_string(""));
        json_t *o = chunk_base(s, j);
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        sse_write(o, out);
    }
}

static json_t *usage_json(const srv_job *j) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", (int)j->prompt.n, "completion_tokens", j->n_gen,
                     "total_tokens", (int)j->prompt.n + j->n_gen, "prompt_tokens_details", "cached_tokens",
                     j->n_reused);
}

void respond_sse_end(const srv *s, srv_job *j, text_buf *out) {
    if (j->req.include_usage) {
        json_t *o = chunk_base(s, j);
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(j));
        sse_write(o, out);
    }
    text_buf_puts(out, "data: [DONE]\n\n");
}

void respond_accumulate(const srv *s, srv_job *j, const gen_event *ev) {
    text_buf_append(&j->content, ev->content, ev->content_len);
    text_buf_append(&j->reasoning, ev->reasoning, ev->reasoning_len);
    if (!j->req.logprobs) return;
    if (j->req.ep == SRV_EP_CHAT) {
        if (!j->logprobs) j->logprobs = json_array();
        json_array_append_new(j->logprobs, chat_logprob_entry(s, ev->id, ev->sample->logprob,
                                                              j->req.sp.n_top_logprobs ? ev->sample : NULL));
    } else {
        if (!j->logprobs) j->logprobs = completion_logprobs_new();
        completion_logprobs_add(s, j->logprobs, ev->sample, j->text_offset);
        j->text_offset += ev->content_len;
    }
}

char *respond_final_json(const srv *s, srv_job *j) {
    json_t *lp = json_null();
    if (j->req.logprobs) {
        json_t *acc = j->logprobs ? json_incref(j->logprobs)
                                  : (j->req.ep == SRV_EP_CHAT ? json_array() : completion_logprobs_new());
        lp = j->req.ep == SRV_EP_CHAT ? json_pack("{s:o}", "content", acc) : acc;
    }
    json_t *choice = json_pack("{s:i,s:o,s:s}", "index", 0, "logprobs", lp, "finish_reason",
                               tools_finish_reason(j, finish_name(j->finish)));
    const char *content = j->content.p ? j->content.p : "";
    if (j->req.ep == SRV_EP_CHAT) {
        json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", content, j->content.len);
        if (j->reasoning.len)
            json_object_set_new(msg, "reasoning_content", json_stringn(j->reasoning.p, j->reasoning.len));
        tools_final_message(j, msg);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(content, j->content.len));
    }
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", j->id, "object",
                          j->req.ep == SRV_EP_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)j->created, "model", s->model_id, "choices", choice, "usage", usage_json(j));
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}

char *respond_models_json(const srv *s, const char *only_id) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", s->model_id, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "deltafin", "context_length",
                          (json_int_t)s->info->max_context);
    json_t *o = only_id ? m : json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}
