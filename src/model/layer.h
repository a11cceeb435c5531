/* layer.h — what the per-layer forward files (kda.c, mla.c, moe.c, attn_res.c) share: the context of
 * one layer's step, with its bound weights and the pass's scratch arena. Internal to src/model. */
#ifndef DF_LAYER_H
#define DF_LAYER_H

#include "model.h"

/* The rows [row0, row0 + T) of a pass belong to state s, whose position before the pass is s->pos. */
typedef struct fwd_seg {
    df_state *s;
    int64_t row0;
    int T;
    int64_t pos;     /* the session's position of the segment's first row */
    int record;      /* keep what a rollback needs (state_records of the session's whole evaluation) */
    df_state *snap;  /* a non-recording segment's snapshot (model_seg): its KDA layers at snap_at */
    int64_t snap_at;
} fwd_seg;

typedef struct df_fwd {
    df_model *m;
    const layer_weights *w;    /* this layer's weights; matrices usable while the layer is acquired */
    int layer;
    scratch *sc;               /* &m->sc */
    df_error *err;
    const df_store_layer *L;   /* the acquired layer (its spine) */
    int remote;                /* the layer's matrices are on another rank (model_peers.spine_rank) */
} df_fwd;

/* Makes one of this layer's matrices usable (store_layer_need: a layer streamed in parts swaps in the part
 * holding it); called right before each use, in the order the mixers and FFNs use them. The wait counts as
 * spine reading. */
int fwd_need(df_fwd *f, const df_tensor *w);
/* out[T, rows of w] = x w^T once w is usable (fwd_need), or computed by the rank holding the layer's spine;
 * non-zero when its part cannot be read or that rank fails. */
int fwd_matmul(df_fwd *f, const df_tensor *w, const float *x, int T, float *out);
/* out[i] = x w[i]^T for n matrices of the same width, in order: the same as n fwd_matmul calls, but a layer on
 * another rank takes them in one round trip. */
int fwd_matmul_n(df_fwd *f, int n, const df_tensor *const *w, const float *x, int T, float *const *out);

/* Mixers and FFNs: x/out are [T, d] (all rows of the pass); out is overwritten. The mixers run each of
 * the n_seg sessions of the pass on its own layer state. Scratch taken from f->sc is released on return. */
int kda_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out);
int mla_forward(df_fwd *f, const fwd_seg *seg, int n_seg, const float *x, int T, float *out);
/* KDA rollback record: the floats a layer's record takes for a pass of T rows; kda_rewind returns the
 * layer's state to n tokens after the start of the recorded pass of T rows. */
int64_t kda_record_floats(const df_config *c, int T);
/* Where the parts of a layer's record lie for T rows (in the backend's memory): S and conv at the pass start,
 * then per row the pre-conv inputs (three [T, P] blocks) and the recurrence's k, v, g [T, P] and beta [T, H]. */
typedef struct kda_record {
    float *S0, *conv0, *pre[3], *k, *v, *g, *beta;
} kda_record;
kda_record kda_record_at(const df_config *c, float *base, int T);
/* Makes room for the record of T rows in st and copies S and conv into it (the backend's mem ops). */
kda_record kda_record_begin(df_model *m, df_layer_state *st, int T);
void kda_rewind(df_model *m, df_layer_state *st, int T, int n);
int ffn_dense_forward(df_fwd *f, const glu_weights *g, const float *x, int T, float *out);
int moe_forward(df_fwd *f, const float *x, int T, float *out);
/* Look-ahead: guesses the layer's routed experts from its input h [T, d] before its attention runs, and hints
 * storage, which may read them while attention computes (df_engine_opts.lookahead). */
void moe_guess(df_fwd *f, const float *h, int T);
size_t moe_guess_scratch_bytes(const df_config *c, int T);

/* Scratch bytes of one layer's mixer (kda_scratch_bytes, mla_scratch_bytes) or FFN (moe_scratch_bytes, dense
 * GLU: glu_scratch_bytes) for a pass of T rows over n_threads threads; S: the longest context (pos + T) covered. */
size_t kda_scratch_bytes(const df_config *c, int T, int n_threads);
size_t mla_scratch_bytes(const df_config *c, int T, int n_threads, int64_t S);
size_t moe_scratch_bytes(const df_config *c, int T);
size_t glu_scratch_bytes(int inter, int T);

/* Block Attention Residuals: out[t] = sum_j a_j V_j[t] over candidates blocks[0..nb-1], p. */
void attn_res(const float *const *blocks, int nb, const float *p, const float *w_norm, const float *w_proj,
              int T, int d, float eps, float *out);

#endif
