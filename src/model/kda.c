/* kda.c — Kimi Delta Attention: projections, causal short conv with rolling state, decay gate
 * (softplus form, or K3's lower-bounded sigmoid form), beta, L2-normalised q/k, the gated delta rule in
 * fp32 token by token, gated RMSNorm and the output projection. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

typedef struct {
    int H, D, W;         /* heads, head dim (K = V = D), conv width */
    int64_t P;           /* H * D */
} kda_dims;

/* Causal depthwise conv + SiLU over one [T, P] projection, with history hist [W-1, 3P] (column block
 * `part` of 3). Conv weight w is [P, 1, W]; w[c, W-1] multiplies the current token. */
static void kda_conv(const kda_dims *k, const float *w, const float *hist, int part, const float *x, int T,
                     float *y) {
    int W = k->W;
    int64_t P = k->P, P3 = 3 * P;
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < P; c++) {
            float acc = 0.0f;
            for (int j = 0; j < W; j++) {
                int src = t - (W - 1) + j;    /* input position relative to this batch */
                float v = src >= 0 ? x[(int64_t)src * P + c] : hist[(int64_t)(W - 1 + src) * P3 + part * P + c];
                acc += w[c * W + j] * v;
            }
            y[(int64_t)t * P + c] = kern_silu(acc);
        }
}

/* Keeps the last W-1 pre-conv inputs of [q|k|v] for the next call: with T < W-1 the history moves up by T
 * rows (row r takes row r + T) before the batch's rows fill the end. */
static void kda_conv_state_update(const kda_dims *k, float *hist, const float *const xs[3], int T) {
    int keep = k->W - 1, from_hist = keep - T;
    int64_t P = k->P, P3 = 3 * P;
    if (keep <= 0) return;
    if (from_hist > 0) memmove(hist, hist + (int64_t)T * P3, (size_t)from_hist * P3 * sizeof(float));
    for (int r = from_hist > 0 ? from_hist : 0; r < keep; r++) {
        int src = T - keep + r;           /* position relative to this batch */
        for (int part = 0; part < 3; part++)
            memcpy(hist + (int64_t)r * P3 + part * P, xs[part] + (int64_t)src * P, P * sizeof(float));
    }
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* g[t, h, j] (log decay, <= 0) from the projected forget input f (already + dt_bias). */
static void kda_gate(const df_config *c, const kda_dims *k, const float *alog, int per_channel, float *f, int T) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < k->H; h++)
            for (int j = 0; j < k->D; j++) {
                float *g = &f[(int64_t)t * k->P + (int64_t)h * k->D + j];
                float A = expf(per_channel ? alog[j] : alog[h]);
                *g = c->has_lower_bound ? c->lower_bound * kern_sigmoid(A * *g) : -A * softplus(*g);
            }
}

static void l2norm_heads(float *x, int T, const kda_dims *k, float scale) {
    for (int64_t i = 0; i < (int64_t)T * k->H; i++) {
        float *v = x + i * k->D;
        float ss = 0.0f;
        for (int j = 0; j < k->D; j++) ss += v[j] * v[j];
        float inv = scale / sqrtf(ss + 1e-6f);
        for (int j = 0; j < k->D; j++) v[j] *= inv;
    }
}

/* The gated delta rule for one head over T tokens; writes o[t] (stride P) unless o is NULL. m: D floats of
 * scratch. */
static void kda_recur_head(const kda_dims *k, float *S, int h, const float *q, const float *kk, const float *v,
                           const float *g, const float *beta, int T, float *o, float *m) {
    int D = k->D;
    for (int t = 0; t < T; t++) {
        int64_t off = (int64_t)t * k->P + (int64_t)h * D;
        const float *kt = kk + off, *vt = v + off, *gt = g + off;
        for (int j = 0; j < D; j++) {
            float e = expf(gt[j]);
            for (int c = 0; c < D; c++) S[j * D + c] *= e;
        }
        memset(m, 0, D * sizeof(float));
        for (int j = 0; j < D; j++)
            for (int c = 0; c < D; c++) m[c] += S[j * D + c] * kt[j];
        float b = beta[(int64_t)t * k->H + h];
        for (int c = 0; c < D; c++) m[c] = b * (vt[c] - m[c]);     /* m becomes u */
        for (int j = 0; j < D; j++)
            for (int c = 0; c < D; c++) S[j * D + c] += kt[j] * m[c];
        if (!o) continue;                                          /* a replay wants the state only */
        const float *qt = q + off;
        float *ot = o + off;
        for (int c = 0; c < D; c++) ot[c] = 0.0f;
        for (int j = 0; j < D; j++)
            for (int c = 0; c < D; c++) ot[c] += S[j * D + c] * qt[j];
    }
}

