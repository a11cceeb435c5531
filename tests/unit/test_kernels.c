/* test_kernels.c — every ISA path of the kernels (scalar included) against a double-precision reference
 * that decodes the weight formats itself, and against the scalar path, on awkward shapes; plus the thread
 * pool, the transposed matmul and the small fused pieces. ISA paths this CPU lacks are reported as skipped
 * and never called. Also cross-compiled for aarch64 and run under qemu (tests/shell/test_neon_qemu.sh),
 * where it covers the NEON path. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/kernels.h"
#include "common/util.h"
#include "test.h"

typedef struct {
    uint64_t s;
} rng;

static uint32_t rng_u32(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}

static float rng_f(rng *r) { return (float)((rng_u32(r) & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

/* A random matrix of dtype dt with its own storage. */
typedef struct {
    df_tensor t;
    void *data, *scale;
} mat;

static mat mat_random(df_dtype dt, int64_t rows, int64_t cols, rng *r) {
    mat m = {0};
    m.t.name = "test.weight";
    m.t.dtype = dt;
    m.t.ndim = 2;
    m.t.shape[0] = rows;
    m.t.shape[1] = cols;
    int64_t ne = rows * cols;
    switch (dt) {
    case DF_DT_F32: {
        float *p = m.data = xmalloc(ne * 4);
        for (int64_t i = 0; i < ne; i++) p[i] = rng_f(r);
        break;
    }
    case DF_DT_BF16: case DF_DT_F16: {
        uint16_t *p = m.data = xmalloc(ne * 2);
        for (int64_t i = 0; i < ne; i++) p[i] = dt == DF_DT_BF16 ? df_f32_to_bf16(rng_f(r)) : df_f32_to_f16(rng_f(r));
        break;
    }
    case DF_DT_I8: {
        int8_t *p = m.data = xmalloc(ne);
        uint16_t *s = m.scale = xmalloc(rows * 2);
        for (int64_t i = 0; i < ne; i++) p[i] = (int8_t)(rng_u32(r) & 0xff);
        for (int64_t i = 0; i < rows; i++) s[i] = df_f32_to_f16(0.001f + 0.02f * fabsf(rng_f(r)));
        break;
    }
    case DF_DT_MXFP4: {
        uint8_t *p = m.data = xmalloc(ne / 2);
        uint8_t *s = m.scale = xmalloc(ne / 32);
        for (int64_t i = 0; i < ne / 2; i++) p[i] = (uint8_t)rng_u32(r);
        for (int64_t i = 0; i < ne / 32; i++) s[i] = (uint8_t)(118 + rng_u32(r) % 12);
        if (ne / 32 > 1) s[0] = 0, s[1] = 1;   /* the subnormal scales 2^-127 and 2^-126 */
        break;
    }
    default: break;
    }
    m.t.data = m.data;
    m.t.scale = m.scale;
    return m;
}

static void mat_free(mat *m) {
    free(m->data);
    free(m->scale);
}

/* The weight formats decoded here from their definitions, not by the tensor module the kernels use. */
static double ref_f16(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

static double ref_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* E2M1: sign, 2 exponent bits, 1 mantissa bit (exponent 0 is the subnormal 0 / 0.5). */
static double ref_e2m1(unsigned q) {
    int e = (q >> 1) & 3, m = q & 1;
    double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
    return q & 8 ? -v : v;
}

static double ref_weight(const df_tensor *w, int64_t r, int64_t c) {
    int64_t cols = w->shape[1], i = r * cols + c;
    switch (w->dtype) {
    case DF_DT_F32: return ((const float *)w->data)[i];
    case DF_DT_F16: return ref_f16(((const uint16_t *)w->data)[i]);
    case DF_DT_BF16: return ref_bf16(((const uint16_t *)w->data)[i]);
    case DF_DT_I8: return ((const int8_t *)w->data)[i] * ref_f16(((const uint16_t *)w->scale)[r]);
    case DF_DT_MXFP4: {   /* two columns per byte, the even one in the low nibble; 2^(s-127) per 32 columns */
        uint8_t b = ((const uint8_t *)w->data)[i / 2];
        return ref_e2m1(c % 2 ? b >> 4 : b & 15) * ldexp(1.0, ((const uint8_t *)w->scale)[i / 32] - 127);
    }
    default: return NAN;
    }
}

/* y = x · Wᵀ in double, and mag = sum_c |x_c * w_c| per output (the scale of the rounding error). */
static void ref_matmul(const df_tensor *w, const float *x, int n, double *y, double *mag) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) {
            double s = 0, a = 0;
            for (int64_t c = 0; c < cols; c++) {
                double p = (double)x[i * cols + c] * ref_weight(w, r, c);
                s += p;
                a += fabs(p);
            }
            y[i * rows + r] = s;
            mag[i * rows + r] = a;
        }
}

