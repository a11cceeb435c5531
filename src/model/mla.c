/* mla.c — Multi-head Latent Attention without RoPE, in the absorbed form: the cache keeps only
 * the post-norm latent c (Lc) and the shared raw key part r (Nr) of each position; queries are mapped into
 * the latent space by W_UK, attention runs over latents, and W_UV maps the result back per head. The same
 * code serves prefill (T > 1, causal within the batch) and decode (T = 1); in a pass over several sessions
 * each attends over its own cache, causally within its own rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

#define MLA_LATENT_EPS 1e-6f   /* q_a_layernorm / kv_a_layernorm use the RMSNorm default */

/* q[T, H*(Nn+Nr)] from the normed input. */
static int mla_query(df_fwd *f, const mla_weights *w, const float *x, int T, float *q) {
    const df_config *c = &f->m->cfg;
    if (!c->q_lora) {
        return fwd_matmul(f, w->q, x, T, q);
    }
    size_t mark = scratch_mark(f->sc);
    float *qa = SCRATCH_F32(f->sc, (int64_t)T * c->q_lora);
    int rc = fwd_matmul(f, w->qa, x, T, qa);
    for (int t = 0; !rc && t < T; t++) {
        float *row = qa + (int64_t)t * c->q_lora;
        kern_rmsnorm(row, row, w->qa_norm, c->q_lora, MLA_LATENT_EPS);
    }
    if (!rc) rc = fwd_matmul(f, w->qb, qa, T, q);
    scratch_release(f->sc, mark);
    return rc;
}

/* Appends the latents of each session's new rows to its cache at its position. */
static int mla_cache_append(df_fwd *f, const mla_weights *w, const fwd_seg *seg, int n_seg, const float *x,
                            int T) {
    const df_config *c = &f->m->cfg;
    int Lc = c->kv_lora, Nr = c->rope;
    size_t mark = scratch_mark(f->sc);
    float *kv = SCRATCH_F32(f->sc, (int64_t)T * (Lc + Nr));
    int rc = fwd_matmul(f, w->kva, x, T, kv);
    if (rc) {
        scratch_release(f->sc, mark);
        return rc;
    }
    for (int j = 0; j < n_seg; j++) {
        df_layer_state *st = &seg[j].s->layers[f->layer];
        int64_t pos0 = seg[j].pos;
        for (int t = 0; t < seg[j].T; t++) {
            const float *row = kv + (seg[j].row0 + t) * (Lc + Nr);
            kern_rmsnorm(st->c + (pos0 + t) * Lc, row, w->kv_norm, Lc, MLA_LATENT_EPS);
            memcpy(st->r + (pos0 + t) * Nr, row + Lc, Nr * sizeof(float));
        }
    }
    scratch_release(f->sc, mark);
    return DF_OK;
}

/* Per pool thread: the buffers of one head's attention for up to T rows and S positions. */
static size_t mla_head_floats(const df_config *c, int T, int64_t S) {
    return (size_t)T * (c->nope + 2 * c->kv_lora + c->vdim) + (size_t)S;
}

/* One head for all T queries: o[t, h*Nv ..] = W_UV_h · Σ_s softmax_s(q̃·c_s + q_rope·r_s) c_s. buf: the
 * thread's mla_head_floats. */
static void mla_head(df_fwd *f, const mla_weights *w, const df_layer_state *st, int64_t pos0, const float *q,
                     int T, int h, float *o, float *buf) {
    const df_config *c = &f->m->cfg;
    int Lc = c->kv_lora, Nr = c->rope, Nn = c->nope, Nv = c->vdim, Nq = Nn + Nr, H = c->mla_heads;
    float scale = 1.0f / sqrtf((float)Nq);
    df_tensor uk = tensor_rows(w->kvb, (int64_t)h * (Nn + Nv), Nn);
    df_tensor uv = tensor_rows(w->kvb, (int64_t)h * (Nn + Nv) + Nn, Nv);
    float *qn = buf, *qlat = qn + (int64_t)T * Nn, *lat = qlat + (int64_t)T * Lc, *oh = lat + (int64_t)T * Lc;
    float *p = oh + (int64_t)T * Nv;
    memset(lat, 0, (size_t)T * Lc * sizeof(float));
    for (int t = 0; t < T; t++) memcpy(qn + (int64_t)t * Nn, q + ((int64_t)t * H + h) * Nq, Nn * sizeof(float));
    kern_matmul_t(f->m->kern, &uk, qn, T, qlat);                /* q̃ = W_UKᵀ q_nope */
    for (int t = 0; t < T; t++) {
        const float *qt = qlat + (int64_t)t * Lc, *qr = q + ((int64_t)t * H + h) * Nq + Nn;
        int64_t n = pos0 + t + 1;                               /* causal: positions 0..pos0+t */
        for (int64_t s = 0; s < n; s++)
            p[s] = (kern_dot(qt, st->c + s * Lc, Lc) + kern_dot(qr, st->r + s * Nr, Nr)) * scale;
        kern_softmax(p, (int)n);
        float *lt = lat + (int64_t)t * Lc;
        for (int64_t s = 0; s < n; s++) {
            const float *cs = st->c + s * Lc;
            for (int l = 0; l < Lc; l++) lt[l] += p[s] * cs[l];
        }
    }
    kern_matmul(f->m->kern, &uv, lat, T, oh);                   /* o_h = W_UV ō */
    for (int t = 0; t < T; t++) memcpy(o + ((int64_t)t * H + h) * Nv, oh + (int64_t)t * Nv, Nv * sizeof(float));
}

