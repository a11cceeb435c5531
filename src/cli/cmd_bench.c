/* cmd_bench.c — `deltafin bench`: dispatches `bench kernels` (here) and the decode benchmark (bench_model.c).
 *
 * `bench kernels` times kern_matmul on Kimi K3 weight shapes with weights in RAM — a working set several times
 * the last-level cache, cycled through so no call finds its weights cached — and compares the weight bytes
 * read per second with this machine's memory read bandwidth, measured in the same run over the same buffer. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "common/util.h"
#include "kernels/kernels.h"

typedef struct {
    const char *shape;
    df_dtype dtype;
    int64_t rows, cols;
} bench_case;

static const bench_case bench_cases[] = {
    {"expert", DF_DT_MXFP4, 3072, 3584},   {"expert", DF_DT_MXFP4, 3584, 3072},
    {"spine", DF_DT_BF16, 12288, 7168},    {"spine", DF_DT_BF16, 7168, 12288},
    {"spine", DF_DT_I8, 12288, 7168},      {"spine", DF_DT_I8, 7168, 12288},
    {"lm_head", DF_DT_BF16, 163840, 7168}, {"lm_head", DF_DT_I8, 163840, 7168},
};

typedef struct {
    int json, threads, quick;
    const char *isa, *shape;   /* shape: only the cases of that shape name (NULL: all) */
} bench_opts;

typedef struct {
    uint8_t *buf;
    size_t bytes;
} fill_job;

/* Every 16-bit half is a bf16 of magnitude 2^-7..2^0 and every byte a valid int8 or MXFP4 pair, so one buffer
 * serves all dtypes without NaNs or subnormals skewing the timing. */
static void fill_task(void *ctx, int task) {
    fill_job *f = ctx;
    size_t per = f->bytes / 64, b0 = task * per, b1 = task == 63 ? f->bytes : b0 + per;
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(task + 1);
    for (size_t i = b0 & ~(size_t)1; i + 1 < b1; i += 2) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        f->buf[i] = (uint8_t)s;
        f->buf[i + 1] = (uint8_t)(0x3c | ((s >> 8) & 3) | ((s >> 16) & 0x80));
    }
}

typedef struct {
    const df_kernels *k;
    const uint8_t *buf;
    size_t chunk;
    uint64_t sums[256];
} read_job;

static void read_task(void *ctx, int task) {
    read_job *r = ctx;
    r->sums[task] = r->k->read_bytes(r->buf + task * r->chunk, r->chunk);
}

/* Best of several full passes over the buffer with the pool's threads. */
static double bench_mem_gbps(df_kern *kc, const uint8_t *buf, size_t bytes, int passes) {
    read_job r = {kc->k, buf, bytes / 256 / 256 * 256, {0}};
    double best = 0;
    uint64_t sum = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = df_now();
        kern_parallel_for(kc, 256, read_task, &r);
        double gbps = 256.0 * r.chunk / (df_now() - t0) / 1e9;
        if (gbps > best) best = gbps;
        for (int i = 0; i < 256; i++) sum += r.sums[i];
    }
    if (sum == 42) fputs("", stderr);   /* keeps the reads observable */
    return best;
}

/* The case's weight matrix, without data. */
static df_tensor case_tensor(const bench_case *c) {
    return (df_tensor){.name = "bench.weight", .dtype = c->dtype, .ndim = 2, .shape = {c->rows, c->cols}};
}

/* Bytes of one copy: the data, then the scales (MXFP4: E8M0 per 32 weights; I8: fp16 per row). */
static uint64_t case_bytes(const bench_case *c) {
    df_tensor t = case_tensor(c);
    uint64_t n = (uint64_t)c->rows * c->cols, data = tensor_data_bytes(&t);
    return data + (c->dtype == DF_DT_MXFP4 ? n / 32 : c->dtype == DF_DT_I8 ? (uint64_t)c->rows * 2 : 0);
}

typedef struct {
    double weight_gbps, mem_gbps, ratio, sec_per_call;   /* of the round with the median ratio */
    int calls, copies;
} case_result;

enum { BENCH_ROUNDS_MAX = 15 };

/* Copies of the matrix laid end to end through buf (data then scales), cycled through call after call, in
 * rounds: each round first measures the memory read bandwidth (one pass over buf) and then times the kernel
 * for min_s / rounds, so that each ratio compares the two under the same conditions on a shared machine,
 * whose bandwidth drifts by tens of percent from second to second. The round with the median ratio is kept. */