/* Largest |got - want| / (mag * bound) over all outputs, bound = k*u / (1 - k*u) with k = cols + 2 and
 * u = 2^-24: an fp32 sum of cols rounded products, in any order, plus one rounding for a scale applied after
 * the sum, stays within it (barring underflow). A result <= 1 is a pass; NaN counts as the worst. */
static double max_err_vs_double(const df_tensor *w, const float *x, int n, const float *got) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    double *want = xmalloc(n * rows * sizeof(double)), *mag = xmalloc(n * rows * sizeof(double));
    ref_matmul(w, x, n, want, mag);
    double ku = (double)(cols + 2) * ldexp(1.0, -24), bound = ku / (1 - ku), worst = 0;
    for (int64_t k = 0; k < n * rows; k++) {
        double e = fabs(got[k] - want[k]) / ((mag[k] + 1e-30) * bound);
        if (!(e <= worst)) worst = e;
    }
    free(want);
    free(mag);
    return worst;
}

/* Largest |got - want| relative to sum_c |x_c * w_c| of that output, over all outputs. */
static double max_rel_err(const df_tensor *w, const float *x, int n, const float *got, const float *want) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) {
            double mag = 1e-30;
            for (int64_t c = 0; c < cols; c++) mag += fabs((double)x[i * cols + c] * ref_weight(w, r, c));
            double e = fabs((double)got[i * rows + r] - want[i * rows + r]) / mag;
            if (!(e <= worst)) worst = e;   /* NaN counts as worst */
        }
    return worst;
}

static const df_dtype dtypes[] = {DF_DT_F32, DF_DT_F16, DF_DT_BF16, DF_DT_I8, DF_DT_MXFP4};
/* Tolerance per dtype, relative to sum |x·w|: every path multiplies the exact dequantised weight by the fp32
 * activation and sums in fp32, so only summation order differs (I8: the row scale is applied after the sum,
 * one more rounding). */
static double tolerance(df_dtype dt) { return dt == DF_DT_I8 ? 2e-6 : 1e-6; }

