/* spec.c — draft sources and the cost model of speculative decoding (spec.h).
 *
 * The cost model compares emitted tokens per second. A pass that verifies k drafts, each accepted with
 * probability a (estimated per source from the accepted prefixes seen so far, with old evidence fading),
 * emits (1 - a^(k+1)) / (1 - a) tokens on average and costs t(k+1) (a pass of k+1 rows: the spine read once,
 * a larger union of experts, more compute), plus a rollback when some draft fails, plus the drafting itself.
 * Every one of those times is measured in this run; rows not measured yet are extrapolated from the ones
 * that were. When no choice beats a plain pass clearly, nothing is drafted, except for rare one-token probes
 * whose cost is held to a small fraction of the decoding time, so that acceptance keeps being measured when
 * the text turns repetitive. */
#include "spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

#define NGRAM_MAX_LEN 8           /* suffix lengths beyond this do not change the estimate */
#define SRC_MODEL SPEC_NGRAM_BUCKETS
#define N_SRC (SPEC_NGRAM_BUCKETS + 1)
#define ACCEPT_DECAY 0.95         /* weight of older observations, per observation of the same source */
#define TIME_EMA 0.25
#define GAIN_MIN 1.03             /* drafting must promise this much more tokens per second than a plain pass */
#define PROBE_SHARE 0.01          /* probes may cost at most this fraction of the decoding time */
#define PROBE_MIN_GAP 16          /* passes between probes, at least */
#define EXPLORE_EVERY 8           /* every this many chosen draft lengths, a neighbouring one is tried instead */
#define T_ROWS 257                /* pass times are kept for passes of up to T_ROWS - 1 rows */

typedef struct {
    double acc, rej;              /* decayed counts: drafts accepted, passes that ended in a rejection */
} accept_est;

struct spec {
    spec_opts o;
    df_engine *target;
    int vocab;
    int64_t max_ctx;
    /* draft model */
    df_engine *deng;
    int owns_deng;                /* 0: shared with the spec it was made like */
    df_session *ds;               /* holds the context the drafts were last made from */
    df_session *dw;               /* scratch: ds plus the drafts being made */
    int64_t dmax_ctx;
    float *dlogits;
    int32_t *ctx;
    int64_t ctx_cap;
    /* cost model */
    double t_rows[T_ROWS];        /* pass time by rows, all streams' (EMA); 0 = not measured */
    int shared;                   /* rows other streams add to the pass (spec_set_shared_rows) */
    double t_rollback, t_draft_tok;            /* per rollback, per token the draft model makes */
    int n_rollback, n_draft_tok;
    accept_est est[N_SRC];
    uint64_t since_probe;
    uint64_t n_chosen;            /* draft lengths the cost model chose (exploration schedule) */
    int last_src;                 /* source of the drafts of the pass being observed; -1 none */
    spec_stats st;
};

void spec_opts_default(spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->mode = SPEC_AUTO;
    o->draft_max = SPEC_DRAFT_MAX_DEFAULT;
}

static const char *const mode_names[] = {"off", "ngram", "draft", "auto"};

int spec_parse_mode(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, mode_names[i])) return i;
    return -1;
}

const char *spec_mode_name(spec_mode m) { return m >= SPEC_OFF && m <= SPEC_AUTO ? mode_names[m] : "?"; }

/* Until measured: longer suffix matches predict better; the draft model gets an even chance. */
static const accept_est accept_prior[N_SRC] = {{1, 3}, {1, 2}, {1, 1}, {2, 1}, {4, 1}, {1, 1}};

/* The draft model's sessions (its engine open): one holding the context, one for drafting ahead. */
static int draft_sessions_init(spec *sp, df_error *err) {
    int rc = df_session_init(&sp->ds, sp->deng, err);
    if (!rc) rc = df_session_init(&sp->dw, sp->deng, err);
    if (rc) return rc;
    sp->dmax_ctx = df_engine_info(sp->deng)->max_context;
    sp->dlogits = xmalloc((size_t)sp->vocab * sizeof(float));
    return DF_OK;
}

uint64_t spec_state_bytes(const spec *sp, int64_t n_tokens) {
    if (!sp || !sp->deng) return 0;
    return 2 * df_session_state_bytes(sp->deng, n_tokens, DF_ROLLBACK_ROWS_DEFAULT) +
           (uint64_t)sp->vocab * sizeof(float);
}

