/* kernels.c — ISA selection from CPU features and the pooled entry points the model calls: matmuls split
 * over output rows (or columns, for the transposed use) and the general parallel-for. */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "kern_tiles.h"
#include "common/util.h"

static int cpu_has(const char *isa) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!strcmp(isa, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    if (!strcmp(isa, "avx2"))   /* every AVX2+FMA CPU also has F16C */
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    if (!strcmp(isa, "amx")) return cpu_has("avx512") && kern_amx_usable();
#if defined(__aarch64__)
    if (!strcmp(isa, "neon")) return 1;
#endif
    (void)isa;
    return 0;
}

int kern_available(const df_kernels **out, int cap) {
    const df_kernels *cand[] = {kern_amx(), kern_avx512(), kern_avx2(), kern_neon(), kern_scalar()};
    int n = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0] && n < cap; i++)
        if (cand[i] && (cand[i] == kern_scalar() || cpu_has(cand[i]->isa))) out[n++] = cand[i];
    return n;
}

int kern_init(df_kern *kc, int n_threads, const char *isa) {
    memset(kc, 0, sizeof *kc);
    if (!isa) isa = getenv("DELTAFIN_ISA");
    const df_kernels *av[8];
    int nav = kern_available(av, 8);
    kc->k = av[0];
    if (isa && *isa) {
        kc->k = NULL;
        for (int i = 0; i < nav; i++)
            if (!strcmp(av[i]->isa, isa)) kc->k = av[i];
        if (!kc->k) return -1;
    }
    kc->n_threads = n_threads > 0 ? n_threads : 1;
    kc->pool = pool_new(kc->n_threads);
    return 0;
}

void kern_free(df_kern *kc) {
    pool_free(kc->pool);
    free(kc->pack);
    memset(kc, 0, sizeof *kc);
}

/* inline_ok: whether the tasks may run on the calling thread when the pool is busy (a nested call). They
 * can unless they use thread indices, which would then collide with the outer job's. */
static void parallel_run(df_kern *kc, int n_tasks, void (*fn)(void *, int, int), void *ctx, int inline_ok) {
    if (n_tasks <= 0) return;
    if (n_tasks > 1 && kc->n_threads > 1 && !pool_run(kc->pool, n_tasks, fn, ctx)) return;
    if (n_tasks > 1 && kc->n_threads > 1 && !inline_ok)
        df_die("kern_parallel_for_t called from inside a pool task: per-thread indices would collide");
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
}

void kern_parallel_for_t(df_kern *kc, int n_tasks, void (*fn)(void *ctx, int task, int thread), void *ctx) {
    parallel_run(kc, n_tasks, fn, ctx, 0);
}

typedef struct {
    void (*fn)(void *ctx, int task);
    void *ctx;
} pf_plain;

static void pf_plain_run(void *ctx, int task, int thread) {
    (void)thread;
    pf_plain *p = ctx;
    p->fn(p->ctx, task);
}

void kern_parallel_for(df_kern *kc, int n_tasks, void (*fn)(void *ctx, int task), void *ctx) {
    pf_plain p = {fn, ctx};
    parallel_run(kc, n_tasks, pf_plain_run, &p, 1);
}

size_t kern_pack_floats(const df_kernels *k, const df_tensor *w, int n) {
    if (!(k->packed_dtypes & (1u << w->dtype))) return 0;
    return k->pack_floats ? k->pack_floats(w, n) : (size_t)n * w->shape[1];
}

void kern_pack_x_part(const df_kernels *k, const df_tensor *w, const float *x, int n, float *xp, int part,
                      int parts) {
    if (k->pack) k->pack(w, x, n, xp, part, parts);
    else kern_pack_x_mxfp4(w, x, n, xp, part, parts);
}

void kern_pack_x(const df_kernels *k, const df_tensor *w, const float *x, int n, float *xp) {
    kern_pack_x_part(k, w, x, n, xp, 0, 1);
}