static void check_isa_matmul(const df_kernels *k, rng *r) {
    static const struct { int64_t rows, cols; int n; } shapes[] = {
        {1, 32, 1}, {1, 64, 7}, {3, 96, 2}, {5, 160, 3}, {7, 64, 4}, {13, 288, 5}, {33, 256, 1},
        {66, 512, 9}, {129, 1024, 17}, {300, 96, 33}, {4, 4096, 1}, {17, 7168, 2},
    };
    static const int64_t odd_cols[] = {1, 7, 17, 37, 100, 129};
    df_kern kc;
    CHECK(kern_init(&kc, 2, k->isa) == 0, "%s: kern_init", k->isa);
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
        df_dtype dt = dtypes[di];
        double worst = 0, worst_ref = 0;
        int bad_split = 0, bad_pack = 0;
        int n_cases = (int)(sizeof shapes / sizeof shapes[0]) + (dt == DF_DT_MXFP4 ? 0 : 6);
        for (int s = 0; s < n_cases; s++) {
            int64_t rows, cols;
            int n;
            if (s < (int)(sizeof shapes / sizeof shapes[0])) {
                rows = shapes[s].rows, cols = shapes[s].cols, n = shapes[s].n;
            } else {
                cols = odd_cols[s - sizeof shapes / sizeof shapes[0]], rows = 11 + s, n = 1 + s % 6;
            }
            mat m = mat_random(dt, rows, cols, r);
            float *x = xmalloc(n * cols * sizeof(float));
            float *xp = xcalloc(kern_pack_floats(k, &m.t, n) + 1, sizeof(float));   /* header padding: 0 */
            float *want = xmalloc(n * rows * sizeof(float)), *got = xmalloc(n * rows * sizeof(float));
            float *part = xmalloc(n * rows * sizeof(float));
            for (int64_t i = 0; i < n * cols; i++) x[i] = rng_f(r) * 4.0f;
            kern_scalar()->matmul_rows(&m.t, 0, rows, x, n, want, rows);
            kern_matmul(&kc, &m.t, x, n, got);
            double e = max_rel_err(&m.t, x, n, got, want);
            if (!(e <= worst)) worst = e;
            e = max_err_vs_double(&m.t, x, n, got);
            if (!(e <= worst_ref)) worst_ref = e;
            /* the table entry on an odd row range, as the pool's chunks call it */
            const float *xk = x;
            size_t pf = kern_pack_floats(k, &m.t, n);
            if (pf) {
                kern_pack_x(k, &m.t, x, n, xp);
                xk = xp;
                /* packed in 3 parts, last first (as threads may run them): the same floats */
                float *xq = xcalloc(pf + 1, sizeof(float));
                for (int q = 2; q >= 0; q--) kern_pack_x_part(k, &m.t, x, n, xq, q, 3);
                if (memcmp(xq, xp, pf * sizeof(float))) bad_pack++;
                free(xq);
            }
            int64_t r0 = rows / 3, r1 = rows - rows / 5;
            memcpy(part, got, n * rows * sizeof(float));
            k->matmul_rows(&m.t, r0, r1, xk, n, part, rows);
            for (int i = 0; i < n; i++)
                for (int64_t q = r0; q < r1; q++)
                    if (part[i * rows + q] != got[i * rows + q]) bad_split++;
            free(x), free(xp), free(want), free(got), free(part);
            mat_free(&m);
        }
        CHECK(worst_ref <= 1.0, "%s %s: matmul vs double-precision reference, %d shapes, max error %.2g of the "
              "fp32 summation bound", k->isa, tensor_dtype_name(dt), n_cases, worst_ref);
        if (k != kern_scalar())
            CHECK(worst <= tolerance(dt), "%s %s: matmul vs the scalar path, %d shapes, max rel err %.2g <= %.0g",
                  k->isa, tensor_dtype_name(dt), n_cases, worst, tolerance(dt));
        if (k->packed_dtypes & (1u << dt))
            CHECK(bad_pack == 0, "%s %s: packing x in parts gives the whole packing (%d shapes differ)", k->isa,
                  tensor_dtype_name(dt), bad_pack);
        CHECK(bad_split == 0, "%s %s: a row's result does not depend on how rows are split (%d differ)", k->isa,
              tensor_dtype_name(dt), bad_split);
    }
    kern_free(&kc);
}

static void check_threads_agree(const df_kernels *k, rng *r) {
    mat m = mat_random(DF_DT_MXFP4, 1000, 512, r);
    int n = 6;
    float *x = xmalloc(n * 512 * sizeof(float)), *y1 = xmalloc(n * 1000 * sizeof(float)),
          *y3 = xmalloc(n * 1000 * sizeof(float));
    for (int i = 0; i < n * 512; i++) x[i] = rng_f(r);
    df_kern k1, k3;
    CHECK(kern_init(&k1, 1, k->isa) == 0 && kern_init(&k3, 3, k->isa) == 0, "%s: init 1 and 3 threads", k->isa);
    kern_matmul(&k1, &m.t, x, n, y1);
    kern_matmul(&k3, &m.t, x, n, y3);
    CHECK(!memcmp(y1, y3, n * 1000 * sizeof(float)), "%s: 1 and 3 threads give identical results", k->isa);
    kern_free(&k1);
    kern_free(&k3);
    free(x), free(y1), free(y3);
    mat_free(&m);
}

