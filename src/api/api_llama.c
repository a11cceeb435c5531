/* api_llama.c — llama.cpp's native POST /completion, as llama-server answers it (Continue's "llama.cpp"
 * provider, llama.cpp's own tools): a prompt string or token ids, n_predict, and either one JSON answer or SSE
 * `data:` events whose "content" carries each piece, the last with "stop":true and the counts and timings
 * (no [DONE], as llama-server). Keepalives are the SSE comments telling the prompt's progress. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "api/api.h"

typedef struct llama_ctx {
    double t0;
} llama_ctx;

static void llama_ctx_free(void *p) { free(p); }

static const srv_wire llama_wire;

static int refuse(srv_err *err, const char *param, const char *msg) {
    srv_err_set(err, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return -1;
}

int api_llama_translate(srv *s, json_t *root, api_call *out, srv_err *err) {
    (void)s;
    out->wire = &llama_wire;
    if (!json_is_object(root)) {
        if (root) refuse(err, NULL, "The request body must be a JSON object.");
        return -1;
    }
    json_t *o = json_object();
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (rc) break;
        if (json_is_null(v)) continue;
        if (!strcmp(key, "prompt") || !strcmp(key, "stream") || !strcmp(key, "temperature") || !strcmp(key, "top_k") ||
            !strcmp(key, "top_p") || !strcmp(key, "min_p") || !strcmp(key, "seed") || !strcmp(key, "stop") ||
            !strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty") || !strcmp(key, "model")) {
            /* llama-server's seed -1 is "random", as no seed here */
            if (!strcmp(key, "seed") && json_is_integer(v) && json_integer_value(v) == -1) continue;
            json_object_set(o, key, v);
        } else if (!strcmp(key, "n_predict") || !strcmp(key, "max_tokens")) {
            if (!json_is_integer(v)) rc = refuse(err, key, "'n_predict' must be an integer.");
            else if (json_integer_value(v) == -1) continue;   /* until the end: the server's cap */
            else if (json_integer_value(v) < 1) rc = refuse(err, key, "'n_predict' must be -1 or at least 1.");
            else json_object_set(o, "max_tokens", v);
        } else if (!strcmp(key, "cache_prompt") || !strcmp(key, "id_slot")) {
            continue;   /* prompts are always reused from a slot that holds them */
        } else {
            api_note_ignored(&out->ignored, key);   /* n_probs, samplers, mirostat, grammar, ... */
        }
    }
    if (!rc && !json_object_get(root, "prompt")) rc = refuse(err, "prompt", "Missing required parameter: 'prompt'.");
    if (rc) {
        json_decref(o);
        return -1;
    }
    llama_ctx *ctx = xcalloc(1, sizeof *ctx);
    ctx->t0 = df_now();
    out->wire_ctx = ctx;
    out->ep = SRV_EP_COMPLETIONS;
    out->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return 0;
}

/* The last event / the whole answer: counts, timings and why it stopped, as llama-server reports them. */
static json_t *final_json(const srv *s, const srv_job *j, int with_content) {
    const srv_choice *ch = &j->choices[0];
    double end = j->t_done > 0 ? j->t_done : df_now();
    double prompt_ms = j->t_first > 0 ? (j->t_first - j->t_queued) * 1e3 : 0;
    double gen_ms = j->t_first > 0 ? (end - j->t_first) * 1e3 : 0;
    int n_prompt = (int)j->prompt.n - j->n_reused;
    json_t *timings = json_pack("{s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f}", "prompt_n", n_prompt, "prompt_ms", prompt_ms,
                                "prompt_per_token_ms", n_prompt ? prompt_ms / n_prompt : 0.0, "prompt_per_second",
                                prompt_ms > 0 ? n_prompt * 1e3 / prompt_ms : 0.0, "predicted_n", ch->n_gen,
                                "predicted_ms", gen_ms, "predicted_per_token_ms", ch->n_gen ? gen_ms / ch->n_gen : 0.0,
                                "predicted_per_second", gen_ms > 0 ? ch->n_gen * 1e3 / gen_ms : 0.0);
    int length = ch->finish == GEN_FINISH_LENGTH;
    json_t *o = json_pack("{s:i,s:o,s:[],s:i,s:b,s:s,s:i,s:i,s:i,s:b,s:s,s:s,s:o,s:{s:i,s:I}}", "index", 0,
                          "content",
                          respond_lossy_string((const uint8_t *)(ch->content.p ? ch->content.p : ""),
                                               with_content ? ch->content.len : 0),
                          "tokens", "id_slot", -1, "stop", 1, "model", j->model_name ? j->model_name : srv_model_id(s),
                          "tokens_predicted", ch->n_gen, "tokens_evaluated", (int)j->prompt.n, "tokens_cached",
                          j->n_reused, "truncated", 0, "stop_type", length ? "limit" : "eos", "stopping_word", "",
                          "timings", timings, "generation_settings", "n_predict", j->max_tokens, "n_ctx",
                          (json_int_t)s->info->max_context);
    DF_ASSERT(o);
    return o;
}

static void sse_put(json_t *o, text_buf *out) {
    char *t = json_dumps(o, JSON_COMPACT);
    DF_ASSERT(t);
    text_buf_printf(out, "data: %s\n\n", t);
    free(t);
    json_decref(o);
}

static void llama_start(const srv *s, srv_job *j, text_buf *out) {
    (void)s;
    (void)j;
    text_buf_puts(out, ": keep-alive queued\n\n");   /* the stream is open before the request waits */
}

static void llama_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out) {
    (void)s;
    if (!out) return;   /* not streamed: the final answer is the job's text */
    if (!ev->content_len) return;
    json_t *c = json_stringn(ev->content, ev->content_len);
    if (!c) c = respond_lossy_string((const uint8_t *)ev->content, ev->content_len);
    sse_put(json_pack("{s:i,s:o,s:[],s:b,s:i,s:i,s:i}", "index", 0, "content", c, "tokens", "stop", 0, "id_slot", -1,
                      "tokens_predicted", j->choices[0].n_gen, "tokens_evaluated", (int)j->prompt.n),
            out);
}

static void llama_end(const srv *s, srv_job *j, text_buf *out) { sse_put(final_json(s, j, 0), out); }

static void llama_error(const srv_err *e, text_buf *out) { srv_err_json(e, out); }

static void llama_fail(const srv *s, srv_job *j, const srv_err *e, text_buf *out) {
    (void)s;
    (void)j;
    text_buf b = {0};
    srv_err_json(e, &b);
    text_buf_printf(out, "data: %s\n\n", b.p);
    text_buf_free(&b);
}

static char *llama_final(const srv *s, srv_job *j) {
    json_t *o = final_json(s, j, 1);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    DF_ASSERT(t);
    return t;
}

static const srv_wire llama_wire = {
    .stream_type = "text/event-stream",
    .start = llama_start,
    .event = llama_event,
    .end = llama_end,
    .fail = llama_fail,
    .error = llama_error,   /* keepalives: the SSE progress comments every stream has */
    .final_json = llama_final,
    .free_ctx = llama_ctx_free,
};
