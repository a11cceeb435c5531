/* gpu_ops.c — the model's operations on the GPU (the op table of model/backend.h): the same steps as the CPU's
 * kda.c, mla.c, moe.c, attn_res.c and head, as kernel launches on one stream over device memory. Nothing waits
 * for the device inside a pass (routing stays on the device: the experts' kernels read the chosen ids there);
 * pass_end drains the stream and reports the first failure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gpu_internal.h"
#include "common/util.h"

static unsigned blocks_for(int64_t n, int per) {
    int64_t b = (n + per - 1) / per;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* y[n, W.rows] (row stride ldy) = x[n, W.cols] (row stride ldx) W^T */
static void mm_ld(gpu_ctx *g, const gpu_wmat *w, const float *x, int64_t ldx, int n, float *y, int64_t ldy) {
    CUdeviceptr xp = dptr(x), yp = dptr(y);
    int xvec = ldx % 4 == 0 && xp % 16 == 0;
    gpu_wmat wv = *w;
    void *args[] = {&wv, &xp, &ldx, &n, &yp, &ldy, &xvec};
    gpu_launch(g, n == 1 ? K_MATMUL1 : K_MATMUL, (unsigned)((w->rows + 7) / 8), (unsigned)((n + 7) / 8), 1, 256, 0,
               args);
}

static void mm(gpu_ctx *g, const df_tensor *t, const float *x, int n, float *y) {
    const gpu_wmat *w = gpu_mat(g, t);
    mm_ld(g, w, x, w->cols, n, y, w->rows);
}

static void rms(gpu_ctx *g, float *out, int64_t ldo, const float *x, int64_t ldi, CUdeviceptr w, int d, float eps,
                int rows) {
    CUdeviceptr o = dptr(out), xp = dptr(x);
    void *args[] = {&o, &ldo, &xp, &ldi, &w, &d, &eps};
    gpu_launch(g, K_RMSNORM, (unsigned)rows, 1, 1, 256, 0, args);
}

static void ew1(gpu_ctx *g, int k, float *y, int64_t n) {
    CUdeviceptr yp = dptr(y);
    void *args[] = {&yp, &n};
    gpu_launch(g, k, blocks_for(n, 256), 1, 1, 256, 0, args);
}

static void ew2(gpu_ctx *g, int k, float *y, const float *x, int64_t n) {
    CUdeviceptr yp = dptr(y), xp = dptr(x);
    void *args[] = {&yp, &xp, &n};
    gpu_launch(g, k, blocks_for(n, 256), 1, 1, 256, 0, args);
}

static void dcopy(gpu_ctx *g, void *dst, const void *src, size_t bytes) { gpu_copy_async(g, dptr(dst), dptr(src), bytes); }

static void glu_act(gpu_ctx *g, const df_config *c, float *gt, const float *u, int64_t n) {
    CUdeviceptr gp = dptr(gt), up = dptr(u);
    int situ = c->use_situ;
    float beta = c->situ_beta, bl = c->situ_lin_beta;
    void *args[] = {&gp, &up, &n, &situ, &beta, &bl};
    gpu_launch(g, K_GLU, blocks_for(n, 256), 1, 1, 256, 0, args);
}

/* ---- state memory ------------------------------------------------------------------------------------ */

static void g_current(gpu_ctx *g) { g->a.cuCtxSetCurrent(g->ctx); }

static void *g_mem_alloc(df_model *m, size_t bytes) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    CUdeviceptr p = 0;
    CUresult r = g->a.cuMemAlloc(&p, bytes ? bytes : 4);
    if (r) df_die("GPU %d (%s): out of memory for session state (%zu bytes): %s", g->ordinal, g->name, bytes,
                  cu_api_errstr(&g->a, r));
    g->a.cuMemsetD8Async(p, 0, bytes ? bytes : 4, g->st);
    return fptr(p);
}