typedef struct {
    atomic_int hits[1000];
    atomic_int bad_thread;
    int n_threads;
} pf_ctx;

static void pf_count(void *ctx, int task) {
    pf_ctx *c = ctx;
    atomic_fetch_add(&c->hits[task], 1);
}

static void pf_count_t(void *ctx, int task, int thread) {
    pf_ctx *c = ctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
}

typedef struct {
    df_kern *kc;
    const df_tensor *w;
    const float *x;
    float *y;   /* one output row of w.rows per task */
} nest_ctx;

static void nest_task(void *ctx, int task) {
    nest_ctx *c = ctx;
    kern_matmul(c->kc, c->w, c->x + task * c->w->shape[1], 1, c->y + task * c->w->shape[0]);
}

static void check_pool(rng *r) {
    df_kern kc;
    CHECK(kern_init(&kc, 3, NULL) == 0, "pool: init 3 threads");
    int ok = 1;
    for (int round = 0; round < 200 && ok; round++) {
        pf_ctx *c = xcalloc(1, sizeof *c);
        c->n_threads = kc.n_threads;
        int n = 1 + round * 5 % 1000;
        if (round % 2) kern_parallel_for(&kc, n, pf_count, c);
        else kern_parallel_for_t(&kc, n, pf_count_t, c);
        for (int t = 0; t < 1000; t++)
            if (atomic_load(&c->hits[t]) != (t < n)) ok = 0;
        if (atomic_load(&c->bad_thread)) ok = 0;
        free(c);
    }
    CHECK(ok, "pool: 200 jobs, every task run exactly once, thread indices in range");

    /* matmuls from inside pool tasks (per-expert style) run inline and are still right */
    mat m = mat_random(DF_DT_BF16, 200, 96, r);
    int n = 8;
    float *x = xmalloc(n * 96 * sizeof(float)), *y = xmalloc(n * 200 * sizeof(float)),
          *want = xmalloc(n * 200 * sizeof(float));
    for (int i = 0; i < n * 96; i++) x[i] = rng_f(r);
    nest_ctx nc = {&kc, &m.t, x, y};
    kern_parallel_for(&kc, n, nest_task, &nc);
    kern_scalar()->matmul_rows(&m.t, 0, 200, x, n, want, 200);
    CHECK(max_rel_err(&m.t, x, n, y, want) <= 1e-6, "pool: nested kern_matmul inside tasks");
    free(x), free(y), free(want);
    mat_free(&m);
    kern_free(&kc);
}

static void check_matmul_t(rng *r) {
    df_kern kc;
    CHECK(kern_init(&kc, 2, NULL) == 0, "matmul_t: init");
    const df_dtype dts[] = {DF_DT_F32, DF_DT_BF16, DF_DT_F16};
    for (int d = 0; d < 3; d++) {
        int64_t rows = 37, cols = 600;
        int n = 3;
        mat m = mat_random(dts[d], rows, cols, r);
        float *x = xmalloc(n * rows * sizeof(float)), *y = xmalloc(n * cols * sizeof(float));
        float *wf = xmalloc(rows * cols * sizeof(float));
        for (int i = 0; i < n * rows; i++) x[i] = rng_f(r);
        tensor_to_f32(&m.t, wf);
        kern_matmul_t(&kc, &m.t, x, n, y);
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int64_t c = 0; c < cols; c++) {
                double s = 0, mag = 1e-30;
                for (int64_t q = 0; q < rows; q++) {
                    s += (double)x[i * rows + q] * wf[q * cols + c];
                    mag += fabs((double)x[i * rows + q] * wf[q * cols + c]);
                }
                double e = fabs(s - y[i * cols + c]) / mag;
                if (!(e <= worst)) worst = e;
            }
        CHECK(worst <= 1e-6, "matmul_t %s: vs double reference, max rel err %.2g", tensor_dtype_name(dts[d]), worst);
        free(x), free(y), free(wf);
        mat_free(&m);
    }
    kern_free(&kc);
}

