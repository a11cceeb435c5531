/* generate.c — the shared decode loop (generate.h). The last sampled token is not evaluated: nobody needs
 * its logits, and the caller learns from n_evaluated exactly which tokens the session has consumed. */
#include "generate.h"

#include <string.h>
#include "common/util.h"

typedef struct gen_text {
    chat_splitter *split;
    utf8_stream u8;
    stop_matcher stop;
    chat_text rs, ct;
    text_buf out;
} gen_text;

/* Decodes one id into rs (reasoning) / ct (answer); returns 1 at the end of the chat message. */
static int gen_text_feed(gen_text *g, const gen_config *cfg, int32_t id) {
    if (!cfg->tok) return 0;
    if (g->split && cfg->tools && chat_tool_parser_feed(cfg->tools, id)) return 0;
    if (g->split) return chat_splitter_feed(g->split, id, &g->rs, &g->ct);
    size_t n = 0;
    const uint8_t *b = tokenizer_token_bytes(cfg->tok, id, &n);
    if (b) utf8_stream_feed(&g->u8, b, n, &g->ct.p, &g->ct.len, &g->ct.cap);
    return 0;
}

static void gen_text_finish(gen_text *g, const gen_config *cfg) {
    if (!cfg->tok) return;
    if (g->split) chat_splitter_finish(g->split, &g->rs, &g->ct);
    else utf8_stream_flush(&g->u8, &g->ct.p, &g->ct.len, &g->ct.cap);
}

int gen_run(df_session *s, const gen_config *cfg, float *logits, int n_vocab, gen_event_fn cb, void *ctx,
            gen_result *res, df_error *err) {
    memset(res, 0, sizeof *res);
    DF_ASSERT(cfg->max_tokens > 0 && n_vocab > 0);
    sampler smp;
    sampler_init(&smp, &cfg->sp, n_vocab);
    gen_text g;
    memset(&g, 0, sizeof g);
    if (cfg->chat && cfg->tok) g.split = chat_splitter_new(cfg->tok, cfg->fmt, cfg->in_reasoning);
    utf8_stream_init(&g.u8);
    stop_init(&g.stop, cfg->stop, cfg->n_stop);
    double t0 = df_now();
    int rc = DF_OK;
    for (int i = 0;; i++) {
        sample_result sr;
        /* nothing allowed only happens with a broken constraint: ending the message is the safe way out */
        if (cfg->mask && !cfg->mask(cfg->mask_ctx, logits, n_vocab, cfg->max_tokens - i) && cfg->eos_id >= 0 &&
            cfg->eos_id < n_vocab)
            logits[cfg->eos_id] = 0;
        int32_t id = sampler_sample(&smp, logits, &sr);
        if (cfg->mask_accept) cfg->mask_accept(cfg->mask_ctx, id);
        sampler_accept(&smp, id);
        tok_ids_push(&res->ids, id);
        g.rs.len = g.ct.len = 0;
        text_buf_clear(&g.out);
        int ended = id == cfg->eos_id || gen_text_feed(&g, cfg, id);
        int at_limit = !ended && i + 1 >= cfg->max_tokens;
        if (ended || at_limit) gen_text_finish(&g, cfg);
        gen_event ev = {.id = id, .sample = &sr};
        if (stop_feed(&g.stop, g.ct.p, g.ct.len, &g.out)) {
            ev.final = 1;
            ev.finish = GEN_FINISH_STOP;
        } else if (ended || at_limit) {
            stop_flush(&g.stop, &g.out);
            ev.final = 1;
            ev.finish = ended ? GEN_FINISH_STOP : GEN_FINISH_LENGTH;
        }
        ev.content = g.out.p ? g.out.p : "";
        ev.content_len = g.out.len;
        ev.reasoning = g.rs.p ? g.rs.p : "";
        ev.reasoning_len = g.rs.len;
        res->finish = ev.finish;
        if (cb && cb(ctx, &ev) && !ev.final) {
            res->finish = GEN_FINISH_CANCELLED;
            df_error_set(err, DF_ECANCELLED, "generation cancelled");
            rc = DF_ECANCELLED;
            break;
        }
        if (ev.final) break;
        rc = df_session_eval(s, &id, 1, logits, 0, err);
        if (rc) {
            if (rc == DF_ECANCELLED) res->finish = GEN_FINISH_CANCELLED;
            break;
        }
        res->n_evaluated++;
    }
    res->decode_s = df_now() - t0;
    if (g.split) chat_splitter_free(g.split);
    chat_text_free(&g.rs);
    chat_text_free(&g.ct);
    text_buf_free(&g.out);
    stop_free(&g.stop);
    sampler_free(&smp);
    return rc;
}
