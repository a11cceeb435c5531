/* backend_cpu.c — the CPU backend of the model's seam (backend.h): host memory for states and activations,
 * and the model's own layer code (kda.c, mla.c, moe.c, attn_res.c) on the kernels of kernels/kernels.h. The
 * output head (final norm, lm_head, tiles of a streamed lm_head) lives here. */
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

static void *cpu_mem_alloc(df_model *m, size_t bytes) {
    (void)m;
    return xcalloc(1, bytes ? bytes : 1);
}

static void *cpu_mem_realloc(df_model *m, void *p, size_t old_bytes, size_t new_bytes) {
    (void)m, (void)old_bytes;
    return xrealloc(p, new_bytes ? new_bytes : 1);
}

static void cpu_mem_free(df_model *m, void *p) {
    (void)m;
    free(p);
}

static void cpu_mem_copy(df_model *m, void *dst, const void *src, size_t bytes) {
    (void)m;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_mem_zero(df_model *m, void *p, size_t bytes) {
    (void)m;
    if (bytes) memset(p, 0, bytes);
}

static int cpu_pass_begin(df_model *m, const model_seg *seg, int n_seg, int T, df_error *err) {
    (void)m, (void)seg, (void)n_seg, (void)T, (void)err;
    return DF_OK;
}

/* The activations live in the model's scratch arena, which the pass releases itself. */
static int cpu_pass_end(df_model *m, int rc, df_error *err) {
    (void)m, (void)err;
    return rc;
}

static float *cpu_act(df_model *m, int64_t n) { return SCRATCH_F32(&m->sc, n); }

static int cpu_embed(df_model *m, const int32_t *tokens, int T, float *h, df_error *err) {
    (void)err;
    for (int t = 0; t < T; t++) tensor_row_f32(m->w.embed, tokens[t], h + (int64_t)t * m->cfg.d);
    return DF_OK;
}

static void cpu_rmsnorm(df_model *m, const float *w, const float *x, int T, float *out) {
    int d = m->cfg.d;
    for (int t = 0; t < T; t++) kern_rmsnorm(out + (int64_t)t * d, x + (int64_t)t * d, w, d, m->cfg.eps);
}

static void cpu_add(df_model *m, float *y, const float *x, int64_t n) {
    (void)m;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_copy(df_model *m, float *dst, const float *src, int64_t n) {
    (void)m;
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void cpu_attn_res(df_model *m, float *const *blocks, int nb, const float *p, const float *w_norm,
                         const float *w_proj, int T, float *out) {
    attn_res((const float *const *)blocks, nb, p, w_norm, w_proj, T, m->cfg.d, m->cfg.eps, out);
}

static int cpu_dense(df_fwd *f, const float *x, int T, float *out) {
    return ffn_dense_forward(f, &f->w->ffn, x, T, out);
}

/* Logits of the rows each session asked for (all its rows, or its last), in one product over them all. */
static int cpu_head(df_model *m, const float *h, model_seg *seg, int n_seg, df_error *err) {
    const df_config *c = &m->cfg;
    const df_tensor *lm = m->w.head;
    const float *w = m->w.norm;
    int rows = 0, T = 0;
    for (int j = 0; j < n_seg; j++) rows += seg[j].logits ? (seg[j].all_rows ? seg[j].T : 1) : 0;
    float *xn = SCRATCH_F32(&m->sc, (int64_t)rows * c->d);
    double t0 = df_now();
    int r = 0;
    for (int j = 0; j < n_seg; T += seg[j++].T) {
        if (!seg[j].logits) continue;
        for (int t = seg[j].all_rows ? 0 : seg[j].T - 1; t < seg[j].T; t++, r++)
            kern_rmsnorm(xn + (int64_t)r * c->d, h + (int64_t)(T + t) * c->d, w, c->d, c->eps);
    }
    int one = n_seg == 1;          /* a single session gets its logits written in place */
    float *out = one ? seg[0].logits : SCRATCH_F32(&m->sc, (int64_t)rows * c->vocab);
    int64_t per;
    int n_tiles = store_head_tiles(m->store, &per), rc = DF_OK;
    if (n_tiles <= 1) kern_matmul(m->kern, lm, xn, rows, out);
    float *part = n_tiles > 1 ? SCRATCH_F32(&m->sc, (int64_t)rows * per) : NULL;
    for (int j = 0; j < n_tiles && n_tiles > 1 && !rc; j++) {   /* lm_head streamed: rows j*per.. of the vocabulary */
        df_tensor tile;
        t0 = model_clock(&m->prof.lm_head, t0);
        rc = store_head_tile_acquire(m->store, j, &tile, err);
        t0 = model_clock(&m->prof.spine_read, t0);
        if (rc) break;
        kern_matmul(m->kern, &tile, xn, rows, part);
        store_head_tile_release(m->store, j);
        for (int t = 0; t < rows; t++)
            memcpy(out + (int64_t)t * c->vocab + (int64_t)j * per, part + (int64_t)t * tile.shape[0],
                   (size_t)tile.shape[0] * sizeof(float));
    }
    model_clock(&m->prof.lm_head, t0);
    r = 0;
    for (int j = 0; !one && !rc && j < n_seg; j++) {
        if (!seg[j].logits) continue;
        int n = seg[j].all_rows ? seg[j].T : 1;
        memcpy(seg[j].logits, out + (int64_t)r * c->vocab, (size_t)n * c->vocab * sizeof(float));
        r += n;
    }
    return rc;
}

static const model_ops cpu_ops = {
    .name = "cpu",
    .weights_resident = 0,
    .mem_alloc = cpu_mem_alloc,
    .mem_realloc = cpu_mem_realloc,
    .mem_free = cpu_mem_free,
    .mem_copy = cpu_mem_copy,
    .mem_zero = cpu_mem_zero,
    .mem_to_host = cpu_mem_copy,
    .mem_from_host = cpu_mem_copy,
    .pass_begin = cpu_pass_begin,
    .pass_end = cpu_pass_end,
    .act = cpu_act,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .copy = cpu_copy,
    .attn_res = cpu_attn_res,
    .kda = kda_forward,
    .mla = mla_forward,
    .moe = moe_forward,
    .dense = cpu_dense,
    .guess = moe_guess,
    .head = cpu_head,
    .kda_rewind = kda_rewind,
};

const model_ops *model_ops_cpu(void) { return &cpu_ops; }