int spec_init(spec **out, const spec_opts *o, df_engine *target, df_error *err) {
    *out = NULL;
    if (o->mode == SPEC_DRAFT && !o->draft_dir) {
        df_error_set(err, DF_EINVAL, "--spec draft needs a draft model (--draft DIR)");
        return DF_EINVAL;
    }
    if (o->draft_max < 0 || o->draft_max > SPEC_DRAFT_MAX_LIMIT) {
        df_error_set(err, DF_EINVAL, "--draft-max must lie in 1..%d", SPEC_DRAFT_MAX_LIMIT);
        return DF_EINVAL;
    }
    spec *sp = xcalloc(1, sizeof *sp);
    sp->o = *o;
    if (!sp->o.draft_max) sp->o.draft_max = SPEC_DRAFT_MAX_DEFAULT;
    sp->target = target;
    sp->vocab = df_engine_info(target)->vocab_size;
    sp->max_ctx = df_engine_info(target)->max_context;
    sp->last_src = -1;
    memcpy(sp->est, accept_prior, sizeof accept_prior);
    if (o->draft_dir && o->mode != SPEC_OFF && o->mode != SPEC_NGRAM) {
        df_engine_opts eo;
        df_engine_opts_default(&eo);
        eo.model_dir = o->draft_dir;
        eo.n_threads = o->n_threads;
        int rc = df_engine_open(&sp->deng, &eo, err);
        sp->owns_deng = !rc;
        if (!rc && df_engine_info(sp->deng)->vocab_size != sp->vocab) {
            df_error_set(err, DF_EINVAL, "draft model %s: vocabulary of %d tokens, the model has %d", o->draft_dir,
                         df_engine_info(sp->deng)->vocab_size, sp->vocab);
            rc = DF_EINVAL;
        }
        if (!rc) rc = draft_sessions_init(sp, err);
        if (rc) {
            spec_free(sp);
            return rc;
        }
    }
    *out = sp;
    return DF_OK;
}

int spec_init_like(spec **out, const spec *base, df_error *err) {
    *out = NULL;
    spec *sp = xcalloc(1, sizeof *sp);
    sp->o = base->o;
    sp->target = base->target;
    sp->vocab = base->vocab;
    sp->max_ctx = base->max_ctx;
    sp->last_src = -1;
    memcpy(sp->est, accept_prior, sizeof accept_prior);
    sp->deng = base->deng;
    int rc = sp->deng ? draft_sessions_init(sp, err) : DF_OK;
    if (rc) {
        spec_free(sp);
        return rc;
    }
    *out = sp;
    return DF_OK;
}

void spec_free(spec *sp) {
    if (!sp) return;
    df_session_free(sp->dw);
    df_session_free(sp->ds);
    if (sp->owns_deng) df_engine_free(sp->deng);
    free(sp->dlogits);
    free(sp->ctx);
    free(sp);
}

spec_mode spec_get_mode(const spec *sp) { return sp->o.mode; }
int spec_draft_max(const spec *sp) { return sp->o.draft_max; }
void spec_get_stats(const spec *sp, spec_stats *out) { *out = sp->st; }
void spec_set_shared_rows(spec *sp, int rows) { sp->shared = DF_MAX(rows, 0); }

int spec_ngram_match(const int32_t *t, int n, int max_len, int *len) {
    int best = 0, at = 0;
    for (int e = n - 2; e >= 0 && best < max_len; e--) {   /* latest first: ties keep the most recent */
        if (t[e] != t[n - 1]) continue;
        int l = 1;
        while (l < max_len && e - l >= 0 && t[e - l] == t[n - 1 - l]) l++;
        if (l > best) {
            best = l;
            at = e + 1;
        }
    }
    *len = best;
    return at;
}

static int ngram_bucket(int len) { return len >= 8 ? 4 : len >= 4 ? 3 : len - 1; }

static double est_rate(const accept_est *e) { return e->acc / (e->acc + e->rej); }

/* Pass time with r rows: measured, else from the nearest measured row count below r (above it when none
 * is) plus the mean slope of the other measured counts from there (a quarter of a pass per row until some
 * are measured); 0 when nothing was measured yet. */
