/* layer.h — what the per-layer forward files (kda.c, mla.c, moe.c, attn_res.c) share: the context of
 * one layer's step and checked access to its spine tensors. Internal to src/model. */
#ifndef DF_LAYER_H
#define DF_LAYER_H

#include "model.h"

/* The rows [row0, row0 + T) of a pass belong to state s, whose position before the pass is s->pos. */
typedef struct fwd_seg {
    df_state *s;
    int64_t row0;
    int T;
} fwd_seg;

typedef struct df_fwd {
    df_model *m;
    const df_store_layer *L;   /* acquired spine of this layer */
    int layer;
    df_error *err;
} df_fwd;

/* A matrix [rows, cols] of this layer, or NULL with err set (missing, wrong shape, unusable dtype). */
const df_tensor *fwd_mat(df_fwd *f, const char *suffix, int64_t rows, int64_t cols);
/* A vector of at least n elements converted to fp32 into a new buffer (caller frees), or NULL with err set.
 * exact: the element count must equal n. */
float *fwd_vec(df_fwd *f, const char *suffix, int64_t n, int exact);
/* Same checks for a top-level tensor (layer = -1 in messages). */
const df_tensor *model_global_mat(df_model *m, const char *name, int64_t rows, int64_t cols, df_error *err);
float *model_global_vec(df_model *m, const char *name, int64_t n, df_error *err);
int tensor_check_mat(const df_tensor *t, const char *name, int64_t rows, int64_t cols, const char *dir,
                     df_error *err);

/* Mixers and FFNs: x/out are [T, d] (all rows of the pass); out is overwritten. The mixers run each of
 * the n_seg sessions of the pass on its own layer state. */
int kda_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out);
int mla_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out);
/* KDA rollback record: the floats a layer's record takes for a pass of T rows; kda_rewind returns the
 * layer's state to n tokens after the start of the recorded pass of T rows. */
int64_t kda_record_floats(const df_config *c, int T);
void kda_rewind(df_model *m, df_layer_state *st, int T, int n);
int ffn_dense_forward(df_fwd *f, const char *prefix, int inter, const float *x, int T, float *out);
int moe_forward(df_fwd *f, const float *x, int T, float *out);

/* Checks a layer's tensors (names, shapes, dtypes) without computing. */
int kda_check(df_fwd *f);
int mla_check(df_fwd *f);
int moe_check(df_fwd *f);
int ffn_dense_check(df_fwd *f);

/* Block Attention Residuals: out[t] = sum_j a_j V_j[t] over candidates blocks[0..nb-1], p. */
void attn_res(const float *const *blocks, int nb, const float *p, const float *w_norm, const float *w_proj,
              int T, int d, float eps, float *out);

#endif
