/* backend.h — the seam between the model's one layer loop (forward.c) and where its arithmetic runs.
 *
 * The layer loop, the pass's segmentation into mixer blocks, snapshots, rollback bookkeeping and the state's
 * layout are the model's; a backend supplies the coarse operations they are made of, over memory it owns:
 * activation buffers of a pass (model_ops.act), the per-session state (KDA states and convolution tails, MLA
 * latent caches, rollback records: model_ops.mem_*) and its own copy of the weights when weights_resident is
 * set. The CPU backend (backend_cpu.c) is the model's own code in kda.c, mla.c, moe.c, attn_res.c and
 * forward.c; another backend (src/gpu) implements the same operations on a device. A pointer handed to or
 * returned by these operations is the backend's (a device address for a device backend): the model passes
 * it on, offsets it by element counts and never reads it. Only token ids go in and logits come out through
 * host memory. Internal to src/model and the backends. */
#ifndef DF_BACKEND_H
#define DF_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

struct df_model;
struct df_fwd;
struct fwd_seg;
struct model_seg;
struct df_layer_state;

typedef struct model_ops {
    const char *name;
    /* The backend holds every weight the pass uses (copied at open): the layer loop acquires no storage. */
    int weights_resident;

    /* Session state memory. mem_alloc returns zeroed bytes; mem_realloc keeps the first old bytes; a failed
     * allocation aborts, as host allocations do (the budget checked at open leaves room for the states). */
    void *(*mem_alloc)(struct df_model *m, size_t bytes);
    void *(*mem_realloc)(struct df_model *m, void *p, size_t old_bytes, size_t new_bytes);
    void (*mem_free)(struct df_model *m, void *p);
    void (*mem_copy)(struct df_model *m, void *dst, const void *src, size_t bytes);
    void (*mem_zero)(struct df_model *m, void *p, size_t bytes);
    void (*mem_to_host)(struct df_model *m, void *host, const void *src, size_t bytes);
    void (*mem_from_host)(struct df_model *m, void *dst, const void *host, size_t bytes);

    /* A pass over the segments seg[0..n_seg) (T rows in all): pass_begin before its first operation, pass_end
     * after its last (rc: the pass's status so far; returns it, or the first error the backend saw, e.g. a fault
     * reported late by a device). act: n floats of the pass's activation memory, valid until pass_end. */
    int (*pass_begin)(struct df_model *m, const struct model_seg *seg, int n_seg, int T, df_error *err);
    int (*pass_end)(struct df_model *m, int rc, df_error *err);
    float *(*act)(struct df_model *m, int64_t n);

    /* h[T, d] = embedding rows of tokens (already checked to be in the vocabulary). */
    int (*embed)(struct df_model *m, const int32_t *tokens, int T, float *h, df_error *err);
    /* out[t] = RMSNorm(x[t]) * w over T rows of width d with the model's eps; w a resident weight vector. */
    void (*rmsnorm)(struct df_model *m, const float *w, const float *x, int T, float *out);
    void (*add)(struct df_model *m, float *y, const float *x, int64_t n);        /* y += x */
    void (*copy)(struct df_model *m, float *dst, const float *src, int64_t n);
    /* Block attention residuals over the candidates blocks[0..nb), p (attn_res of layer.h). */
    void (*attn_res)(struct df_model *m, float *const *blocks, int nb, const float *p, const float *w_norm,
                     const float *w_proj, int T, float *out);
    /* The layer's mixer and FFN (layer.h: kda_forward, mla_forward, moe_forward, ffn_dense_forward). */
    int (*kda)(struct df_fwd *f, const struct fwd_seg *seg, int n_seg, const float *x, int T, float *out);
    int (*mla)(struct df_fwd *f, const struct fwd_seg *seg, int n_seg, const float *x, int T, float *out);
    int (*moe)(struct df_fwd *f, const float *x, int T, float *out);
    int (*dense)(struct df_fwd *f, const float *x, int T, float *out);
    /* Look-ahead of the layer's experts before its attention (moe_guess); NULL: none. */
    void (*guess)(struct df_fwd *f, const float *h, int T);
    /* Final norm and lm_head for the rows each segment asks for; logits land in the segments' host buffers. */
    int (*head)(struct df_model *m, const float *h, struct model_seg *seg, int n_seg, df_error *err);
    /* Returns a KDA layer's state to n tokens after the start of its recorded evaluation of T rows. */
    void (*kda_rewind)(struct df_model *m, struct df_layer_state *st, int T, int n);
} model_ops;

/* The model's own code on the CPU kernels (kernels/kernels.h). */
const model_ops *model_ops_cpu(void);

#endif