static void check_small_ops(rng *r) {
    enum { D = 77 };
    float x[D], w[D], out[D], g[D], u[D];
    for (int i = 0; i < D; i++) x[i] = rng_f(r) * 3, w[i] = rng_f(r), g[i] = rng_f(r) * 5, u[i] = rng_f(r);
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    kern_rmsnorm(out, x, w, D, 1e-6f);
    double e = 0;
    for (int i = 0; i < D; i++) e = fmax(e, fabs(out[i] - x[i] / sqrt(ss / D + 1e-6) * w[i]));
    CHECK(e < 1e-5, "rmsnorm matches double reference (%.2g)", e);

    double dot = 0;
    for (int i = 0; i < D; i++) dot += (double)x[i] * w[i];
    CHECK(fabs(kern_dot(x, w, D) - dot) < 1e-4, "dot");

    float gs[D];
    memcpy(gs, g, sizeof g);
    kern_silu_mul(gs, u, D);
    e = 0;
    for (int i = 0; i < D; i++) e = fmax(e, fabs(gs[i] - g[i] / (1 + exp(-g[i])) * u[i]));
    CHECK(e < 1e-5, "silu_mul (%.2g)", e);

    memcpy(gs, g, sizeof g);
    kern_situ_mul(gs, u, D, 2.0f, 3.0f);
    e = 0;
    for (int i = 0; i < D; i++) {
        double want = 2.0 * tanh(g[i] / 2.0) / (1 + exp(-g[i])) * (3.0 * tanh(u[i] / 3.0));
        e = fmax(e, fabs(gs[i] - want));
    }
    CHECK(e < 1e-5, "situ_mul (%.2g)", e);

    float sm[D];
    memcpy(sm, g, sizeof g);
    kern_softmax(sm, D);
    double mx = -1e30, tot = 0, se = 0, sum = 0;
    for (int i = 0; i < D; i++) mx = fmax(mx, g[i]);
    for (int i = 0; i < D; i++) tot += exp(g[i] - mx);
    for (int i = 0; i < D; i++) se = fmax(se, fabs(sm[i] - exp(g[i] - mx) / tot)), sum += sm[i];
    CHECK(se < 1e-6 && fabs(sum - 1) < 1e-5, "softmax (%.2g)", se);
}

static void check_selection(void) {
    const df_kernels *av[8];
    int n = kern_available(av, 8);
    CHECK(n >= 1 && av[n - 1] == kern_scalar(), "scalar is always available, last");
    df_kern kc;
    setenv("DELTAFIN_ISA", "scalar", 1);
    CHECK(kern_init(&kc, 1, NULL) == 0 && kc.k == kern_scalar(), "DELTAFIN_ISA=scalar selects scalar");
    kern_free(&kc);
    setenv("DELTAFIN_ISA", "no-such-isa", 1);
    CHECK(kern_init(&kc, 1, NULL) == -1, "unknown DELTAFIN_ISA is refused");
    unsetenv("DELTAFIN_ISA");
    CHECK(kern_init(&kc, 1, NULL) == 0 && kc.k == av[0], "default is the best ISA: %s", kc.k->isa);
    kern_free(&kc);
    char names[128] = "";
    for (int i = 0; i < n; i++) {
        strcat(names, " ");
        strcat(names, av[i]->isa);
    }
    printf("# ISAs on this CPU:%s\n", names);
}

