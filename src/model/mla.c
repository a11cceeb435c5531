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

typedef struct {
    const df_tensor *q, *qa, *qb, *kva, *kvb, *g, *o;
    float *qa_norm, *kv_norm;
} mla_weights;

static int mla_weights_get(df_fwd *f, mla_weights *w) {
    const df_config *c = &f->m->cfg;
    int64_t d = c->d, H = c->mla_heads, Nq = c->nope + c->rope;
    memset(w, 0, sizeof *w);
    int ok;
    if (c->q_lora)
        ok = (w->qa = fwd_mat(f, "self_attn.q_a_proj.weight", c->q_lora, d)) &&
             (w->qb = fwd_mat(f, "self_attn.q_b_proj.weight", H * Nq, c->q_lora)) &&
             (w->qa_norm = fwd_vec(f, "self_attn.q_a_layernorm.weight", c->q_lora, 1));
    else
        ok = (w->q = fwd_mat(f, "self_attn.q_proj.weight", H * Nq, d)) != NULL;
    ok = ok && (w->kva = fwd_mat(f, "self_attn.kv_a_proj_with_mqa.weight", c->kv_lora + c->rope, d)) &&
         (w->kvb = fwd_mat(f, "self_attn.kv_b_proj.weight", H * (c->nope + c->vdim), c->kv_lora)) &&
         (w->kv_norm = fwd_vec(f, "self_attn.kv_a_layernorm.weight", c->kv_lora, 1)) &&
         (w->o = fwd_mat(f, "self_attn.o_proj.weight", d, H * c->vdim));
    if (ok && c->mla_out_gate) ok = (w->g = fwd_mat(f, "self_attn.g_proj.weight", H * c->vdim, d)) != NULL;
    if (ok && w->kvb->dtype == DF_DT_MXFP4) {
        df_error_set(f->err, DF_EUNSUPPORTED, "%s: MXFP4 kv_b_proj in layer %d is not supported", f->m->dir,
                     f->layer);
        ok = 0;
    }
    if (!ok) {
        free(w->qa_norm);
        free(w->kv_norm);
    }
    return ok ? DF_OK : f->err->code;
}

/* q[T, H*(Nn+Nr)] from the normed input. */
static void mla_query(df_fwd *f, const mla_weights *w, const float *x, int T, float *q) {
    const df_config *c = &f->m->cfg;
    if (!c->q_lora) {
        kern_matmul(f->m->kern, w->q, x, T, q);
        return;
    }
    float *qa = xmalloc((size_t)T * c->q_lora * sizeof(float));
    kern_matmul(f->m->kern, w->qa, x, T, qa);
    for (int t = 0; t < T; t++) {
        float *row = qa + (int64_t)t * c->q_lora;
        kern_rmsnorm(row, row, w->qa_norm, c->q_lora, MLA_LATENT_EPS);
    }
    kern_matmul(f->m->kern, w->qb, qa, T, q);
    free(qa);
}

/* Appends the latents of each session's new rows to its cache at its position. */
static void mla_cache_append(df_fwd *f, const mla_weights *w, const fwd_seg *seg, int n_seg, const float *x,
                             int T) {
    const df_config *c = &f->m->cfg;
    int Lc = c->kv_lora, Nr = c->rope;
    float *kv = xmalloc((size_t)T * (Lc + Nr) * sizeof(float));
    kern_matmul(f->m->kern, w->kva, x, T, kv);
    for (int j = 0; j < n_seg; j++) {
        df_layer_state *st = &seg[j].s->layers[f->layer];
        int64_t pos0 = seg[j].s->pos;
        for (int t = 0; t < seg[j].T; t++) {
            const float *row = kv + (seg[j].row0 + t) * (Lc + Nr);
            kern_rmsnorm(st->c + (pos0 + t) * Lc, row, w->kv_norm, Lc, MLA_LATENT_EPS);
            memcpy(st->r + (pos0 + t) * Nr, row + Lc, Nr * sizeof(float));
        }
    }
    free(kv);
}

/* One head for all T queries: o[t, h*Nv ..] = W_UV_h · Σ_s softmax_s(q̃·c_s + q_rope·r_s) c_s. */
static void mla_head(df_fwd *f, const mla_weights *w, const df_layer_state *st, int64_t pos0, const float *q,
                     int T, int h, float *o) {
    const df_config *c = &f->m->cfg;
    int Lc = c->kv_lora, Nr = c->rope, Nn = c->nope, Nv = c->vdim, Nq = Nn + Nr, H = c->mla_heads;
    int64_t S = pos0 + T;
    float scale = 1.0f / sqrtf((float)Nq);
    df_tensor uk = tensor_rows(w->kvb, (int64_t)h * (Nn + Nv), Nn);
    df_tensor uv = tensor_rows(w->kvb, (int64_t)h * (Nn + Nv) + Nn, Nv);
    float *qn = xmalloc((size_t)T * Nn * sizeof(float));
    float *qlat = xmalloc((size_t)T * Lc * sizeof(float));
    float *lat = xcalloc((size_t)T * Lc, sizeof(float));
    float *p = xmalloc((size_t)S * sizeof(float));
    float *oh = xmalloc((size_t)T * Nv * sizeof(float));
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
    free(qn);
    free(qlat);
    free(lat);
    free(p);
    free(oh);
}

typedef struct {
    df_fwd *f;
    const mla_weights *w;
    const df_layer_state *st;
    int64_t pos0;
    const float *q;
    int T;
    float *o;
} mla_job;

/* Heads and sessions are independent (disjoint output rows and columns): one pool task per (session, head). */
static void mla_head_task(void *ctx, int task) {
    mla_job *jobs = ctx;
    int H = jobs->f->m->cfg.mla_heads;
    mla_job *j = &jobs[task / H];
    mla_head(j->f, j->w, j->st, j->pos0, j->q, j->T, task % H, j->o);
}

int mla_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out) {
    const df_config *c = &f->m->cfg;
    mla_weights w;
    int rc = mla_weights_get(f, &w);
    if (rc) return rc;
    int64_t H = c->mla_heads, Ov = H * c->vdim, Oq = H * (c->nope + c->rope);
    float *q = xmalloc((size_t)T * Oq * sizeof(float));
    float *o = xmalloc((size_t)T * Ov * sizeof(float));
    mla_query(f, &w, x, T, q);
    mla_cache_append(f, &w, seg, n_seg, x, T);
    mla_job *jobs = xmalloc((size_t)n_seg * sizeof *jobs);
    for (int j = 0; j < n_seg; j++)
        jobs[j] = (mla_job){f, &w, &seg[j].s->layers[f->layer], seg[j].s->pos, q + seg[j].row0 * Oq, seg[j].T,
                            o + seg[j].row0 * Ov};
    double t0 = df_now();
    kern_parallel_for(f->m->kern, n_seg * (int)H, mla_head_task, jobs);
    model_clock(&f->m->prof.attention, t0);
    free(jobs);
    if (w.g) {
        float *g = xmalloc((size_t)T * Ov * sizeof(float));
        kern_matmul(f->m->kern, w.g, x, T, g);
        for (int64_t i = 0; i < (int64_t)T * Ov; i++) o[i] *= kern_sigmoid(g[i]);
        free(g);
    }
    kern_matmul(f->m->kern, w.o, o, T, out);
    free(q);
    free(o);
    free(w.qa_norm);
    free(w.kv_norm);
    return DF_OK;
}

int mla_check(df_fwd *f) {
    mla_weights w;
    int rc = mla_weights_get(f, &w);
    if (!rc) {
        free(w.qa_norm);
        free(w.kv_norm);
    }
    return rc;
}
