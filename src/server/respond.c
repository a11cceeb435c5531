/* respond.c — the OpenAI response shapes: chat.completion(.chunk), text_completion, usage, logprobs, model
 * list. Token strings in logprobs may be partial UTF-8 characters, so they are written lossily (U+FFFD) and
 * the exact bytes go in "bytes". */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/prompt_cache.h"
#include "server/srv_internal.h"
#include "server/tools.h"

static const char *finish_name(gen_finish f) { return f == GEN_FINISH_LENGTH ? "length" : "stop"; }

json_t *respond_lossy_string(const uint8_t *p, size_t n) {
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
    json_t *e = json_pack("{s:o,s:f,s:o}", "token", respond_lossy_string(b, n), "logprob", (double)lp, "bytes",
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
    json_array_append_new(json_object_get(o, "tokens"), respond_lossy_string(b, n));
    json_array_append_new(json_object_get(o, "token_logprobs"), json_real(r->logprob));
    json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)offset));
    json_t *top = json_object();
    for (int i = 0; i < r->n_top; i++) {
        const uint8_t *tb = token_bytes(s, r->top[i].id, &n);
        json_t *k = respond_lossy_string(tb, n);
        json_object_set_new(top, json_string_value(k), json_real(r->top[i].logprob));
        json_decref(k);
    }
    json_array_append_new(json_object_get(o, "top_logprobs"), top);
}

static json_t *completion_logprobs_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static const char *model_name(const srv *s, const srv_job *j) {
    return j->model_name ? j->model_name : srv_model_id(s);
}

static json_t *chunk_base(const srv *s, const srv_job *j) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                     j->req.ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", model_name(s, j));
}

/* Why an answer ended at "length" when the context, not max_tokens, was the limit. */
static void add_note(const srv *s, const srv_job *j, int choice, json_t *o) {
    if (j->context_capped && j->choices[choice].finish == GEN_FINISH_LENGTH)
        json_object_set_new(o, "note", json_sprintf("The answer stopped because the context is full (%lld tokens: "
                                                     "%d in the prompt).",
                                                     (long long)s->info->max_context, (int)j->prompt.n));
}

static void sse_write(json_t *o, text_buf *out) {
    char *t = json_dumps(o, JSON_COMPACT);
    DF_ASSERT(t);
    text_buf_printf(out, "data: %s\n\n", t);
    free(t);
    json_decref(o);
}

void respond_sse_role_chunk(const srv *s, srv_job *j, text_buf *out) {
    for (int i = 0; i < j->n_choices; i++) {
        json_t *o = chunk_base(s, j);
        json_object_set_new(o, "choices",
                            json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", i, "delta", "role", "assistant",
                                      "content", "", "logprobs", "finish_reason"));
        sse_write(o, out);
    }
}

void respond_sse_event(const srv *s, srv_job *j, int c, const gen_event *ev, text_buf *out) {
    int has_text = ev->content_len || ev->reasoning_len;
    srv_choice *ch = &j->choices[c];
    if (has_text || j->req.logprobs) {
        json_t *choice = json_pack("{s:i,s:n}", "index", c, "finish_reason");
        json_t *lp = json_null();
        if (j->req.ep == SRV_EP_CHAT) {
            json_t *delta = json_object();
            if (ev->reasoning_len) {   /* under both names clients read: llama-server's and vLLM's/ollama's */
                json_t *r = respond_lossy_string((const uint8_t *)ev->reasoning, ev->reasoning_len);
                json_object_set(delta, "reasoning_content", r);
                json_object_set_new(delta, "reasoning", r);
            }
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
                completion_logprobs_add(s, lp, ev->sample, ch->text_offset);
            }
            ch->text_offset += ev->content_len;
        }
        json_object_set_new(choice, "logprobs", lp);
        json_t *o = chunk_base(s, j);
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        sse_write(o, out);
    }
    if (ev->final) {
        json_t *choice = json_pack("{s:i,s:n,s:s}", "index", c, "logprobs", "finish_reason",
                                   tools_finish_reason(j, finish_name(ev->finish)));
        if (j->req.ep == SRV_EP_CHAT) json_object_set_new(choice, "delta", json_object());
        else json_object_set_new(choice, "text", json_string(""));
        json_t *o = chunk_base(s, j);
        add_note(s, j, c, o);
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        sse_write(o, out);
    }
}