void kern_pack_x_mxfp4(const df_tensor *w, const float *x, int n, float *xp, int part, int parts) {
    int64_t cols = w->shape[1], b0, b1;
    DF_ASSERT(w->dtype == DF_DT_MXFP4 && cols % 32 == 0);
    kern_pack_blocks(cols / 32, part, parts, &b0, &b1);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r * cols + b0 * 32; i < r * cols + b1 * 32; i += 32)
            for (int k = 0; k < 16; k++) {
                xp[i + k] = x[i + 2 * k];
                xp[i + 16 + k] = x[i + 2 * k + 1];
            }
}

void kern_die_dtype(const char *isa, const df_tensor *t) {
    df_die("kernels (%s): matmul of %s: unsupported weight dtype %s", isa, t->name ? t->name : "?",
           tensor_dtype_name(t->dtype));
}

void kern_matmul_tiles(const kern_tiles *ts, const df_tensor *t, int64_t r0, int64_t r1, const float *x, int n,
                       float *y, int64_t ldy) {
    int64_t cols = t->shape[1];
    const uint8_t *data = t->data, *scale = t->scale;
    kern_tiles_fn tiles = (unsigned)t->dtype < DF_DT_COUNT ? ts->fn[t->dtype] : NULL;
    if (!tiles) kern_die_dtype(ts->isa, t);
    int64_t row_bytes = (int64_t)tensor_row_bytes(t);
    const int full = ts->nw, pf_on = !!(ts->prefetch_dtypes & (1u << t->dtype));
    /* Weight rows in groups small enough to stay in L2 while every group of 4 activation rows passes. */
    int64_t group = row_bytes > 0 ? ((256 << 10) / row_bytes) / full * full : 0;
    if (group < full) group = full;
    for (int64_t g0 = r0; g0 < r1; g0 += group) {
        int64_t g1 = DF_MIN(g0 + group, r1);
        for (int a = 0; a < n; a += 4) {
            int na = DF_MIN(n - a, 4);
            const float *xa[4];
            for (int i = 0; i < na; i++) xa[i] = x + (int64_t)(a + i) * cols;
            for (int64_t r = g0; r < g1;) {
                int nw = g1 - r >= full ? full : 1;
                kern_wrow w[4];
                for (int j = 0; j < nw; j++) {
                    w[j].d = data + (r + j) * row_bytes;
                    w[j].s = scale ? scale + (r + j) * (cols / 32) : NULL;
                }
                float out[16];
                const uint8_t *pf = pf_on && r + 2 * nw <= g1 ? data + (r + nw) * row_bytes : NULL;
                tiles(nw, na, w, xa, cols, pf, out);
                for (int j = 0; j < nw; j++) {
                    float rs = t->dtype == DF_DT_I8 ? df_f16_to_f32(((const uint16_t *)scale)[r + j]) : 1.0f;
                    for (int i = 0; i < na; i++) y[(int64_t)(a + i) * ldy + r + j] = out[j * 4 + i] * rs;
                }
                r += nw;
            }
        }
    }
}

typedef struct {
    const df_kernels *k;
    const df_tensor *w;
    const float *x;
    int n;
    float *y;
    int64_t chunk;
} mm_job;

typedef struct {
    const df_kernels *k;
    const df_tensor *w;
    const float *x;
    int n, parts;
    float *xp;
} pack_job;

static void pack_task(void *ctx, int task) {
    pack_job *j = ctx;
    kern_pack_x_part(j->k, j->w, j->x, j->n, j->xp, task, j->parts);
}

static void mm_task(void *ctx, int task) {
    mm_job *j = ctx;
    int64_t r0 = task * j->chunk, r1 = DF_MIN(r0 + j->chunk, j->w->shape[0]);
    j->k->matmul_rows(j->w, r0, r1, j->x, j->n, j->y, j->w->shape[0]);
}