static double pass_time(const spec *sp, int r) {
    if (r < T_ROWS && sp->t_rows[r] > 0) return sp->t_rows[r];
    int b = 0;
    for (int i = DF_MIN(r, T_ROWS - 1); i >= 1 && !b; i--)
        if (sp->t_rows[i] > 0) b = i;
    for (int i = r + 1; i < T_ROWS && !b; i++)
        if (sp->t_rows[i] > 0) b = i;
    if (!b) return 0;
    double tb = sp->t_rows[b], slope = 0;
    int n = 0;
    for (int i = 1; i < T_ROWS; i++)
        if (i != b && sp->t_rows[i] > 0) {
            slope += (sp->t_rows[i] - tb) / (i - b);
            n++;
        }
    slope = n ? DF_MAX(slope / n, 0.0) : 0.25 * tb / b;
    double t = tb + slope * (r - b);
    return r < b ? DF_MAX(t, tb * r / b) : t;
}

/* Until a rollback was measured it is assumed free: within the session's rollback record it reads no weights,
 * and the first one measured corrects the guess. */
static double rollback_time(const spec *sp) { return sp->n_rollback ? sp->t_rollback : 0; }

/* The best number of drafts (up to kmax) from a source, and the tokens per second it promises. The pass
 * also carries the shared rows of other streams, one token each, whose pace counts as much as this one's. */
static int best_k(const spec *sp, int src, int kmax, double *rate) {
    double a = est_rate(&sp->est[src]), draft = src == SRC_MODEL ? sp->t_draft_tok : 0;
    int best = 0, b = sp->shared;
    *rate = (b + 1) / pass_time(sp, b + 1);
    double ak = 1;
    for (int k = 1; k <= kmax; k++) {
        ak *= a;
        double tokens = b + (a < 1 ? (1 - ak * a) / (1 - a) : k + 1);
        double cost = pass_time(sp, b + k + 1) + (1 - ak) * rollback_time(sp) + k * draft;
        if (tokens / cost > *rate * (best ? 1 : GAIN_MIN)) {
            *rate = tokens / cost;
            best = k;
        }
    }
    return best;
}

/* Pass times are measured only for the row counts chosen, so a count measured once on a slow pass would keep
 * its length from ever being chosen again. Every EXPLORE_EVERY choices, the length next to the chosen k
 * (alternately one longer and one shorter, a plain pass included) is taken instead: at most one row more or
 * one draft less in one pass of EXPLORE_EVERY. */
static int explore_k(spec *sp, int k, int kmax) {
    if (++sp->n_chosen % EXPLORE_EVERY) return k;
    return (sp->n_chosen / EXPLORE_EVERY) & 1 ? DF_MIN(k + 1, kmax) : k - 1;
}

/* Whether a one-token probe of src is due: its expected extra cost over a plain pass, spread over the passes
 * since the last probe, stays under PROBE_SHARE of the time. */
static int probe_due(const spec *sp, int src) {
    double t1 = pass_time(sp, sp->shared + 1), a = est_rate(&sp->est[src]);
    double extra = pass_time(sp, sp->shared + 2) - t1 + (1 - a) * rollback_time(sp) +
                   (src == SRC_MODEL ? sp->t_draft_tok : 0);
    double gap = extra > 0 ? extra / (PROBE_SHARE * t1) : 0;
    return (double)sp->since_probe >= DF_MAX(gap, (double)PROBE_MIN_GAP);
}