static void g_mem_free(df_model *m, void *p) {
    if (!p) return;
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    g->a.cuStreamSynchronize(g->st);
    g->a.cuMemFree(dptr(p));
}

static void *g_mem_realloc(df_model *m, void *p, size_t old_bytes, size_t new_bytes) {
    gpu_ctx *g = gpu_of(m);
    void *q = g_mem_alloc(m, new_bytes);
    if (p) {
        dcopy(g, q, p, DF_MIN(old_bytes, new_bytes));
        g_mem_free(m, p);
    }
    return q;
}

static void g_mem_copy(df_model *m, void *dst, const void *src, size_t bytes) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    dcopy(g, dst, src, bytes);
}

static void g_mem_zero(df_model *m, void *p, size_t bytes) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    if (bytes) gpu_check(g, g->a.cuMemsetD8Async(dptr(p), 0, bytes, g->st), "clearing session state");
}

static void g_mem_to_host(df_model *m, void *host, const void *src, size_t bytes) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    if (!bytes) return;
    CUresult r = g->a.cuMemcpyDtoHAsync(host, dptr(src), bytes, g->st);
    if (!r) r = g->a.cuStreamSynchronize(g->st);
    if (r) df_die("GPU %d (%s): copying session state to the host failed: %s", g->ordinal, g->name,
                  cu_api_errstr(&g->a, r));
}

static void g_mem_from_host(df_model *m, void *dst, const void *host, size_t bytes) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    if (!bytes) return;
    CUresult r = g->a.cuMemcpyHtoDAsync(dptr(dst), host, bytes, g->st);
    if (!r) r = g->a.cuStreamSynchronize(g->st);
    if (r) df_die("GPU %d (%s): copying session state to the device failed: %s", g->ordinal, g->name,
                  cu_api_errstr(&g->a, r));
}

/* ---- the pass ---------------------------------------------------------------------------------------- */

/* Pinned staging of at least n elements of size sz in *p (capacity *cap). */
static int stage(gpu_ctx *g, void **p, int *cap, int n, size_t sz) {
    if (n <= *cap) return 0;
    gpu_host_free(g, *p);
    *cap = DF_MAX(n, 2 * *cap);
    *p = gpu_host_alloc(g, (size_t)*cap * sz);
    if (!*p) *cap = 0;
    return *p ? 0 : -1;
}

static int dev_buf(gpu_ctx *g, CUdeviceptr *p, int *cap, int n, size_t sz) {
    if (n <= *cap) return 0;
    if (*p) g->a.cuMemFree(*p);
    *cap = DF_MAX(n, 2 * *cap);
    if (g->a.cuMemAlloc(p, (size_t)*cap * sz)) {
        *p = 0;
        *cap = 0;
        return -1;
    }
    return 0;
}