void kern_matmul(df_kern *kc, const df_tensor *w, const float *x, int n, float *y) {
    DF_ASSERT(w->ndim == 2);
    int64_t rows = w->shape[0], cols = w->shape[1];
    if (rows == 0 || n <= 0) return;
    float *xp = NULL, *own = NULL;
    size_t pack = kern_pack_floats(kc->k, w, n);
    if (pack) {
        /* Calls come from one thread at a time except from inside pool tasks (several at once): those pack into
         * their own buffer, the others into the kernel's, which then grows to the largest and stays. */
        if (pool_busy(kc->pool)) {
            xp = own = xmalloc(pack * sizeof(float));
        } else {
            if (pack > kc->pack_cap) {
                free(kc->pack);
                kc->pack = xmalloc(pack * sizeof(float));
                kc->pack_cap = pack;
            }
            xp = kc->pack;
        }
        /* the AMX packing of 16 rows takes ~20 us, 3% of the call, with the other threads idle */
        pack_job pj = {kc->k, w, x, n, (int64_t)n * cols >= 32768 ? kc->n_threads : 1, xp};
        kern_parallel_for(kc, pj.parts, pack_task, &pj);
    }
    mm_job j = {kc->k, w, xp ? xp : x, n, y, rows};
    /* A few tasks per thread so a slow core does not hold the rest up; rows in multiples of 16 so the 4-row
     * register tiles stay full. Small products are not worth waking the pool for. */
    int64_t work = rows * cols * (n < 16 ? n : 16);
    if (kc->n_threads > 1 && work >= 65536) {
        int64_t tasks = (int64_t)kc->n_threads * (kc->k->tasks_per_thread ? kc->k->tasks_per_thread(w, n) : 4);
        j.chunk = (rows + tasks - 1) / tasks;
        j.chunk = DF_MAX((j.chunk + 15) / 16 * 16, 16);
    }
    kern_parallel_for(kc, (int)((rows + j.chunk - 1) / j.chunk), mm_task, &j);
    free(own);
}

typedef struct {
    const df_tensor *w;
    const float *x;
    int n;
    float *y;
    int64_t chunk;
} mmt_job;

/* Columns [c0, c1) of every row: y[i, c] += x[i, r] * W[r, c]. */
static void mmt_task(void *ctx, int task) {
    mmt_job *j = ctx;
    const df_tensor *w = j->w;
    int64_t rows = w->shape[0], cols = w->shape[1];
    int64_t c0 = task * j->chunk, c1 = DF_MIN(c0 + j->chunk, cols), m = c1 - c0;
    float seg[256];
    for (int i = 0; i < j->n; i++) memset(j->y + i * cols + c0, 0, m * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *d = w->data;
        for (int64_t c = 0; c < m; c++) {
            int64_t e = r * cols + c0 + c;
            switch (w->dtype) {
            case DF_DT_F32: memcpy(&seg[c], d + e * 4, 4); break;
            case DF_DT_BF16: seg[c] = df_bf16_to_f32(((const uint16_t *)w->data)[e]); break;
            default: seg[c] = df_f16_to_f32(((const uint16_t *)w->data)[e]); break;
            }
        }
        for (int i = 0; i < j->n; i++) {
            float a = j->x[(int64_t)i * rows + r];
            float *yi = j->y + (int64_t)i * cols + c0;
            for (int64_t c = 0; c < m; c++) yi[c] += a * seg[c];
        }
    }
}

void kern_matmul_t(df_kern *kc, const df_tensor *w, const float *x, int n, float *y) {
    DF_ASSERT(w->ndim == 2);
    if (w->dtype != DF_DT_F32 && w->dtype != DF_DT_BF16 && w->dtype != DF_DT_F16)
        df_die("kern_matmul_t: dtype %s of %s not supported (F32/BF16/F16 only)", tensor_dtype_name(w->dtype),
               w->name ? w->name : "?");
    int64_t cols = w->shape[1];
    if (cols == 0 || n <= 0) return;
    mmt_job j = {w, x, n, y, 256};
    kern_parallel_for(kc, (int)((cols + j.chunk - 1) / j.chunk), mmt_task, &j);
}