static case_result bench_case_run(df_kern *kc, const bench_case *c, uint8_t *buf, size_t buf_bytes, int batch,
                                  double min_s, int rounds) {
    uint64_t wb = case_bytes(c);
    int copies = (int)DF_MAX(1, DF_MIN(buf_bytes / wb, 4096));
    df_tensor *v = xcalloc(copies, sizeof *v);
    const df_tensor shape = case_tensor(c);
    uint64_t data_bytes = tensor_data_bytes(&shape);
    for (int i = 0; i < copies; i++) {
        uint8_t *base = buf + (uint64_t)i * wb;
        v[i] = shape;
        v[i].data = base;
        v[i].scale = wb > data_bytes ? base + data_bytes : NULL;
        if (c->dtype == DF_DT_MXFP4)   /* scales 2^-9..2^-1: ordinary weights */
            for (uint64_t s = 0; s < wb - data_bytes; s++) base[data_bytes + s] = (uint8_t)(118 + s % 9);
        if (c->dtype == DF_DT_I8)
            for (int64_t r = 0; r < c->rows; r++) ((uint16_t *)(base + data_bytes))[r] = df_f32_to_f16(0.01f);
    }
    float *x = xmalloc((size_t)batch * c->cols * sizeof(float));
    float *y = xmalloc((size_t)batch * c->rows * sizeof(float));
    for (int64_t i = 0; i < batch * c->cols; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    kern_matmul(kc, &v[copies - 1], x, batch, y);   /* warm the pool and the code */
    case_result r = {0, 0, 0, 0, 0, copies};
    case_result round[BENCH_ROUNDS_MAX];
    for (int k = 0; k < rounds; k++) {
        double mem = bench_mem_gbps(kc, buf, buf_bytes, 1);
        int calls = 0;
        double t0 = df_now(), t;
        do {
            kern_matmul(kc, &v[r.calls % copies], x, batch, y);
            r.calls++, calls++;
            t = df_now() - t0;
        } while (t < min_s / rounds);
        round[k].sec_per_call = t / calls;
        round[k].weight_gbps = (double)wb / round[k].sec_per_call / 1e9;
        round[k].mem_gbps = mem;
        round[k].ratio = round[k].weight_gbps / mem;
    }
    for (int k = 1; k < rounds; k++)   /* insertion sort by ratio; the middle round is reported */
        for (int j = k; j > 0 && round[j].ratio < round[j - 1].ratio; j--) {
            case_result t = round[j];
            round[j] = round[j - 1], round[j - 1] = t;
        }
    r.weight_gbps = round[rounds / 2].weight_gbps;
    r.mem_gbps = round[rounds / 2].mem_gbps;
    r.ratio = round[rounds / 2].ratio;
    r.sec_per_call = round[rounds / 2].sec_per_call;
    free(x), free(y), free(v);
    return r;
}

static int bench_kernels_usage(FILE *f) {
    fprintf(f, "usage: deltafin bench kernels [--json] [--threads N] [--isa NAME] [--shape NAME] [--quick]\n"
               "  Times the matmul kernels on Kimi K3 shapes (MXFP4 experts, bf16/int8 spine and lm_head) with\n"
               "  1 and 16 activation rows, weights in RAM, against the memory read bandwidth measured in the\n"
               "  same run.\n"
               "  --json       one JSON object per line\n"
               "  --threads N  kernel threads (default: online cores)\n"
               "  --isa NAME   scalar, avx2, avx512, amx or neon (default: best for this CPU)\n"
               "  --shape NAME only the expert, spine or lm_head cases\n"
               "  --quick      a small working set and short timings (for tests; ratios not meaningful)\n");
    return f == stdout ? 0 : 2;
}

static int bench_kernels(int argc, char **argv) {
    bench_opts o = {0, (int)sysconf(_SC_NPROCESSORS_ONLN), 0, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) o.json = 1;
        else if (!strcmp(argv[i], "--quick")) o.quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) o.isa = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) o.shape = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return bench_kernels_usage(stdout);
        else {
            fprintf(stderr, "deltafin bench kernels: unknown option '%s'\n", argv[i]);
            return bench_kernels_usage(stderr);
        }
    }
    if (o.threads < 1) o.threads = 1;
    df_kern kc;
    if (kern_init(&kc, o.threads, o.isa)) {
        fprintf(stderr, "deltafin bench kernels: ISA '%s' is not available on this CPU or in this build\n",
                o.isa ? o.isa : getenv("DELTAFIN_ISA"));
        return 2;
    }
    /* The working set: 4x a large last-level cache (and at least the biggest matrix), or 256 MiB quick. */
    size_t bytes = o.quick ? (size_t)256 << 20 : (size_t)2 << 30;
    for (size_t i = 0; !o.quick && i < sizeof bench_cases / sizeof bench_cases[0]; i++)
        bytes = DF_MAX(bytes, case_bytes(&bench_cases[i]));
    bytes = (bytes + 65535) / 65536 * 65536;
    uint8_t *buf = xaligned_alloc(64, bytes);
    fill_job f = {buf, bytes};
    kern_parallel_for(&kc, 64, fill_task, &f);
    double mem = bench_mem_gbps(&kc, buf, bytes, o.quick ? 2 : 5);
    double min_s = o.quick ? 0.02 : 1.5;
    int rounds = o.quick ? 1 : 5;
    if (!o.json)
        printf("kernels: isa %s, %d threads, working set %.2f GiB, memory read bandwidth %.2f GB/s at start;\n"
               "each case: the median of %d rounds of (memory read pass, kernel timing) by ratio\n"
               "%-8s %-6s %-10s %6s %6s %5s %9s %8s %8s %7s %10s\n",
               kc.k->isa, kc.n_threads, bytes / 1073741824.0, mem, rounds, "shape", "dtype", "kernel", "rows", "cols",
               "batch", "weight_GB/s", "mem_GB/s", "ratio", "ms/call", "rows*GB/s");
    else
        printf("{\"kernel\":\"memread\",\"isa\":\"%s\",\"threads\":%d,\"bytes\":%zu,\"mem_gbps\":%.3f}\n",
               kc.k->isa, kc.n_threads, bytes, mem);
    double mx1 = 0, mx16 = 0;
    for (size_t i = 0; i < sizeof bench_cases / sizeof bench_cases[0]; i++) {
        const bench_case *c = &bench_cases[i];
        if (case_bytes(c) > bytes) continue;   /* quick mode: lm_head does not fit */
        if (o.shape && strcmp(o.shape, c->shape)) continue;
        static const int batches[] = {1, 16};
        for (int b = 0; b < 2; b++) {
            case_result r = bench_case_run(&kc, c, buf, bytes, batches[b], min_s, rounds);
            const char *kernel = batches[b] == 1 ? "matvec" : "matmul";
            if (c->dtype == DF_DT_MXFP4) {
                if (batches[b] == 1) mx1 += r.weight_gbps;
                else mx16 += r.weight_gbps * batches[b];
            }
            if (o.json)
                printf("{\"kernel\":\"%s\",\"shape\":\"%s\",\"dtype\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
                       "\"rows\":%" PRId64 ",\"cols\":%" PRId64 ",\"batch\":%d,\"weight_gbps\":%.3f,"
                       "\"mem_gbps\":%.3f,\"ratio\":%.4f,\"rows_gbps\":%.3f,\"ms_per_call\":%.4f,"
                       "\"calls\":%d,\"copies\":%d,\"rounds\":%d,\"quick\":%s}\n",
                       kernel, c->shape, tensor_dtype_name(c->dtype), kc.k->isa, kc.n_threads, c->rows, c->cols,
                       batches[b], r.weight_gbps, r.mem_gbps, r.ratio, r.weight_gbps * batches[b],
                       r.sec_per_call * 1e3, r.calls, r.copies, rounds, o.quick ? "true" : "false");
            else
                printf("%-8s %-6s %-10s %6" PRId64 " %6" PRId64 " %5d %9.2f %8.2f %7.1f%% %7.3f %10.2f\n", c->shape,
                       tensor_dtype_name(c->dtype), kernel, c->rows, c->cols, batches[b], r.weight_gbps,
                       r.mem_gbps, 100 * r.ratio, r.sec_per_call * 1e3, r.weight_gbps * batches[b]);
            fflush(stdout);
        }
    }
    if (!o.json && mx1 > 0)
        printf("MXFP4: 16 rows give %.1fx the single-row throughput in rows*bytes/s\n", mx16 / mx1);
    free(buf);
    kern_free(&kc);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "kernels")) return bench_kernels(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "fetch")) return bench_fetch(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "cache")) return bench_cache(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "rollback")) return bench_rollback(argc - 1, argv + 1);
    return bench_model(argc, argv);
}