static int32_t argmax(const float *v, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Greedy drafts from the draft model for ctx[0..n). */
static int model_draft(spec *sp, const int32_t *ctx, int64_t n, int k, int32_t *drafts, df_error *err) {
    if (n + k > sp->dmax_ctx) k = (int)(sp->dmax_ctx - n);
    if (k <= 0) return 0;
    int rc = df_session_sync(sp->ds, ctx, n, sp->dlogits, NULL, err);
    if (rc) return rc;
    double t0 = df_now();
    drafts[0] = argmax(sp->dlogits, sp->vocab);
    if (k > 1) rc = df_session_copy(sp->dw, sp->ds, err);
    for (int i = 1; !rc && i < k; i++) {
        rc = df_session_eval(sp->dw, &drafts[i - 1], 1, sp->dlogits, 0, err);
        if (!rc) drafts[i] = argmax(sp->dlogits, sp->vocab);
    }
    if (rc) return rc;
    double per = (df_now() - t0) / k;
    sp->t_draft_tok = sp->n_draft_tok++ ? sp->t_draft_tok + TIME_EMA * (per - sp->t_draft_tok) : per;
    sp->st.draft_s += per * k;
    return k;
}

int spec_propose(spec *sp, df_session *target, int32_t next, int limit, int32_t *drafts, df_error *err) {
    sp->last_src = -1;
    if (sp->o.mode == SPEC_OFF) return 0;
    int64_t n;
    const int32_t *hist = df_session_tokens(target, &n);
    int kmax = DF_MIN(limit, sp->o.draft_max);
    if (sp->max_ctx - (n + 1) < kmax) kmax = (int)(sp->max_ctx - (n + 1));
    if (kmax <= 0 || n + 1 > INT32_MAX) return 0;
    if (n + 1 > sp->ctx_cap) {
        sp->ctx_cap = 2 * (n + 1);
        sp->ctx = xrealloc(sp->ctx, (size_t)sp->ctx_cap * sizeof(int32_t));
    }
    memcpy(sp->ctx, hist, (size_t)n * sizeof(int32_t));
    sp->ctx[n++] = next;
    int len, at = spec_ngram_match(sp->ctx, (int)n, NGRAM_MAX_LEN, &len);
    int avail = len ? (int)DF_MIN((int64_t)kmax, n - at) : 0;
    int src = -1, k = 0;
    if (sp->o.mode == SPEC_NGRAM) {
        if (len >= 2) src = ngram_bucket(len), k = avail;
    } else if (sp->o.mode == SPEC_DRAFT) {
        src = SRC_MODEL, k = kmax;
    } else {   /* auto: the better of the n-gram proposal and the draft model, if either pays */
        double rn = 0, rm = 0;
        int kn = 0, km = 0, bn = len ? ngram_bucket(len) : -1;
        if (len) kn = best_k(sp, bn, avail, &rn);
        if (sp->deng) km = best_k(sp, SRC_MODEL, kmax, &rm);
        if (kn && (!km || rn >= rm)) src = bn, k = explore_k(sp, kn, avail);
        else if (km) src = SRC_MODEL, k = explore_k(sp, km, kmax);
        else if (pass_time(sp, 1) > 0 && (len || sp->deng)) {
            int ps = bn >= 0 ? bn : SRC_MODEL;   /* probe the source more likely to be accepted */
            if (bn >= 0 && sp->deng && est_rate(&sp->est[SRC_MODEL]) > est_rate(&sp->est[bn])) ps = SRC_MODEL;
            if (probe_due(sp, ps)) {
                src = ps, k = 1;
                sp->st.probes++;
            }
        }
        sp->since_probe++;
        if (k) sp->since_probe = 0;
    }
    if (!k) return 0;
    if (src == SRC_MODEL) {
        k = model_draft(sp, sp->ctx, n, k, drafts, err);
        if (k <= 0) return k;
    } else {
        memcpy(drafts, sp->ctx + at, (size_t)k * sizeof(int32_t));
    }
    sp->last_src = src;
    return k;
}

void spec_observe(spec *sp, int rows, int accepted, double eval_s, double rollback_s) {
    DF_ASSERT(rows >= 1 && rows <= SPEC_DRAFT_MAX_LIMIT + 1);
    sp->st.passes++;
    int all = rows + sp->shared;
    if (eval_s >= 0) {
        sp->st.pass_s += eval_s;
        if (all < T_ROWS) {
            double *t = &sp->t_rows[all];
            *t = *t > 0 ? *t + TIME_EMA * (eval_s - *t) : eval_s;
        }
    }
    if (rollback_s >= 0) {
        sp->st.rollbacks++;
        sp->st.rollback_s += rollback_s;
        sp->t_rollback = sp->n_rollback++ ? sp->t_rollback + TIME_EMA * (rollback_s - sp->t_rollback) : rollback_s;
    }
    if (rows == 1 || sp->last_src < 0) return;
    int k = rows - 1;
    sp->st.spec_passes++;
    sp->st.drafted += (uint64_t)k;
    sp->st.accepted += (uint64_t)accepted;
    accept_est *e = &sp->est[sp->last_src];
    e->acc = e->acc * ACCEPT_DECAY + accepted;
    e->rej = e->rej * ACCEPT_DECAY + (accepted < k);
    sp->last_src = -1;
}