typedef struct {
    const kda_dims *k;
    float *S;
    const float *q, *kk, *v, *g, *beta;
    int T;
    float *o;
    float *m;            /* D floats per pool thread */
} kda_recur_job;

/* Heads (and sessions) are independent: one pool task per (job, head). */
static void kda_recur_task(void *ctx, int task, int thread) {
    kda_recur_job *jobs = ctx, *j = &jobs[task / jobs->k->H];
    int h = task % j->k->H;
    kda_recur_head(j->k, j->S + (int64_t)h * j->k->D * j->k->D, h, j->q, j->kk, j->v, j->g, j->beta, j->T, j->o,
                   j->m + (int64_t)thread * j->k->D);
}

/* ---- rollback record ------------------------------------------------------------------------------ */

static kda_dims kda_dims_of(const df_config *c) {
    return (kda_dims){c->kda_heads, c->kda_dim, c->conv_w, (int64_t)c->kda_heads * c->kda_dim};
}

int64_t kda_record_floats(const df_config *c, int T) {
    kda_dims k = kda_dims_of(c);
    return (int64_t)k.H * k.D * k.D + (int64_t)(k.W - 1) * 3 * k.P + 6 * (int64_t)T * k.P + (int64_t)T * k.H;
}

kda_record kda_record_at(const df_config *c, float *base, int T) {
    kda_dims k = kda_dims_of(c);
    kda_record r;
    int64_t TP = (int64_t)T * k.P;
    r.S0 = base;
    r.conv0 = r.S0 + (int64_t)k.H * k.D * k.D;
    r.pre[0] = r.conv0 + (int64_t)(k.W - 1) * 3 * k.P;
    r.pre[1] = r.pre[0] + TP;
    r.pre[2] = r.pre[1] + TP;
    r.k = r.pre[2] + TP;
    r.v = r.k + TP;
    r.g = r.v + TP;
    r.beta = r.g + TP;
    return r;
}

kda_record kda_record_begin(df_model *m, df_layer_state *st, int T) {
    const df_config *c = &m->cfg;
    kda_dims k = kda_dims_of(c);
    int64_t need = kda_record_floats(c, T);
    if (need > st->rec_cap) {
        st->rec = m->ops->mem_realloc(m, st->rec, (size_t)st->rec_cap * sizeof(float), (size_t)need * sizeof(float));
        st->rec_cap = need;
    }
    kda_record r = kda_record_at(c, st->rec, T);
    m->ops->mem_copy(m, r.S0, st->S, (size_t)k.H * k.D * k.D * sizeof(float));
    m->ops->mem_copy(m, r.conv0, st->conv, (size_t)(k.W - 1) * 3 * k.P * sizeof(float));
    return r;
}

void kda_rewind(df_model *m, df_layer_state *st, int T, int n) {
    kda_dims k = kda_dims_of(&m->cfg);
    kda_record r = kda_record_at(&m->cfg, st->rec, T);
    memcpy(st->S, r.S0, (size_t)k.H * k.D * k.D * sizeof(float));
    memcpy(st->conv, r.conv0, (size_t)(k.W - 1) * 3 * k.P * sizeof(float));
    kda_conv_state_update(&k, st->conv, (const float *const *)r.pre, n);
    size_t mark = scratch_mark(&m->sc);
    kda_recur_job job = {&k, st->S, NULL, r.k, r.v, r.g, r.beta, n, NULL,
                         SCRATCH_F32(&m->sc, (int64_t)m->kern->n_threads * k.D)};
    kern_parallel_for_t(m->kern, k.H, kda_recur_task, &job);
    scratch_release(&m->sc, mark);
}

size_t kda_scratch_bytes(const df_config *c, int T, int n_threads) {
    kda_dims k = kda_dims_of(c);
    return 6 * scratch_size((size_t)T * k.P, sizeof(float)) + scratch_size(T, sizeof(kda_record)) +
           scratch_size((size_t)T * k.D, sizeof(float)) + scratch_size((size_t)T * k.H, sizeof(float)) +
           scratch_size(T, sizeof(kda_recur_job)) + scratch_size((size_t)n_threads * k.D, sizeof(float));
}

/* A part of the layer could not be read: the states may be half-updated (the pass marks them lost). */
static int kda_fail(df_fwd *f, size_t mark, int rc) {
    scratch_release(f->sc, mark);
    return rc;
}