static int isa_usable(const df_kernels *k) {
    const df_kernels *av[8];
    int n = kern_available(av, 8);
    for (int i = 0; k && i < n; i++)
        if (av[i] == k) return 1;
    return 0;
}

/* The ISA paths built into this binary that this CPU (or OS) cannot run: counted as skipped. */
static void report_unusable_isas(void) {
    const df_kernels *built[] = {kern_amx(), kern_avx512(), kern_avx2(), kern_neon()};
    for (size_t i = 0; i < sizeof built / sizeof built[0]; i++)
        if (built[i] && !isa_usable(built[i]))
            SKIP("not supported by this CPU", "%s: matmul, packing and thread checks", built[i]->isa);
}

/* The AMX path (MXFP4, 4+ activation rows) against the scalar reference and the AVX-512 path where it must
 * fall back: activations over a wide range (subnormal to 2^100, zeros, a row of subnormals only), scales
 * across the range it takes ([2, 160]) and outside it, non-finite activations. */
static void check_amx(rng *r) {
    if (!kern_amx()) return;   /* not an x86-64 build: nothing to skip */
    if (!isa_usable(kern_amx()) || !isa_usable(kern_avx512())) {
        SKIP("no AMX on this CPU / OS", "amx MXFP4: wide-range activations, scale fallback and non-finite inputs");
        return;
    }
    df_kern ka, kv;
    CHECK(kern_init(&ka, 2, "amx") == 0 && kern_init(&kv, 2, "avx512") == 0, "amx: init amx and avx512");
    static const int ns[] = {4, 5, 6, 16, 32};
    int64_t rows = 300, cols = 320;
    double worst = 0;
    int same_fallback = 1, differs = 0, nonfinite_same = 1;
    for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
        int n = ns[q];
        mat m = mat_random(DF_DT_MXFP4, rows, cols, r);
        uint8_t *sc = m.scale;
        for (int64_t i = 0; i < rows * cols / 32; i++) sc[i] = (uint8_t)(2 + rng_u32(r) % 159);   /* [2, 160] */
        /* rows the AMX path must leave to AVX-512: one scale out of [2, 160] anywhere in the row */
        static const int64_t bad_rows[] = {0, 63, 64, 130, 299};
        static const uint8_t bad_scales[] = {0, 1, 161, 200, 1};
        for (int k = 0; k < 5; k++) sc[bad_rows[k] * (cols / 32) + k % (cols / 32)] = bad_scales[k];
        /* row scales so that x * w stays far from overflow: weights up to 6 * 2^33, x up to 2^60 */
        float *x = xmalloc(n * cols * sizeof(float)), *want = xmalloc(n * rows * sizeof(float));
        float *got = xmalloc(n * rows * sizeof(float)), *ref = xmalloc(n * rows * sizeof(float));
        for (int i = 0; i < n; i++)
            for (int64_t c = 0; c < cols; c++) {
                float v = rng_f(r);
                int e = (int)(rng_u32(r) % 80) - 60;
                if (i == 1) e -= 100;             /* row 1: subnormals and tiny values only */
                if (c % 17 == 3) v = 0.0f;
                x[i * cols + c] = ldexpf(v, i % 3 == 2 ? e / 4 : e);
            }
        kern_scalar()->matmul_rows(&m.t, 0, rows, x, n, want, rows);
        kern_matmul(&ka, &m.t, x, n, got);
        kern_matmul(&kv, &m.t, x, n, ref);
        double e = max_rel_err(&m.t, x, n, got, want);
        if (!(e <= worst)) worst = e;
        for (int i = 0; i < n; i++)
            for (int64_t row = 0; row < rows; row++) {
                float a = got[i * rows + row], b = ref[i * rows + row];
                int bad = 0;
                for (int k = 0; k < 5; k++) bad |= row == bad_rows[k];
                if (bad && memcmp(&a, &b, 4)) same_fallback = 0;
                if (!bad && memcmp(&a, &b, 4)) differs++;
            }
        /* an inf in the activations: the whole call is the AVX-512 one, bit for bit */
        x[(n - 1) * cols + 5] = INFINITY;
        kern_matmul(&ka, &m.t, x, n, got);
        kern_matmul(&kv, &m.t, x, n, ref);
        for (int64_t k = 0; k < n * rows; k++)
            if (memcmp(&got[k], &ref[k], 4) && !(isnan(got[k]) && isnan(ref[k]))) nonfinite_same = 0;
        free(x), free(want), free(got), free(ref);
        mat_free(&m);
    }
    CHECK(worst <= 1e-6, "amx MXFP4: activations 2^-160..2^20 incl. subnormals, scales 2..160, n 4..32: max rel err "
          "%.2g <= 1e-06", worst);
    CHECK(same_fallback, "amx MXFP4: rows with a scale outside [2, 160] are the AVX-512 results, bit for bit");
    CHECK(differs > 0, "amx MXFP4: the other rows come from the AMX path (%d of them differ from AVX-512 in the "
          "last bit)", differs);
    CHECK(nonfinite_same, "amx MXFP4: an inf activation sends the call to AVX-512 (bit-identical results)");
    kern_free(&ka);
    kern_free(&kv);
}

