/* kernels.h — the numeric kernels the model calls, behind one dispatch table chosen at start.
 *
 * Kernels know nothing about models: they take shapes, pointers and a thread pool. Activations are fp32;
 * weights are any df_tensor dtype (F32, BF16, F16, MXFP4, I8) and are never expanded to fp32 copies:
 * dequantisation happens inside the dot products. Every ISA path computes exact fp32 products of the
 * dequantised weight and the fp32 activation; paths differ from the scalar reference only in summation order
 * (and, for I8, in applying the row scale after the sum instead of to each weight). The AMX path (MXFP4 with
 * 4+ activation rows, kernels_amx.c) gets the same exact products from bf16 tile multiplies by splitting each
 * activation into three bf16 parts; its only other difference, flushing of values below 2^-126 after a
 * per-row power-of-two scaling, is bounded in docs/PERFORMANCE.md.
 *
 * A df_kern is created once per engine and owns the thread pool (created in kern_init, joined in kern_free;
 * no per-call thread creation). Calls on one df_kern come from one thread at a time, except that the pooled
 * calls (kern_matmul, kern_matmul_t, kern_parallel_for) may be made from inside a kern_parallel_for task: they
 * then run on that task's thread alone, so per-expert or per-head work can be spread over the pool while each
 * piece uses the ordinary kernels. */
#ifndef DF_KERNELS_H
#define DF_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "common/tensor.h"

/* One ISA's implementation. matmul_rows computes, for weight rows [r0, r1):
 *   y[i*ldy + r] = sum_c x[i*cols + c] * W[r, c]     for i in [0, n)
 * and must handle any r0/r1/n/cols (cols a multiple of 32 for MXFP4). For a dtype whose bit is set in
 * packed_dtypes, x is not given as is but as kern_pack_x rearranged it (see there). */
typedef struct df_kernels {
    const char *isa;
    unsigned packed_dtypes;   /* bit (1u << dtype): matmul_rows reads x packed by kern_pack_x */
    /* The ISA's own packing, or both NULL for kern_pack_x_mxfp4's layout: pack_floats gives the size of the
     * packed x in floats, pack writes part `part` of `parts` of it (parts may run at once on different
     * threads; together they write all of it). */
    size_t (*pack_floats)(const df_tensor *w, int n);
    void (*pack)(const df_tensor *w, const float *x, int n, float *xp, int part, int parts);
    /* How many pool tasks per thread kern_matmul makes for w and n; NULL: 4. */
    int (*tasks_per_thread)(const df_tensor *w, int n);
    void (*matmul_rows)(const df_tensor *w, int64_t r0, int64_t r1, const float *x, int n, float *y,
                        int64_t ldy);
    /* Reads bytes [0, n) (n a multiple of 256, p 64-byte aligned) as fast as this ISA can; returns a checksum
     * so the reads cannot be optimised away. The memory-bandwidth yardstick of `deltafin bench kernels`. */
    uint64_t (*read_bytes)(const void *p, size_t n);
} df_kernels;

typedef struct df_pool df_pool;

typedef struct df_kern {
    const df_kernels *k;
    df_pool *pool;
    int n_threads;
    float *pack;               /* kern_matmul's packed x outside pool tasks, kept for the next call */
    size_t pack_cap;           /* floats in pack */
} df_kern;

/* isa: NULL = best for this CPU (the DELTAFIN_ISA env var overrides), or "scalar", "avx2", "avx512",
 * "amx" (AVX-512 plus AMX tiles for MXFP4 with several activation rows), "neon". Fails (returns -1) if the ISA named is not available. n_threads <= 0 means 1. */
int kern_init(df_kern *kc, int n_threads, const char *isa);
void kern_free(df_kern *kc);
/* Fills out with the ISAs compiled into this binary that this CPU supports, best first (scalar last);
 * returns how many (at most cap). */
int kern_available(const df_kernels **out, int cap);
const df_kernels *kern_scalar(void);
/* The ISA-specific tables; NULL when not compiled in. Callers must check the CPU (kern_available does). */
const df_kernels *kern_avx2(void);
const df_kernels *kern_avx512(void);
const df_kernels *kern_neon(void);
const df_kernels *kern_amx(void);
/* Whether the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and the OS grants this process the tile state
 * (asking for it, on Linux, is part of the check). */