static json_t *usage_json(const srv_job *j) {
    int gen = 0;
    for (int i = 0; i < j->n_choices; i++) gen += j->choices[i].n_gen;
    /* speculative decoding's drafts, in the fields OpenAI uses for predicted outputs */
    return json_pack("{s:i,s:i,s:i,s:{s:i},s:{s:i,s:i}}", "prompt_tokens", (int)j->prompt.n, "completion_tokens",
                     gen, "total_tokens", (int)j->prompt.n + gen, "prompt_tokens_details", "cached_tokens",
                     j->n_reused, "completion_tokens_details", "accepted_prediction_tokens", j->accepted,
                     "rejected_prediction_tokens", j->drafted - j->accepted);
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

void respond_accumulate(const srv *s, srv_job *j, int c, const gen_event *ev) {
    srv_choice *ch = &j->choices[c];
    text_buf_append(&ch->content, ev->content, ev->content_len);
    text_buf_append(&ch->reasoning, ev->reasoning, ev->reasoning_len);
    if (!j->req.logprobs) return;
    if (j->req.ep == SRV_EP_CHAT) {
        if (!ch->logprobs) ch->logprobs = json_array();
        json_array_append_new(ch->logprobs, chat_logprob_entry(s, ev->id, ev->sample->logprob,
                                                               j->req.sp.n_top_logprobs ? ev->sample : NULL));
    } else {
        if (!ch->logprobs) ch->logprobs = completion_logprobs_new();
        completion_logprobs_add(s, ch->logprobs, ev->sample, ch->text_offset);
        ch->text_offset += ev->content_len;
    }
}

static json_t *final_choice(const srv_job *j, int c) {
    const srv_choice *ch = &j->choices[c];
    json_t *lp = json_null();
    if (j->req.logprobs) {
        json_t *acc = ch->logprobs ? json_incref(ch->logprobs)
                                   : (j->req.ep == SRV_EP_CHAT ? json_array() : completion_logprobs_new());
        lp = j->req.ep == SRV_EP_CHAT ? json_pack("{s:o}", "content", acc) : acc;
    }
    json_t *choice = json_pack("{s:i,s:o,s:s}", "index", c, "logprobs", lp, "finish_reason",
                               tools_finish_reason(j, finish_name(ch->finish)));
    const char *content = ch->content.p ? ch->content.p : "";
    if (j->req.ep == SRV_EP_CHAT) {
        json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", content, ch->content.len);
        if (ch->reasoning.len) {
            json_t *r = respond_lossy_string((const uint8_t *)ch->reasoning.p, ch->reasoning.len);
            json_object_set(msg, "reasoning_content", r);
            json_object_set_new(msg, "reasoning", r);
        }
        tools_final_message(j, msg);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(content, ch->content.len));
    }
    return choice;
}

char *respond_final_json(const srv *s, srv_job *j) {
    json_t *choices = json_array();
    for (int c = 0; c < j->n_choices; c++) json_array_append_new(choices, final_choice(j, c));
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", j->id, "object",
                          j->req.ep == SRV_EP_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)j->created, "model", model_name(s, j), "choices", choices, "usage",
                          usage_json(j));
    for (int c = 0; c < j->n_choices; c++) add_note(s, j, c, o);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}

static json_t *model_json(const srv *s, const char *id) {
    return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", id, "object", "model", "created", (json_int_t)s->started,
                     "owned_by", "deltafin", "context_length", (json_int_t)s->info->max_context);
}

char *respond_models_json(const srv *s, const char *only_id) {
    json_t *o;
    if (only_id) {
        o = model_json(s, only_id);
    } else {
        json_t *data = json_array();
        if (!s->o.n_aliases) json_array_append_new(data, model_json(s, s->model_id));
        for (int i = 0; i < s->o.n_aliases; i++) json_array_append_new(data, model_json(s, s->o.aliases[i]));
        o = json_pack("{s:s,s:o}", "object", "list", "data", data);
    }
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}

/* GET /props, as llama-server has it: the model, its context, the slots and what they are doing. */
char *respond_props_json(srv *s) {
    json_t *slots = json_array();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++)
        json_array_append_new(slots, json_pack("{s:i,s:b}", "id", i, "is_processing", s->slots[i].job != NULL));
    int queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    json_t *o = json_pack("{s:s,s:s,s:I,s:i,s:i,s:o,s:i,s:b,s:{s:I,s:i}}", "model", srv_model_id(s), "model_path",
                          s->o.model_dir, "n_ctx", (json_int_t)s->info->max_context, "total_slots", s->n_slots,
                          "queue_size", s->o.queue, "slots", slots, "queued", queued, "chat_template",
                          s->has_chat, "default_generation_settings", "n_ctx", (json_int_t)s->info->max_context,
                          "max_tokens", s->o.max_tokens);
    json_t *pc = json_pack("{s:b}", "enabled", s->pcache != NULL);
    if (s->pcache) {
        int entries, enabled;
        uint64_t bytes;
        const char *why;
        pcache_usage(s->pcache, &entries, &bytes, &enabled, &why);
        json_object_set_new(pc, "enabled", json_boolean(enabled));
        json_object_set_new(pc, "entries", json_integer(entries));
        json_object_set_new(pc, "bytes", json_integer((json_int_t)bytes));
        if (why) json_object_set_new(pc, "why_off", json_string(why));
    }
    json_object_set_new(o, "prompt_cache", pc);
    json_t *ranks = json_array();   /* expert parallelism: who serves the model and what each holds */
    for (int r = 0; r < s->n_ranks; r++)
        json_array_append_new(ranks, json_pack("{s:i,s:s,s:s,s:I,s:I,s:i,s:I,s:I,s:i,s:i}", "rank", r, "host",
                                               s->ranks[r].host, "expert_folder", s->ranks[r].folder, "experts_held",
                                               (json_int_t)s->ranks[r].experts_held, "experts_shared",
                                               (json_int_t)s->ranks[r].experts_shared, "cache_slots",
                                               s->ranks[r].cache_slots, "cache_bytes",
                                               (json_int_t)s->ranks[r].cache_bytes, "spine_bytes",
                                               (json_int_t)s->ranks[r].spine_bytes, "spine_first_layer",
                                               s->ranks[r].spine_first, "spine_layers", s->ranks[r].spine_layers));
    json_object_set_new(o, "n_ranks", json_integer(s->n_ranks));
    json_object_set_new(o, "ranks", ranks);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}
