/* generate.c — the shared decode loop (generate.h). The last sampled token is not evaluated: nobody needs
 * its logits, and the caller learns from n_evaluated exactly which tokens the session has consumed.
 *
 * With speculation a pass evaluates the sampled token and the drafts behind it, and each row is sampled
 * exactly as without speculation; a draft is kept while it equals what was sampled. For a draft x (a
 * one-hot proposal) that is the standard rejection rule: x is accepted with probability p(x), and on
 * rejection the token drawn is distributed as p without x, renormalised. Because every emitted token
 * takes one draw of the sampler's generator in the same order as without speculation, a seed gives the
 * same tokens whether and however much was drafted (greedy: the argmax, as always). */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/spec.h"

typedef struct gen_text {
    chat_splitter *split;
    utf8_stream u8;
    stop_matcher stop;
    chat_text rs, ct;
    text_buf out;
} gen_text;

struct gen_state {
    gen_config cfg;
    sampler smp;
    gen_text g;
    int n_vocab;
    char error[200];
};

/* Samples from logits under the configured constraint, if any; budget: tokens that may still be generated.
 * -1 (st->error says why) when the model's logits are not finite or the constraint allows nothing: ending
 * the message there would pass a broken answer off as a finished one. */
static int32_t gen_sample(gen_state *st, float *logits, int budget, sample_result *sr) {
    const gen_config *cfg = &st->cfg;
    if (sampler_check_logits(&st->smp, logits)) {   /* before the mask, which would hide some of them */
        snprintf(st->error, sizeof st->error, "%s", sampler_error(&st->smp));
        return -1;
    }
    if (cfg->mask && !cfg->mask(cfg->mask_ctx, logits, st->n_vocab, budget)) {
        snprintf(st->error, sizeof st->error, "the output constraint allows no token after %d generated",
                 cfg->max_tokens - budget);
        return -1;
    }
    int32_t id = sampler_sample(&st->smp, logits, sr);
    if (id < 0) snprintf(st->error, sizeof st->error, "%s", sampler_error(&st->smp));
    return id;
}

const char *gen_state_error(const gen_state *s) { return s->error; }

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

/* What one emitted token leads to. */
enum { EMIT_MORE = 0, EMIT_FINAL, EMIT_CANCELLED };

/* Records id, decodes its text, matches stop strings and reports it to the callback. */
static int gen_emit(gen_state *st, int32_t id, const sample_result *sr, gen_result *res, gen_event_fn cb,
                    void *ctx) {
    gen_text *g = &st->g;
    const gen_config *cfg = &st->cfg;
    if (cfg->mask_accept) cfg->mask_accept(cfg->mask_ctx, id);
    sampler_accept(&st->smp, id);
    tok_ids_push(&res->ids, id);
    g->rs.len = g->ct.len = 0;
    text_buf_clear(&g->out);
    int ended = id == cfg->eos_id || gen_text_feed(g, cfg, id);
    int at_limit = !ended && (int)res->ids.n >= cfg->max_tokens;
    if (ended || at_limit) gen_text_finish(g, cfg);
    gen_event ev = {.id = id, .sample = sr, .passes = res->passes, .drafted = res->drafted,
                    .accepted = res->accepted};
    if (stop_feed(&g->stop, g->ct.p, g->ct.len, &g->out)) {
        ev.final = 1;
        ev.finish = GEN_FINISH_STOP;
        ev.stop = g->stop.hit;
    } else if (ended || at_limit) {
        stop_flush(&g->stop, &g->out);
        ev.final = 1;
        ev.finish = ended ? GEN_FINISH_STOP : GEN_FINISH_LENGTH;
    }
    ev.content = g->out.p ? g->out.p : "";
    ev.content_len = g->out.len;
    ev.reasoning = g->rs.p ? g->rs.p : "";
    ev.reasoning_len = g->rs.len;
    res->finish = ev.finish;
    if (cb && cb(ctx, &ev) && !ev.final) {
        res->finish = GEN_FINISH_CANCELLED;
        return EMIT_CANCELLED;
    }
    return ev.final ? EMIT_FINAL : EMIT_MORE;
}

gen_state *gen_state_new(const gen_config *cfg, int n_vocab) {
    DF_ASSERT(cfg->max_tokens > 0 && n_vocab > 0);
    gen_state *s = xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    sampler_init(&s->smp, &cfg->sp, n_vocab);
    s->n_vocab = n_vocab;
    if (cfg->chat && cfg->tok) s->g.split = chat_splitter_new(cfg->tok, cfg->fmt, cfg->in_reasoning);
    utf8_stream_init(&s->g.u8);
    stop_init(&s->g.stop, cfg->stop, cfg->n_stop);
    return s;
}