static int g_pass_begin(df_model *m, const model_seg *seg, int n_seg, int T, df_error *err) {
    gpu_ctx *g = gpu_of(m);
    g_current(g);
    g->err = DF_OK;
    g->msg[0] = 0;
    g->arena_used = 0;
    g->n_outs = 0;
    size_t rows = 0;
    for (int j = 0; j < n_seg; j++) rows += seg[j].logits ? (size_t)(seg[j].all_rows ? seg[j].T : 1) : 0;
    int hl = (int)DF_MIN(rows * (size_t)m->cfg.vocab, (size_t)INT32_MAX / 2), hlc = (int)g->h_logits_cap;
    if (dev_buf(g, &g->tok, &g->tok_cap, T, sizeof(int32_t)) || dev_buf(g, &g->pos, &g->pos_cap, n_seg, 8) ||
        stage(g, (void **)&g->h_tok, &g->h_tok_cap, T, sizeof(int32_t)) ||
        stage(g, (void **)&g->h_pos, &g->h_pos_cap, n_seg, sizeof(int64_t)) ||
        stage(g, (void **)&g->h_logits, &hlc, hl, sizeof(float))) {
        g->h_logits_cap = (size_t)hlc;
        df_error_set(err, DF_ENOMEM, "GPU %d (%s): cannot allocate a pass's buffers for %d rows", g->ordinal, g->name, T);
        return DF_ENOMEM;
    }
    g->h_logits_cap = (size_t)hlc;
    if (n_seg > g->outs_cap) {
        g->outs_cap = DF_MAX(n_seg, 2 * g->outs_cap);
        g->outs = xrealloc(g->outs, (size_t)g->outs_cap * sizeof *g->outs);
    }
    if (n_seg > g->pass_states_cap) {
        g->pass_states_cap = DF_MAX(n_seg, 2 * g->pass_states_cap);
        g->pass_states = xrealloc(g->pass_states, (size_t)g->pass_states_cap * sizeof *g->pass_states);
    }
    g->n_pass_states = n_seg;
    for (int j = 0; j < n_seg; j++) {
        g->h_pos[j] = seg[j].s->pos;
        g->pass_states[j] = seg[j].s;
    }
    gpu_graph_begin(g, m, seg, n_seg, T);
    if (g->mode != GPU_REPLAY)
        gpu_check(g, g->a.cuMemcpyHtoDAsync(g->pos, g->h_pos, (size_t)n_seg * sizeof(int64_t), g->st), "positions");
    return DF_OK;
}

static int g_pass_end(df_model *m, int rc, df_error *err) {
    gpu_ctx *g = gpu_of(m);
    gpu_graph_end(g, rc);
    gpu_check(g, g->a.cuStreamSynchronize(g->st), "running the pass");
    gpu_arena_end_pass(g);
    if (!rc && g->err) {
        df_error_set(err, g->err, "%s", g->msg);
        rc = g->err;
    }
    for (int i = 0; !rc && i < g->n_outs; i++)
        memcpy(g->outs[i].dst, g->h_logits + g->outs[i].off, g->outs[i].n * sizeof(float));
    g->n_outs = 0;
    return rc;
}

static float *g_act(df_model *m, int64_t n) { return gpu_f32(gpu_of(m), n); }

static int g_embed(df_model *m, const int32_t *tokens, int T, float *h, df_error *err) {
    gpu_ctx *g = gpu_of(m);
    (void)err;
    memcpy(g->h_tok, tokens, (size_t)T * sizeof(int32_t));
    if (g->mode != GPU_REPLAY)
        gpu_check(g, g->a.cuMemcpyHtoDAsync(g->tok, g->h_tok, (size_t)T * sizeof(int32_t), g->st), "copying token ids");
    gpu_wmat w = *gpu_mat(g, m->w.embed);
    CUdeviceptr hp = dptr(h), tp = g->tok;
    void *args[] = {&hp, &tp, &w};
    gpu_launch(g, K_EMBED, (unsigned)T, 1, 1, 256, 0, args);
    return DF_OK;
}

static void g_rmsnorm(df_model *m, const float *w, const float *x, int T, float *out) {
    gpu_ctx *g = gpu_of(m);
    rms(g, out, m->cfg.d, x, m->cfg.d, gpu_vec(g, w), m->cfg.d, m->cfg.eps, T);
}

static void g_add(df_model *m, float *y, const float *x, int64_t n) { ew2(gpu_of(m), K_ADD, y, x, n); }

static void g_copy(df_model *m, float *dst, const float *src, int64_t n) {
    dcopy(gpu_of(m), dst, src, (size_t)n * sizeof(float));
}

#define RES_MAX 128
typedef struct {
    uint64_t p[RES_MAX];
} res_ptrs;