/* AVX-512 MXFP4 with 1-2 activation rows sums each 128-column group unscaled and scales it after; where that
 * sum overflows (|x| near 2^124, scales 2^-27) the row must be redone scaled and still match the reference. */
static void check_mxfp4_unscaled_overflow(rng *r) {
    const df_kernels *k = kern_avx512();
    if (!k) return;   /* not an x86-64 build: nothing to skip */
    if (!isa_usable(k)) {   /* never run AVX-512 code on a CPU without it */
        SKIP("no AVX-512 on this CPU", "avx512 MXFP4: overflowing unscaled group sums are redone scaled");
        return;
    }
    int64_t rows = 9, cols = 256;
    mat m = mat_random(DF_DT_MXFP4, rows, cols, r);
    uint8_t *sc = m.scale;
    for (int64_t i = 0; i < rows * cols / 32; i++) sc[i] = 100;
    for (int64_t i = 0; i < rows * cols / 2; i++) ((uint8_t *)m.data)[i] |= 0x77;   /* |e2m1| = 6 */
    float *x = xmalloc(2 * cols * sizeof(float)), *want = xmalloc(2 * rows * sizeof(float));
    float *got = xmalloc(2 * rows * sizeof(float));
    float *xp = xcalloc(kern_pack_floats(k, &m.t, 2) + 1, sizeof(float));
    for (int64_t i = 0; i < 2 * cols; i++) x[i] = ldexpf(0.9f + 0.1f * fabsf(rng_f(r)), 124);
    kern_scalar()->matmul_rows(&m.t, 0, rows, x, 2, want, rows);
    kern_pack_x(k, &m.t, x, 2, xp);
    k->matmul_rows(&m.t, 0, rows, xp, 2, got, rows);
    double e = max_rel_err(&m.t, x, 2, got, want);
    CHECK(e <= 1e-6 && isfinite(want[0]), "avx512 MXFP4: overflowing unscaled group sums are redone scaled (%.2g)", e);
    free(x), free(want), free(got), free(xp);
    mat_free(&m);
}

int main(void) {
    rng r = {0x9e3779b97f4a7c15ull};
    check_selection();
    report_unusable_isas();
    const df_kernels *av[8];
    int n = kern_available(av, 8);
    for (int i = 0; i < n; i++) {
        check_isa_matmul(av[i], &r);
        check_threads_agree(av[i], &r);
    }
    check_amx(&r);
    check_mxfp4_unscaled_overflow(&r);
    check_pool(&r);
    check_matmul_t(&r);
    check_small_ops(&r);
    TEST_EXIT();
}