void gen_state_free(gen_state *s) {
    if (!s) return;
    if (s->g.split) chat_splitter_free(s->g.split);
    chat_text_free(&s->g.rs);
    chat_text_free(&s->g.ct);
    text_buf_free(&s->g.out);
    stop_free(&s->g.stop);
    sampler_free(&s->smp);
    free(s);
}

int gen_step(gen_state *s, float *logits, gen_event_fn cb, void *ctx, int32_t *next, gen_result *res) {
    double t0 = df_now();
    sample_result sr;
    int32_t id = gen_sample(s, logits, s->cfg.max_tokens - (int)res->ids.n, &sr);
    if (id < 0) {
        res->finish = GEN_FINISH_ERROR;
        res->decode_s += df_now() - t0;
        return 1;
    }
    int e = gen_emit(s, id, &sr, res, cb, ctx);
    *next = id;
    res->decode_s += df_now() - t0;
    return e != EMIT_MORE;
}

int gen_step_rows(gen_state *s, float *rows, const int32_t *drafts, int k, gen_event_fn cb, void *ctx, int32_t *next,
                  int *keep, int *accepted, gen_result *res) {
    double t0 = df_now();
    int n_vocab = s->n_vocab, e = EMIT_MORE, j = 0;
    sample_result sr;
    res->passes++;
    res->drafted += k;   /* counted before the drafts are emitted, so each event reports them */
    for (;; j++) {
        int32_t t = gen_sample(s, rows + (size_t)j * n_vocab, s->cfg.max_tokens - (int)res->ids.n, &sr);
        if (t < 0) {   /* rows before j were emitted as usual */
            res->finish = GEN_FINISH_ERROR;
            e = EMIT_FINAL;
            *accepted = j;
            break;
        }
        int is_draft = j < k && t == drafts[j];
        res->accepted += is_draft;
        e = gen_emit(s, t, &sr, res, cb, ctx);
        *next = t;
        if (e || !is_draft) {
            *accepted = j + is_draft;
            break;
        }
    }
    /* the session keeps the first row's token and the drafts accepted before row j; the token sampled last
     * (even a draft that ended the generation) is never kept: nobody needs its logits */
    *keep = j + 1;
    res->n_evaluated += *keep;
    res->decode_s += df_now() - t0;
    return e != EMIT_MORE;
}

int gen_run(df_session *s, const gen_config *cfg, float *logits, int n_vocab, gen_event_fn cb, void *ctx,
            gen_result *res, df_error *err) {
    memset(res, 0, sizeof *res);
    gen_state *st = gen_state_new(cfg, n_vocab);
    int kmax = cfg->spec ? spec_draft_max(cfg->spec) : 0;
    float *rows = kmax ? xmalloc((size_t)(kmax + 1) * n_vocab * sizeof(float)) : NULL;
    int32_t in[SPEC_DRAFT_MAX_LIMIT + 1];
    double t0 = df_now();
    int rc = DF_OK;
    int e = gen_step(st, logits, cb, ctx, &in[0], res);
    while (!e) {
        int k = 0;
        if (cfg->spec) {
            k = spec_propose(cfg->spec, s, in[0], cfg->max_tokens - (int)res->ids.n, in + 1, err);
            if (k < 0) {
                rc = k;
                break;
            }
        }
        int64_t pos0 = df_session_pos(s);
        double te = df_now();
        rc = df_session_eval(s, in, k + 1, k ? rows : logits, k > 0, err);
        if (rc) break;
        te = df_now() - te;
        int keep, accepted;
        e = gen_step_rows(st, k ? rows : logits, in + 1, k, cb, ctx, &in[0], &keep, &accepted, res);
        double rollback = -1;
        if (keep < k + 1) {   /* back to the kept tokens */
            double tr = df_now();
            rc = df_session_truncate(s, pos0 + keep, err);
            rollback = df_now() - tr;
        }
        if (cfg->spec) spec_observe(cfg->spec, k + 1, accepted, te, rollback);
        if (rc) break;
    }
    if (!rc && res->finish == GEN_FINISH_ERROR) {
        df_error_set(err, DF_EINVAL, "generation failed: %s", st->error);
        rc = DF_EINVAL;
    }
    if (!rc && res->finish == GEN_FINISH_CANCELLED) {
        df_error_set(err, DF_ECANCELLED, "generation cancelled");
        rc = DF_ECANCELLED;
    }
    if (rc == DF_ECANCELLED) res->finish = GEN_FINISH_CANCELLED;
    res->decode_s = df_now() - t0;
    free(rows);
    gen_state_free(st);
    return rc;
}