static void g_attn_res(df_model *m, float *const *blocks, int nb, const float *p, const float *w_norm,
                       const float *w_proj, int T, float *out) {
    gpu_ctx *g = gpu_of(m);
    res_ptrs v;
    memset(&v, 0, sizeof v);
    int n = nb + 1, d = m->cfg.d;
    DF_ASSERT(n <= RES_MAX);
    for (int j = 0; j < nb; j++) v.p[j] = dptr(blocks[j]);
    v.p[nb] = dptr(p);
    CUdeviceptr o = dptr(out), wn = gpu_vec(g, w_norm), wp = gpu_vec(g, w_proj);
    float eps = m->cfg.eps;
    void *args[] = {&o, &v, &n, &wn, &wp, &d, &eps};
    gpu_launch(g, K_ATTN_RES, (unsigned)T, 1, 1, 256, 0, args);
}

/* ---- KDA --------------------------------------------------------------------------------------------- */

/* The next convolution history of st from T rows of pre-conv inputs x[3] (through a scratch copy: the new rows
 * overlap the old ones). */
static void kda_hist(gpu_ctx *g, const df_config *c, float *hist, float *const x[3], int T) {
    int W = c->conv_w;
    int64_t P = (int64_t)c->kda_heads * c->kda_dim, n = (int64_t)(W - 1) * 3 * P;
    if (W <= 1 || T <= 0) return;
    CUdeviceptr o = g->hist_tmp, hp = dptr(hist), x0 = dptr(x[0]), x1 = dptr(x[1]), x2 = dptr(x[2]);
    void *args[] = {&o, &hp, &x0, &x1, &x2, &T, &P, &W};
    gpu_launch(g, K_KDA_CONV_HIST, blocks_for(n, 256), 1, 1, 256, 0, args);
    dcopy(g, hist, fptr(g->hist_tmp), (size_t)n * sizeof(float));
}

static void kda_recur(gpu_ctx *g, const df_config *c, float *S, const float *q, const float *k, const float *v,
                      const float *gg, const float *beta, int T, float *o) {
    int H = c->kda_heads, D = c->kda_dim;
    if (T <= 0) return;
    CUdeviceptr Sp = dptr(S), qp = dptr(q), kp = dptr(k), vp = dptr(v), gp = dptr(gg), bp = dptr(beta), op = dptr(o);
    void *args[] = {&Sp, &qp, &kp, &vp, &gp, &bp, &T, &H, &D, &op};
    gpu_launch(g, K_KDA_RECUR, (unsigned)H, 1, 1, (unsigned)D, (unsigned)((D * D + 3 * D) * sizeof(float)), args);
}