typedef struct {
    df_fwd *f;
    const mla_weights *w;
    const df_layer_state *st;
    int64_t pos0;
    const float *q;
    int T;
    float *o;
    float *buf;          /* per pool thread: stride floats */
    size_t stride;
} mla_job;

/* Heads and sessions are independent (disjoint output rows and columns): one pool task per (session, head). */
static void mla_head_task(void *ctx, int task, int thread) {
    mla_job *jobs = ctx;
    int H = jobs->f->m->cfg.mla_heads;
    mla_job *j = &jobs[task / H];
    mla_head(j->f, j->w, j->st, j->pos0, j->q, j->T, task % H, j->o, j->buf + thread * j->stride);
}

int mla_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out) {
    const df_config *c = &f->m->cfg;
    const mla_weights *w = &f->w->mla;
    size_t mark = scratch_mark(f->sc);
    int64_t H = c->mla_heads, Ov = H * c->vdim, Oq = H * (c->nope + c->rope);
    float *q = SCRATCH_F32(f->sc, (int64_t)T * Oq);
    float *o = SCRATCH_F32(f->sc, (int64_t)T * Ov);
    int rc = mla_query(f, w, x, T, q);   /* on failure the caches are cut back by position */
    if (!rc) rc = mla_cache_append(f, w, seg, n_seg, x, T);
    if (!rc) rc = fwd_need(f, w->kvb);
    if (rc) {
        scratch_release(f->sc, mark);
        return rc;
    }
    int Tmax = 0;
    int64_t Smax = 0;
    for (int j = 0; j < n_seg; j++) {
        Tmax = seg[j].T > Tmax ? seg[j].T : Tmax;
        Smax = seg[j].pos + seg[j].T > Smax ? seg[j].pos + seg[j].T : Smax;
    }
    size_t stride = mla_head_floats(c, Tmax, Smax);
    float *buf = SCRATCH_F32(f->sc, (int64_t)f->m->kern->n_threads * stride);
    mla_job *jobs = SCRATCH_NEW(f->sc, mla_job, n_seg);
    for (int j = 0; j < n_seg; j++)
        jobs[j] = (mla_job){f, w, &seg[j].s->layers[f->layer], seg[j].pos, q + seg[j].row0 * Oq, seg[j].T,
                            o + seg[j].row0 * Ov, buf, stride};
    double t0 = df_now();
    kern_parallel_for_t(f->m->kern, n_seg * (int)H, mla_head_task, jobs);
    model_clock(&f->m->prof.attention, t0);
    if (w->g) {
        float *g = SCRATCH_F32(f->sc, (int64_t)T * Ov);
        rc = fwd_matmul(f, w->g, x, T, g);
        for (int64_t i = 0; !rc && i < (int64_t)T * Ov; i++) o[i] *= kern_sigmoid(g[i]);
    }
    if (!rc) rc = fwd_matmul(f, w->o, o, T, out);
    scratch_release(f->sc, mark);
    return rc;
}

size_t mla_scratch_bytes(const df_config *c, int T, int n_threads, int64_t S) {
    int64_t H = c->mla_heads, Ov = H * c->vdim, Oq = H * (c->nope + c->rope);
    size_t query = scratch_size((size_t)T * DF_MAX(c->q_lora, c->kv_lora + c->rope), sizeof(float));
    return scratch_size((size_t)T * Oq, sizeof(float)) + 2 * scratch_size((size_t)T * Ov, sizeof(float)) + query +
           scratch_size((size_t)n_threads * mla_head_floats(c, T, S), sizeof(float)) +
           scratch_size(T, sizeof(mla_job));
}
