/* kernels.h — the numeric kernels the model calls, behind one dispatch table chosen at start.
 *
 * Kernels know nothing about models: they take shapes, pointers and a thread pool. Activations are fp32;
 * weights are any df_tensor dtype (F32, BF16, F16, MXFP4, I8) and are never expanded to fp32 copies:
 * dequantisation happens inside the dot products. A df_kern is created once per engine and owns the
 * thread pool; its calls are not re-entrant (one forward pass at a time per df_kern). */
#ifndef DF_KERNELS_H
#define DF_KERNELS_H

#include <stdint.h>
#include "../common/tensor.h"

/* One ISA's implementation. matmul_rows computes, for weight rows [r0, r1):
 *   y[i*ldy + r] = sum_c x[i*cols + c] * W[r, c]     for i in [0, n)
 * and must handle any r0/r1/n/cols (cols a multiple of 32 for MXFP4). */
typedef struct df_kernels {
    const char *isa;
    void (*matmul_rows)(const df_tensor *w, int64_t r0, int64_t r1, const float *x, int n, float *y,
                        int64_t ldy);
} df_kernels;

typedef struct df_pool df_pool;

typedef struct df_kern {
    const df_kernels *k;
    df_pool *pool;
    int n_threads;
} df_kern;

/* isa: NULL = best for this CPU (the DELTAFIN_ISA env var overrides), or "scalar", "avx2", "avx512",
 * "neon". Fails (returns -1) if the ISA named is not available. */
int kern_init(df_kern *kc, int n_threads, const char *isa);
void kern_free(df_kern *kc);
/* All ISAs compiled into this binary that the CPU supports, NULL-terminated. */
const df_kernels *const *kern_available(void);
const df_kernels *kern_scalar(void);

/* y[n, W.rows] = x[n, W.cols] · Wᵀ, split over the pool. */
void kern_matmul(df_kern *kc, const df_tensor *w, const float *x, int n, float *y);
/* y[n, W.cols] = x[n, W.rows] · W  (transposed use: absorbed MLA). F32/BF16/F16 only. */
void kern_matmul_t(df_kern *kc, const df_tensor *w, const float *x, int n, float *y);

/* Small fused pieces (per row of width d, rows contiguous). */
void kern_rmsnorm(float *out, const float *x, const float *w, int d, float eps);  /* w may be NULL */
float kern_dot(const float *a, const float *b, int n);
void kern_silu_mul(float *g, const float *u, int n);                              /* g = silu(g)*u */
void kern_situ_mul(float *g, const float *u, int n, float beta, float beta_lin);  /* beta_lin<=0: u raw */
void kern_softmax(float *x, int n);
static inline float kern_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
static inline float kern_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

#endif