static int g_kda(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out) {
    df_model *m = f->m;
    gpu_ctx *g = gpu_of(m);
    const df_config *c = &m->cfg;
    const kda_weights *w = &f->w->kda;
    int H = c->kda_heads, D = c->kda_dim, W = c->conv_w;
    int64_t P = (int64_t)H * D, TP = (int64_t)T * P;
    size_t mark = gpu_arena_mark(g);
    float *pre[3], *act[3];
    const df_tensor *proj[3] = {w->q, w->k, w->v};
    for (int i = 0; i < 3; i++) {
        pre[i] = gpu_f32(g, TP);
        act[i] = gpu_f32(g, TP);
        mm(g, proj[i], x, T, pre[i]);
    }
    kda_record *rec = scratch_zalloc(f->sc, (size_t)n_seg * sizeof *rec);
    for (int j = 0; j < n_seg; j++) {
        df_layer_state *st = &seg[j].s->layers[f->layer];
        int64_t o0 = seg[j].row0 * P, n = (int64_t)seg[j].T * P;
        float *xs[3] = {pre[0] + o0, pre[1] + o0, pre[2] + o0};
        if (seg[j].record) {
            rec[j] = kda_record_begin(m, st, seg[j].T);
            for (int i = 0; i < 3; i++) dcopy(g, rec[j].pre[i], xs[i], (size_t)n * sizeof(float));
        }
        int Ts = seg[j].T;
        for (int i = 0; i < 3; i++) {
            CUdeviceptr yp = dptr(act[i] + o0), xp = dptr(xs[i]), hp = dptr(st->conv), wp = gpu_vec(g, w->conv[i]);
            void *args[] = {&yp, &xp, &hp, &wp, &Ts, &P, &W, &i};
            gpu_launch(g, K_KDA_CONV, blocks_for((int64_t)Ts * P, 256), 1, 1, 256, 0, args);
        }
        kda_hist(g, c, st->conv, xs, Ts);
    }
    float *fa = gpu_f32(g, (int64_t)T * D), *gt = pre[0];
    mm(g, w->fa, x, T, fa);
    mm(g, w->fb, fa, T, gt);
    {
        CUdeviceptr gp = dptr(gt), db = gpu_vec(g, w->dt_bias), al = gpu_vec(g, w->alog);
        int pc = m->alog_per_channel, bounded = c->has_lower_bound;
        float lb = c->lower_bound;
        void *args[] = {&gp, &db, &al, &T, &H, &D, &pc, &bounded, &lb};
        gpu_launch(g, K_KDA_GATE, blocks_for(TP, 256), 1, 1, 256, 0, args);
    }
    float *beta = gpu_f32(g, (int64_t)T * H);
    mm(g, w->b, x, T, beta);
    ew1(g, K_SIGMOID, beta, (int64_t)T * H);
    for (int i = 0; i < 2; i++) {
        CUdeviceptr xp = dptr(act[i]);
        int64_t rows = (int64_t)T * H;
        float scale = i == 0 ? 1.0f / sqrtf((float)D) : 1.0f;
        void *args[] = {&xp, &rows, &D, &scale};
        gpu_launch(g, K_L2NORM, blocks_for(rows, 8), 1, 1, 256, 0, args);
    }
    float *o = pre[1];
    for (int j = 0; j < n_seg; j++) {
        int64_t o0 = seg[j].row0 * P, n = (int64_t)seg[j].T * P, b0 = seg[j].row0 * H;
        if (rec[j].S0) {
            dcopy(g, rec[j].k, act[1] + o0, (size_t)n * sizeof(float));
            dcopy(g, rec[j].v, act[2] + o0, (size_t)n * sizeof(float));
            dcopy(g, rec[j].g, gt + o0, (size_t)n * sizeof(float));
            dcopy(g, rec[j].beta, beta + b0, (size_t)seg[j].T * H * sizeof(float));
        }
        kda_recur(g, c, seg[j].s->layers[f->layer].S, act[0] + o0, act[1] + o0, act[2] + o0, gt + o0, beta + b0,
                  seg[j].T, o + o0);
    }
    float *gate = pre[2];
    if (w->g) {
        mm(g, w->g, x, T, gate);
    } else {
        mm(g, w->ga, x, T, fa);
        mm(g, w->gb, fa, T, gate);
    }
    {
        CUdeviceptr op = dptr(o), gp = dptr(gate), wn = gpu_vec(g, w->onorm);
        float eps = c->eps;
        void *args[] = {&op, &gp, &wn, &D, &eps};
        gpu_launch(g, K_GATED_NORM, (unsigned)((int64_t)T * H), 1, 1, 128, 0, args);
    }
    mm(g, w->o, o, T, out);
    gpu_arena_release(g, mark);
    return DF_OK;
}