int kda_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out) {
    const df_config *c = &f->m->cfg;
    kda_dims k = kda_dims_of(c);
    const kda_weights *w = &f->w->kda;
    df_kern *kc = f->m->kern;
    size_t mark = scratch_mark(f->sc);
    int64_t TP = (int64_t)T * k.P;
    float *pre[3], *act[3];
    const df_tensor *proj[3] = {w->q, w->k, w->v};
    int rc = DF_OK;
    for (int i = 0; i < 3; i++) {
        pre[i] = SCRATCH_F32(f->sc, TP);
        act[i] = SCRATCH_F32(f->sc, TP);
    }
    if ((rc = fwd_matmul_n(f, 3, proj, x, T, pre))) return kda_fail(f, mark, rc);
    kda_record *rec = scratch_zalloc(f->sc, (size_t)n_seg * sizeof *rec);
    for (int j = 0; j < n_seg; j++) {
        df_layer_state *st = &seg[j].s->layers[f->layer];
        int64_t o0 = seg[j].row0 * k.P, n = (int64_t)seg[j].T * k.P;
        const float *xs[3] = {pre[0] + o0, pre[1] + o0, pre[2] + o0};
        if (seg[j].record) {
            rec[j] = kda_record_begin(f->m, st, seg[j].T);
            for (int i = 0; i < 3; i++) memcpy(rec[j].pre[i], xs[i], n * sizeof(float));
        }
        for (int i = 0; i < 3; i++) kda_conv(&k, w->conv[i], st->conv, i, xs[i], seg[j].T, act[i] + o0);
        kda_conv_state_update(&k, st->conv, xs, seg[j].T);
    }

    float *fa = SCRATCH_F32(f->sc, (int64_t)T * k.D), *g = pre[0];     /* reuse pre[0] for the gate */
    float *beta = SCRATCH_F32(f->sc, (int64_t)T * k.H);
    const df_tensor *fab[2] = {w->fa, w->b};
    float *fab_out[2] = {fa, beta};
    if ((rc = fwd_matmul_n(f, 2, fab, x, T, fab_out)) || (rc = fwd_matmul(f, w->fb, fa, T, g)))
        return kda_fail(f, mark, rc);
    for (int64_t i = 0; i < TP; i++) g[i] += w->dt_bias[i % k.P];
    kda_gate(c, &k, w->alog, f->m->alog_per_channel, g, T);

    for (int64_t i = 0; i < (int64_t)T * k.H; i++) beta[i] = kern_sigmoid(beta[i]);
    l2norm_heads(act[0], T, &k, 1.0f / sqrtf((float)k.D));
    l2norm_heads(act[1], T, &k, 1.0f);

    float *o = pre[1];
    kda_recur_job *jobs = SCRATCH_NEW(f->sc, kda_recur_job, n_seg);
    float *mbuf = SCRATCH_F32(f->sc, (int64_t)kc->n_threads * k.D);
    for (int j = 0; j < n_seg; j++) {
        int64_t o0 = seg[j].row0 * k.P, n = (int64_t)seg[j].T * k.P, b0 = seg[j].row0 * k.H;
        if (rec[j].S0) {
            memcpy(rec[j].k, act[1] + o0, n * sizeof(float));
            memcpy(rec[j].v, act[2] + o0, n * sizeof(float));
            memcpy(rec[j].g, g + o0, n * sizeof(float));
            memcpy(rec[j].beta, beta + b0, (size_t)seg[j].T * k.H * sizeof(float));
        }
        jobs[j] = (kda_recur_job){&k, seg[j].s->layers[f->layer].S, act[0] + o0, act[1] + o0, act[2] + o0, g + o0,
                                  beta + b0, seg[j].T, o + o0, mbuf};
    }
    double t0 = df_now();
    kern_parallel_for_t(kc, n_seg * k.H, kda_recur_task, jobs);
    model_clock(&f->m->prof.attention, t0);

    float *gate = pre[2];
    if (w->g) rc = fwd_matmul(f, w->g, x, T, gate);
    else if (!(rc = fwd_matmul(f, w->ga, x, T, fa))) rc = fwd_matmul(f, w->gb, fa, T, gate);
    if (rc) return kda_fail(f, mark, rc);
    for (int64_t i = 0; i < (int64_t)T * k.H; i++) {   /* gated RMSNorm per head, fp32 */
        float *oh = o + i * k.D;
        kern_rmsnorm(oh, oh, w->onorm, k.D, c->eps);
        for (int j = 0; j < k.D; j++) oh[j] *= kern_sigmoid(gate[i * k.D + j]);
    }
    rc = fwd_matmul(f, w->o, o, T, out);
    scratch_release(f->sc, mark);
    return rc;
}