int kern_amx_usable(void);

/* y[n, W.rows] = x[n, W.cols] · Wᵀ, split over the pool. */
void kern_matmul(df_kern *kc, const df_tensor *w, const float *x, int n, float *y);
/* y[n, W.cols] = x[n, W.rows] · W  (transposed use: absorbed MLA). F32/BF16/F16 only. */
void kern_matmul_t(df_kern *kc, const df_tensor *w, const float *x, int n, float *y);

/* Runs fn(ctx, task) for task in [0, n_tasks) on the pool (the calling thread works too) and returns when
 * all are done. Tasks are handed out dynamically, in increasing order. kern_parallel_for_t also passes the
 * index of the thread running the task, in [0, kc->n_threads), for per-thread scratch buffers. */
void kern_parallel_for(df_kern *kc, int n_tasks, void (*fn)(void *ctx, int task), void *ctx);
void kern_parallel_for_t(df_kern *kc, int n_tasks, void (*fn)(void *ctx, int task, int thread), void *ctx);

/* The x that k->matmul_rows expects for w when w's dtype is in k->packed_dtypes: kern_pack_floats(k, w, n)
 * floats (0 when x is used as is), written by kern_pack_x, or by kern_pack_x_part for part in [0, parts). */
size_t kern_pack_floats(const df_kernels *k, const df_tensor *w, int n);
void kern_pack_x(const df_kernels *k, const df_tensor *w, const float *x, int n, float *xp);
void kern_pack_x_part(const df_kernels *k, const df_tensor *w, const float *x, int n, float *xp, int part,
                      int parts);
/* The common MXFP4 layout: each 32-column block stored as its 16 even columns then its 16 odd columns (the
 * order of the low then high nibbles of the 16 packed bytes). xp holds n*cols floats. Part `part` of
 * `parts` writes the blocks [b0, b1) of kern_pack_blocks of every row. */
void kern_pack_x_mxfp4(const df_tensor *w, const float *x, int n, float *xp, int part, int parts);
/* The blocks [*b0, *b1) of nb that part `part` of `parts` of a packing covers. */
static inline void kern_pack_blocks(int64_t nb, int part, int parts, int64_t *b0, int64_t *b1) {
    *b0 = nb * part / parts;
    *b1 = nb * (part + 1) / parts;
}

/* Small fused pieces (per row of width d, rows contiguous). */
void kern_rmsnorm(float *out, const float *x, const float *w, int d, float eps);  /* w may be NULL */
float kern_dot(const float *a, const float *b, int n);
void kern_silu_mul(float *g, const float *u, int n);                              /* g = silu(g)*u */
void kern_situ_mul(float *g, const float *u, int n, float beta, float beta_lin);  /* beta_lin<=0: u raw */
void kern_softmax(float *x, int n);
static inline float kern_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
static inline float kern_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

/* E8M0 scale byte → 2^(s-127) as an fp32 bit pattern (s = 0 is the subnormal 2^-127; s = 255 gives inf,
 * as ldexpf does). Shared by the ISA files. */
static inline uint32_t kern_e8m0_bits(uint8_t s) { return s ? (uint32_t)s << 23 : 0x00400000u; }

/* Aborts naming the tensor: a weight dtype the matmuls do not take is a programming error (storage hands out
 * only F32/F16/BF16/MXFP4/I8 matrices). */
_Noreturn void kern_die_dtype(const char *isa, const df_tensor *t);

/* Thread pool (pool.c). n_threads counts the caller: n_threads - 1 workers are started. */
df_pool *pool_new(int n_threads);
void pool_free(df_pool *p);
/* Returns 0 if it ran the tasks on the pool, or -1 without running anything if the pool is already busy
 * (a call from inside a task): the caller then runs the tasks itself. */
int pool_run(df_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int thread), void *ctx);
/* Whether a job is in flight (the caller is inside a pool task, or another thread is). */
int pool_busy(df_pool *p);

#endif