static void g_kda_rewind(df_model *m, df_layer_state *st, int T, int n) {
    gpu_ctx *g = gpu_of(m);
    const df_config *c = &m->cfg;
    g_current(g);
    kda_record r = kda_record_at(c, st->rec, T);
    dcopy(g, st->S, r.S0, (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float));
    dcopy(g, st->conv, r.conv0, (size_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim * sizeof(float));
    kda_hist(g, c, st->conv, r.pre, n);
    kda_recur(g, c, st->S, NULL, r.k, r.v, r.g, r.beta, n, NULL);
}

/* ---- MLA --------------------------------------------------------------------------------------------- */

#define MLA_LATENT_EPS 1e-6f

/* Where a mixer block's segment starts: the position of its session before the pass, in device memory (g->pos,
 * one per session in pass order), and the rows of it earlier blocks of the pass took (*delta). */
static CUdeviceptr seg_pos(gpu_ctx *g, const fwd_seg *seg, int64_t *delta) {
    int j = 0;
    while (j < g->n_pass_states && g->pass_states[j] != seg->s) j++;
    DF_ASSERT(j < g->n_pass_states);
    *delta = seg->pos - seg->s->pos;
    return g->pos + (uint64_t)j * sizeof(int64_t);
}

static int g_mla(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out) {
    df_model *m = f->m;
    gpu_ctx *g = gpu_of(m);
    const df_config *c = &m->cfg;
    const mla_weights *w = &f->w->mla;
    int H = c->mla_heads, Lc = c->kv_lora, Nr = c->rope, Nn = c->nope, Nv = c->vdim;
    int64_t Oq = (int64_t)H * (Nn + Nr), Ov = (int64_t)H * Nv;
    size_t mark = gpu_arena_mark(g);
    float *q = gpu_f32(g, (int64_t)T * Oq), *o = gpu_f32(g, (int64_t)T * Ov);
    if (!c->q_lora) {
        mm(g, w->q, x, T, q);
    } else {
        float *qa = gpu_f32(g, (int64_t)T * c->q_lora);
        mm(g, w->qa, x, T, qa);
        rms(g, qa, c->q_lora, qa, c->q_lora, gpu_vec(g, w->qa_norm), c->q_lora, MLA_LATENT_EPS, T);
        mm(g, w->qb, qa, T, q);
    }
    float *kv = gpu_f32(g, (int64_t)T * (Lc + Nr));
    mm(g, w->kva, x, T, kv);
    /* The segments' positions are in device memory (g->pos, filled at pass_begin) so that a captured decode
     * graph serves every position: a block's segment is the one its rows belong to. */
    for (int j = 0; j < n_seg; j++) {
        df_layer_state *st = &seg[j].s->layers[f->layer];
        CUdeviceptr cp = dptr(st->c), rp = dptr(st->r), kp = dptr(kv + seg[j].row0 * (Lc + Nr)),
                    wn = gpu_vec(g, w->kv_norm);
        int64_t delta;
        CUdeviceptr pp = seg_pos(g, &seg[j], &delta);
        float eps = MLA_LATENT_EPS;
        void *args[] = {&cp, &rp, &kp, &wn, &pp, &delta, &Lc, &Nr, &eps};
        gpu_launch(g, K_MLA_APPEND, (unsigned)seg[j].T, 1, 1, 256, 0, args);
    }
    gpu_wmat kvb = *gpu_mat(g, w->kvb);
    float *qlat = gpu_f32(g, (int64_t)T * H * Lc), *lat = gpu_f32(g, (int64_t)T * H * Lc);
    {
        CUdeviceptr qlp = dptr(qlat), qp = dptr(q);
        void *args[] = {&qlp, &qp, &kvb, &H, &Nn, &Nv, &Nr, &Lc};
        gpu_launch(g, K_MLA_QLAT, blocks_for(Lc, 256), (unsigned)H, (unsigned)T, 256, 0, args);
    }
    float scale = 1.0f / sqrtf((float)(Nn + Nr));
    for (int j = 0; j < n_seg; j++) {
        const df_layer_state *st = &seg[j].s->layers[f->layer];
        CUdeviceptr lp = dptr(lat + seg[j].row0 * H * Lc), qlp = dptr(qlat + seg[j].row0 * H * Lc),
                    qp = dptr(q + seg[j].row0 * Oq), cc = dptr(st->c), cr = dptr(st->r);
        int64_t delta;
        CUdeviceptr pp = seg_pos(g, &seg[j], &delta);
        void *args[] = {&lp, &qlp, &qp, &cc, &cr, &pp, &delta, &H, &Lc, &Nr, &Nn, &scale};
        gpu_launch(g, K_MLA_ATTN, (unsigned)H, (unsigned)seg[j].T, 1, 256, 0, args);
    }
    {
        CUdeviceptr op = dptr(o), lp = dptr(lat);
        void *args[] = {&op, &lp, &kvb, &H, &Nn, &Nv, &Lc};
        gpu_launch(g, K_MLA_UV, blocks_for(Nv, 8), (unsigned)H, (unsigned)T, 256, 0, args);
    }
    if (w->g) {
        float *gt = gpu_f32(g, (int64_t)T * Ov);
        mm(g, w->g, x, T, gt);
        ew2(g, K_MUL_SIGMOID, o, gt, (int64_t)T * Ov);
    }
    mm(g, w->o, o, T, out);
    gpu_arena_release(g, mark);
    return DF_OK;
}

/* ---- FFN and MoE ------------------------------------------------------------------------------------- */

static void glu(gpu_ctx *g, const df_config *c, const glu_weights *w, const float *x, int T, float *out) {
    size_t mark = gpu_arena_mark(g);
    float *gt = gpu_f32(g, (int64_t)T * w->inter), *u = gpu_f32(g, (int64_t)T * w->inter);
    mm(g, w->gate, x, T, gt);
    mm(g, w->up, x, T, u);
    glu_act(g, c, gt, u, (int64_t)T * w->inter);
    mm(g, w->down, gt, T, out);
    gpu_arena_release(g, mark);
}

static int g_dense(df_fwd *f, const float *x, int T, float *out) {
    glu(gpu_of(f->m), &f->m->cfg, &f->w->ffn, x, T, out);
    return DF_OK;
}

static int g_moe(df_fwd *f, const float *x, int T, float *out) {
    df_model *m = f->m;
    gpu_ctx *g = gpu_of(m);
    const df_config *c = &m->cfg;
    const moe_weights *w = &f->w->moe;
    const gpu_experts *ex = &g->experts[f->layer];
    int E = c->n_experts, k = c->topk, Dz = config_expert_dim(c);
    size_t mark = gpu_arena_mark(g);
    float *s = gpu_f32(g, (int64_t)T * E);
    mm(g, w->gate, x, T, s);
    CUdeviceptr ids = gpu_arena(g, (size_t)T * k * sizeof(int32_t)), wts = gpu_arena(g, (size_t)T * k * sizeof(float));
    {
        CUdeviceptr sp = dptr(s), bias = gpu_vec(g, w->bias);
        int G = c->n_group, tg = c->topk_group, renorm = c->renorm;
        float scale = c->routed_scale;
        void *args[] = {&ids, &wts, &sp, &bias, &E, &G, &tg, &k, &renorm, &scale};
        gpu_launch(g, K_ROUTE, (unsigned)T, 1, 1, 256, 0, args);
    }
    float *sh = NULL, *z = (float *)x;
    if (w->shared.gate) {
        sh = gpu_f32(g, (int64_t)T * c->d);
        glu(g, c, &w->shared, x, T, sh);
    }
    if (w->latent_down) {
        z = gpu_f32(g, (int64_t)T * Dz);
        mm(g, w->latent_down, x, T, z);
    }
    int pairs = T * k;
    float *act = gpu_f32(g, (int64_t)pairs * ex->inter), *part = gpu_f32(g, (int64_t)pairs * Dz);
    float *y = gpu_f32(g, (int64_t)T * Dz);
    gpu_experts xv = *ex;
    {
        CUdeviceptr ap = dptr(act), zp = dptr(z);
        int xvec = Dz % 4 == 0 && zp % 16 == 0, situ = c->use_situ;
        float beta = c->situ_beta, bl = c->situ_lin_beta;
        void *args[] = {&ap, &zp, &ids, &xv, &k, &xvec, &situ, &beta, &bl};
        gpu_launch(g, K_MOE_GATE_UP, blocks_for(ex->inter, 8), (unsigned)pairs, 1, 256, 0, args);
    }
    {
        CUdeviceptr pp = dptr(part), ap = dptr(act);
        int avec = ex->inter % 4 == 0;
        void *args[] = {&pp, &ap, &ids, &wts, &xv, &avec};
        gpu_launch(g, K_MOE_DOWN, blocks_for(Dz, 8), (unsigned)pairs, 1, 256, 0, args);
    }
    {
        CUdeviceptr yp = dptr(y), pp = dptr(part);
        int64_t dim = Dz;
        void *args[] = {&yp, &pp, &T, &k, &dim};
        gpu_launch(g, K_MOE_SUM, blocks_for((int64_t)T * Dz, 256), 1, 1, 256, 0, args);
    }
    if (w->latent_up) {
        if (w->latent_norm) rms(g, y, Dz, y, Dz, gpu_vec(g, w->latent_norm), Dz, c->eps, T);
        mm(g, w->latent_up, y, T, out);
    } else {
        dcopy(g, out, y, (size_t)T * c->d * sizeof(float));
    }
    if (sh) ew2(g, K_ADD, out, sh, (int64_t)T * c->d);
    gpu_arena_release(g, mark);
    return DF_OK;
}

/* ---- output head ------------------------------------------------------------------------------------- */

static int g_head(df_model *m, const float *h, model_seg *seg, int n_seg, df_error *err) {
    gpu_ctx *g = gpu_of(m);
    const df_config *c = &m->cfg;
    (void)err;
    int rows = 0;
    for (int j = 0; j < n_seg; j++) rows += seg[j].logits ? (seg[j].all_rows ? seg[j].T : 1) : 0;
    size_t mark = gpu_arena_mark(g);
    float *xn = gpu_f32(g, (int64_t)rows * c->d), *lg = gpu_f32(g, (int64_t)rows * c->vocab);
    CUdeviceptr nw = gpu_vec(g, m->w.norm);
    int r = 0, T0 = 0;
    for (int j = 0; j < n_seg; T0 += seg[j++].T) {
        if (!seg[j].logits) continue;
        int first = seg[j].all_rows ? 0 : seg[j].T - 1, n = seg[j].T - first;
        rms(g, xn + (int64_t)r * c->d, c->d, h + (int64_t)(T0 + first) * c->d, c->d, nw, c->d, c->eps, n);
        r += n;
    }
    mm(g, m->w.head, xn, rows, lg);
    if (g->mode != GPU_REPLAY)   /* into pinned staging; pass_end hands each segment its rows */
        gpu_check(g, g->a.cuMemcpyDtoHAsync(g->h_logits, dptr(lg), (size_t)rows * c->vocab * sizeof(float), g->st),
                  "copying logits");
    r = 0;
    for (int j = 0; j < n_seg; j++) {
        if (!seg[j].logits) continue;
        int n = seg[j].all_rows ? seg[j].T : 1;
        g->outs[g->n_outs++] = (struct gpu_logits_out){seg[j].logits, (size_t)r * c->vocab, (size_t)n * c->vocab};
        r += n;
    }
    gpu_arena_release(g, mark);
    return DF_OK;
}

static const model_ops ops = {
    .name = "cuda",
    .weights_resident = 1,
    .mem_alloc = g_mem_alloc,
    .mem_realloc = g_mem_realloc,
    .mem_free = g_mem_free,
    .mem_copy = g_mem_copy,
    .mem_zero = g_mem_zero,
    .mem_to_host = g_mem_to_host,
    .mem_from_host = g_mem_from_host,
    .pass_begin = g_pass_begin,
    .pass_end = g_pass_end,
    .act = g_act,
    .embed = g_embed,
    .rmsnorm = g_rmsnorm,
    .add = g_add,
    .copy = g_copy,
    .attn_res = g_attn_res,
    .kda = g_kda,
    .mla = g_mla,
    .moe = g_moe,
    .dense = g_dense,
    .guess = NULL,
    .head = g_head,
    .kda_rewind = g_kda_rewind,
};

const model_ops *gpu_ops(void) { return &ops; }
