/* bench_model.c — `deltafin bench -m DIR [-n N] [--parallel S] [--json]`: the decode benchmark of the streaming
 * engine.
 *
 * In one run it measures the disk (O_DIRECT reads of the model's own shards through the engine's own reader, in
 * a few patterns of parallel readers and request sizes — among them the engine's expert reads themselves:
 * random expert spans, as many in flight as it has I/O threads — before decoding, and the best pattern again
 * after; the best rate seen is the disk's bandwidth), prefills S short prompts (reporting the expert reads that
 * prefill made against the unique (layer, expert) pairs it needed, and in how many passes), then decodes N
 * tokens greedily in each of the S streams, one forward pass per step (bench_streams.c), and reports s/token
 * per stream, the aggregate tokens/s, where the time went (df_engine_profile), bytes read from disk per pass and
 * per generated token, the cache hit rate, the read rate achieved, the peak resident set, the I/O floor (bytes
 * that had to come from disk / the measured disk bandwidth), the compute-only time (the last pass evaluated
 * again from a copy of the states taken before it, its experts now cached, minus any read wait left) and
 * floor_ratio = s/token / max(floor, compute-only), both per pass. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "bench_spec.h"
#include "bench_streams.h"
#include "cli.h"
#include "cli_gen.h"
#include "cli_opts.h"
#include "common/util.h"
#include "residency/budget.h"
#include "io/io.h"
#include "format/safetensors.h"
#include "format/tensor_names.h"

#define PROBE_PATTERNS 8
#define BENCH_RERUNS 3
#define PROBE_MAX_SHARDS 4096
#define BENCH_MAX_STREAMS 256

/* One way of reading the disk: the engine's own reader (io.h source of this kind, on an I/O pool of this many
 * threads) issuing requests of this size, as it does for spine pieces and expert spans. reread: over the
 * region the previous pattern just read, as the engine re-reads a streamed spine every token (a virtual disk
 * whose host caches recent blocks serves those faster, and the floor must not pretend otherwise). spread:
 * consecutive requests go to different shards, as spine and expert reads of one layer do. */
typedef struct probe_pattern {
    const char *name;
    int kind, threads;
    uint64_t block;
    int reread, spread;
    int engine;            /* the engine's reader and I/O threads (--io, --io-threads) instead of kind, threads */
    int experts;           /* random expert spans instead of blocks, one reader call each, as the engine reads */
} probe_pattern;

static const probe_pattern probe_patterns[PROBE_PATTERNS] = {
    {"pread pool, 8 threads x 8 MiB", IO_KIND_PREAD, 8, 8u << 20, 0, 0, 0, 0},
    {"pread pool, 8 threads x 16 MiB", IO_KIND_PREAD, 8, 16u << 20, 0, 0, 0, 0},
    {"io_uring, 8 threads x 16 MiB (1 MiB requests)", IO_KIND_URING, 8, 16u << 20, 0, 0, 0, 0},
    {"io_uring, 16 threads x 8 MiB (1 MiB requests)", IO_KIND_URING, 16, 8u << 20, 0, 0, 0, 0},
    {"io_uring, 8 threads x 16 MiB, re-reading the previous region", IO_KIND_URING, 8, 16u << 20, 1, 0, 0, 0},
    {"io_uring, 16 threads x 8 MiB, spread over all shards", IO_KIND_URING, 16, 8u << 20, 0, 1, 0, 0},
    {"the engine's spine reads: 8 MiB pieces, its reader and I/O threads", 0, 0, 8u << 20, 0, 0, 1, 0},
    {"the engine's expert reads: random expert spans, its reader and I/O threads", 0, 0, 0, 0, 0, 1, 1},
};

typedef struct probe_span {
    int file;
    uint64_t off, len;
} probe_span;

typedef struct probe_disk {
    int n;
    char **paths;
    uint64_t *sizes;
    int file;              /* where the next pattern starts reading: a new region each time */
    uint64_t off;
    int last_file;         /* where the previous pattern started */
    uint64_t last_off;
    double gbps[PROBE_PATTERNS + 1];   /* per pattern; [PROBE_PATTERNS]: the best pattern again after decoding */
    uint64_t bytes;        /* read by all probes */
    probe_span *spans;     /* every routed expert's span, shuffled */
    int n_spans, next_span;
    int eng_kind, eng_threads;   /* the engine's reader (--io, --io-threads) */
} probe_disk;

typedef struct probe_job {
    io_source *src;
    int file;
    uint64_t off, len;
    uint8_t *buf;
    io_latch *latch;
    int *failed;
} probe_job;

static void probe_job_run(void *arg) {
    probe_job *j = arg;
    df_error err;
    if (j->src->read(j->src, j->file, j->off, j->len, j->buf, "the disk probe", &err)) *j->failed = 1;
    io_latch_done(j->latch);
}

static int probe_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int probe_init(probe_disk *p, const char *dir, char *err, size_t cap) {
    memset(p, 0, sizeof *p);
    DIR *d = opendir(dir);
    if (!d) return snprintf(err, cap, "%s: %s", dir, strerror(errno)), -1;
    struct dirent *de;
    p->paths = xcalloc(PROBE_MAX_SHARDS, sizeof *p->paths);
    while ((de = readdir(d)) && p->n < PROBE_MAX_SHARDS) {
        size_t n = strlen(de->d_name);
        if (n >= 12 && !strcmp(de->d_name + n - 12, ".safetensors")) p->paths[p->n++] = df_path_join(dir, de->d_name);
    }
    closedir(d);
    if (!p->n) return snprintf(err, cap, "%s: no .safetensors file", dir), -1;
    qsort(p->paths, (size_t)p->n, sizeof *p->paths, probe_cmp);
    p->sizes = xcalloc((size_t)p->n, sizeof *p->sizes);
    for (int i = 0; i < p->n; i++) {
        struct stat sb;
        if (stat(p->paths[i], &sb)) return snprintf(err, cap, "%s: %s", p->paths[i], strerror(errno)), -1;
        p->sizes[i] = (uint64_t)sb.st_size;
    }
    return 0;
}

static void probe_free(probe_disk *p) {
    for (int i = 0; i < p->n; i++) free(p->paths[i]);
    free(p->paths);
    free(p->sizes);
    free(p->spans);
}

/* Every routed expert's span: its tensors (as the tensor-name table classifies them) of one shard, adjacent in
 * the header's name order, from the first byte to the last, in a fixed pseudo-random order. */
static void probe_find_experts(probe_disk *p) {
    int cap = 0;
    for (int f = 0; f < p->n; f++) {
        st_file sf;
        df_error e;
        if (st_file_open(&sf, p->paths[f], &e)) continue;
        int layer, expert, nl, ne;
        for (int i = 0; i < sf.n_tensors;) {
            const char *nm = sf.tensors[i].name;
            if (tensor_classify(nm, tensor_family_guess(nm), &layer, &expert, NULL) != TENSOR_EXPERT) {
                i++;
                continue;
            }
            uint64_t lo = UINT64_MAX, hi = 0;
            int j = i;
            for (; j < sf.n_tensors; j++) {
                const char *nj = sf.tensors[j].name;
                if (tensor_classify(nj, tensor_family_guess(nj), &nl, &ne, NULL) != TENSOR_EXPERT || nl != layer ||
                    ne != expert)
                    break;
                uint64_t off = st_tensor_offset(&sf, &sf.tensors[j]);
                lo = DF_MIN(lo, off);
                hi = DF_MAX(hi, off + sf.tensors[j].end - sf.tensors[j].begin);
            }
            if (p->n_spans == cap) {
                cap = cap ? 2 * cap : 256;
                p->spans = xrealloc(p->spans, sizeof *p->spans * (size_t)cap);
            }
            p->spans[p->n_spans++] = (probe_span){f, lo, hi - lo};
            i = j;
        }
        st_file_close(&sf);
    }
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int i = p->n_spans - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % (uint64_t)(i + 1));
        probe_span t = p->spans[i];
        p->spans[i] = p->spans[k], p->spans[k] = t;
    }
}

/* Runs the jobs (file, off, len set) all at once through the engine's reader of this kind on a pool of this
 * many threads, buffers shared round-robin by thread (contents are thrown away, only timing matters); GB/s,
 * or -1. */
static double probe_exec(probe_disk *p, const probe_pattern *pat, int kind, int threads, probe_job *jobs, int n_jobs,
                         uint64_t buf_bytes, char *err, size_t cap) {
    io_source *src = NULL;
    df_error e;
    io_local_opts lo = {1, kind};
    if (io_local_open_ex(&src, p->n, (const char *const *)p->paths, &lo, &e))
        return snprintf(err, cap, "%s", e.msg), -1;
    uint8_t *mem = io_mem_alloc((size_t)threads * buf_bytes);
    for (int i = 0; i < threads; i++) ((volatile uint8_t *)mem)[(size_t)i * buf_bytes] = 0;
    io_pool *pool = io_pool_new(threads);
    io_latch *latch = io_latch_new();
    int failed = 0;
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].src = src;
        jobs[i].buf = mem + (size_t)(i % threads) * buf_bytes;
        jobs[i].latch = latch;
        jobs[i].failed = &failed;
    }
    io_latch_add(latch, n_jobs);
    double t0 = df_now();
    for (int i = 0; i < n_jobs; i++) io_pool_submit(pool, IO_PRIO_HIGH, probe_job_run, &jobs[i]);
    io_latch_wait(latch);
    double dt = df_now() - t0;
    uint64_t bytes = atomic_load(&src->bytes);
    p->bytes += bytes;
    io_pool_free(pool);
    io_latch_free(latch);
    io_mem_free(mem, (size_t)threads * buf_bytes);
    io_source_free(src);
    if (failed) return snprintf(err, cap, "a read failed during the disk probe (%s)", pat->name), -1;
    return n_jobs ? (double)bytes / dt / 1e9 : 0.0;
}

/* About `limit` bytes of expert spans not read by an earlier run of this pattern, each one read as the engine
 * reads an expert (one call of its reader per span), as many in flight as the engine has I/O threads. */
static double probe_experts(probe_disk *p, const probe_pattern *pat, uint64_t limit, char *err, size_t cap) {
    probe_job *jobs = xcalloc((size_t)p->n_spans + 1, sizeof *jobs);
    uint64_t got = 0, buf = IO_ALIGN;
    int n_jobs = 0;
    for (int k = 0; k < p->n_spans && got < limit; k++) {
        const probe_span *sp = &p->spans[(p->next_span + k) % p->n_spans];
        jobs[n_jobs++] = (probe_job){.file = sp->file, .off = sp->off, .len = sp->len};
        got += sp->len;
        buf = DF_MAX(buf, io_span_bytes(sp->off, sp->len));
    }
    p->next_span = p->n_spans ? (p->next_span + n_jobs) % p->n_spans : 0;
    double r = probe_exec(p, pat, p->eng_kind, p->eng_threads, jobs, n_jobs, buf, err, cap);
    free(jobs);
    return r;
}

/* Reads about `limit` bytes in consecutive blocks across the shards (continuing where the last pattern
 * stopped, so no pattern re-reads what another just read) with every block in flight at once on the pool;
 * returns GB/s, or -1. */
static double probe_run(probe_disk *p, const probe_pattern *pat, uint64_t limit, char *err, size_t cap) {
    if (pat->experts) return probe_experts(p, pat, limit, err, cap);
    int kind = pat->engine ? p->eng_kind : pat->kind, threads = pat->engine ? p->eng_threads : pat->threads;
    int n_jobs = (int)DF_MAX(limit / pat->block, (uint64_t)threads);
    probe_job *jobs = xcalloc((size_t)n_jobs, sizeof *jobs);
    if (pat->reread) {
        p->file = p->last_file;
        p->off = p->last_off;
    }
    p->last_file = p->file;
    p->last_off = p->off;
    int skipped = 0;
    for (int i = 0; i < n_jobs; i++) {
        while (p->off + pat->block > p->sizes[p->file] && skipped <= p->n) {   /* next shard big enough */
            p->file = (p->file + 1) % p->n;
            p->off = 0;
            skipped++;
        }
        if (skipped > p->n) {
            n_jobs = i;
            break;
        }
        skipped = 0;
        if (pat->spread && p->n > 1) {   /* the same offset in every shard, then move on */
            uint64_t at = p->off;
            for (int f = 0; f < p->n && i < n_jobs; f++) {
                if (at + pat->block > p->sizes[f]) continue;
                jobs[i++] = (probe_job){.file = f, .off = at, .len = pat->block};
            }
            i--;
            p->off += pat->block;
            continue;
        }
        jobs[i] = (probe_job){.file = p->file, .off = p->off, .len = pat->block};
        p->off += pat->block;
    }
    double r = n_jobs ? probe_exec(p, pat, kind, threads, jobs, n_jobs, pat->block + IO_ALIGN, err, cap) : -1;
    free(jobs);
    if (!n_jobs) return snprintf(err, cap, "no shard is larger than %llu bytes", (unsigned long long)pat->block), -1;
    return r;
}

/* Every pattern once; the best is the disk's bandwidth for this run (the I/O floor's denominator). */
static int probe_all(probe_disk *p, uint64_t limit, char *err, size_t cap) {
    for (int i = 0; i < PROBE_PATTERNS; i++)
        if ((p->gbps[i] = probe_run(p, &probe_patterns[i], limit, err, cap)) < 0) return -1;
    return 0;
}

static int probe_best(const probe_disk *p) {
    int b = 0;
    for (int i = 1; i < PROBE_PATTERNS; i++)
        if (p->gbps[i] > p->gbps[b]) b = i;
    return b;
}

static double probe_gbps(const probe_disk *p) { return DF_MAX(p->gbps[probe_best(p)], p->gbps[PROBE_PATTERNS]); }

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin bench -m DIR [-n N] [--prompt T] [--parallel S] [--json] [--threads N]\n"
               "                      [storage options]\n"
               "  decodes N tokens (default 8) after a T-token prompt (default 8) and reports s/token, its\n"
               "  breakdown, disk bytes per token, cache hit rate, read GB/s, the I/O floor, the compute-only time\n"
               "  and s/token / max(floor, compute-only)\n"
               "  --parallel S      S independent streams (different prompts), decoded together: one forward\n"
               "                    pass per step with one row per stream (default 1); reports the aggregate\n"
               "                    tokens/s, s/token per stream, and disk bytes and I/O floor per pass and per\n"
               "                    generated token\n"
               "  --prefill-rows R  rows per prefill pass (default: from the memory budget, as the server)\n"
               "  --probe-gb G      GB read by each disk probe pattern (default 1.5)\n"
               "  --reruns R        compute-only time: the last token re-run R times with its experts cached\n"
               "                    (default 3; 0 skips it)\n"
               "  --prompts FILE    decode N tokens after each prompt of a set (JSON lines {\"kind\",\"text\"},\n"
               "                    e.g. bench/spec_prompts.jsonl) instead of the random prompt\n"
               "  --kind K          only the prompts of this kind (repetitive, prose)\n"
               "speculative decoding (default off here, so the plain decode is what is measured):\n" CLI_SPEC_USAGE
               "storage options:\n" CLI_STORAGE_USAGE
               "(`deltafin bench kernels` benchmarks the matmul kernels)\n");
}

typedef struct bench_result {
    int n, prompt, lookahead;           /* n: tokens per stream */
    int parallel;                       /* streams decoded together */
    int prefill_passes, prefill_rows;   /* passes the prompts took, of at most this many rows */
    int64_t prefill_unique;             /* (layer, expert) pairs the prefill needed; -1: unknown */
    uint64_t prefill_asked;             /* the passes' per-layer unions summed (storage's expert requests) */
    uint64_t session_bytes;             /* what the streams' sessions hold (saved copies included) */
    double prefill_s, decode_s;
    double disk_gbps;                   /* the best rate measured: the probe's or the engine's own (below) */
    double probe_gbps, engine_gbps;     /* the probe's best pattern; the decode's bytes over its time with reads
                                           in flight (0 when it read too little to tell) */
    double compute_s, compute_wall_s;   /* best re-run of the last token: wall minus read waits, and wall */
    uint64_t compute_disk_bytes;        /* read during that re-run (0 when everything was cached) */
    int reruns, rerun_same;             /* re-runs done; their logits equal the timed run's */
    int n_layers;
    df_layer_lookahead *la;             /* per layer, after decoding */
    probe_disk probe;
    uint64_t rss_peak;
    df_stats s0, s1, s2;     /* after open, after prefill, after decode */
    df_profile prof;
    int32_t *tokens;                    /* [parallel][n] */
    int passes, drafted, accepted;
    const char *spec;        /* speculation mode */
    int ranks;                          /* expert parallelism: ranks serving the engine */
    uint64_t rank_disk[2][64], rank_la[2][64];   /* each rank's expert disk bytes, look-ahead reads: after prefill,
                                                   after decode */
    df_net_stats net[2];                /* rank 0's traffic with the other ranks, the same two moments */
    const char *backend;     /* "cpu" or "cuda" */
    double gpu_gbps;         /* on a GPU: its measured memory read rate */
    uint64_t gpu_bytes;      /* on a GPU: weight bytes per decode pass */
} bench_result;

/* Each rank's counters and the traffic between them, at moment k (0: after prefill, 1: after decode). */
static int bench_rank_snap(df_engine *eng, bench_result *r, int k, df_error *err) {
    r->ranks = DF_MIN(df_engine_ranks(eng), 64);
    df_engine_net_stats(eng, &r->net[k]);
    for (int i = 0; i < r->ranks; i++) {
        df_rank_info in;
        int rc = df_engine_rank_info(eng, i, &in, err);
        if (rc) return rc;
        r->rank_disk[k][i] = in.expert_disk_bytes, r->rank_la[k][i] = in.lookahead_loads;
    }
    return DF_OK;
}

/* Per stream (= per pass when not speculating): s/token, compute-only, breakdown. Per generated token (all
 * streams together): disk bytes, io_floor_s_per_token. The floor a stream's token is held to is the pass's:
 * the floor per generated token times the streams. */
static void print_result(const bench_result *r, int json, const char *dir) {
    double n = r->n, streams = r->parallel, gen = n * streams, passes = r->passes ? r->passes : 1;
    uint64_t disk = r->s2.disk_bytes - r->s1.disk_bytes, hits = r->s2.expert_hits - r->s1.expert_hits,
             miss = r->s2.expert_misses - r->s1.expert_misses;
    double spt = r->decode_s / n, bpt = disk / gen, floor = bpt / (r->disk_gbps * 1e9), floor_stream = floor * streams;
    double agg = r->decode_s > 0 ? gen / r->decode_s : 0;
    double hit = hits + miss ? (double)hits / (double)(hits + miss) : 1.0;
    double other = spt - r->prof.total / n;
    uint64_t la_req = r->s2.lookahead_requests - r->s1.lookahead_requests;
    double recall = la_req ? (double)(r->s2.lookahead_recalled - r->s1.lookahead_recalled) / (double)la_req : 0;
    double la_loads = (double)(r->s2.lookahead_loads - r->s1.lookahead_loads);
    uint64_t pre_exp = r->s1.expert_disk_bytes - r->s0.expert_disk_bytes;
    uint64_t pre_loads = r->s1.expert_loads - r->s0.expert_loads;
    uint64_t pre_guess = r->s1.lookahead_loads - r->s0.lookahead_loads;
    double ebpt = (r->s2.expert_disk_bytes - r->s1.expert_disk_bytes) / gen;
    double sbpt = (r->s2.spine_disk_bytes - r->s1.spine_disk_bytes) / gen;
    double read_gbps = r->decode_s > 0 ? disk / r->decode_s / 1e9 : 0;
    double busy = r->decode_s > 0 ? (r->s2.io_busy_s - r->s1.io_busy_s) / r->decode_s : 0;
    double bound = DF_MAX(floor_stream, r->compute_s), ratio = bound > 0 ? spt / bound : 0;
    static const char *const la_modes[] = {"auto", "on", "off"};
    const char *la_mode = la_modes[r->lookahead >= 0 && r->lookahead <= 2 ? r->lookahead : 0];
    char rank_list[64 * 24] = "", la_list[64 * 24] = "";
    for (int i = 0, at = 0, al = 0; i < r->ranks; i++) {
        at += snprintf(rank_list + at, sizeof rank_list - (size_t)at, "%s%.0f", i ? "," : "",
                       (double)(r->rank_disk[1][i] - r->rank_disk[0][i]) / gen);
        al += snprintf(la_list + al, sizeof la_list - (size_t)al, "%s%.2f", i ? "," : "",
                       (double)(r->rank_la[1][i] - r->rank_la[0][i]) / gen);
    }
    double net_bpt = (double)(r->net[1].bytes_sent + r->net[1].bytes_recv - r->net[0].bytes_sent - r->net[0].bytes_recv) / gen;
    /* rank 0 blocked on the others: on the network itself (the messages' travel), and on them still working */
    double net_wait = (r->net[1].link_wait_s - r->net[0].link_wait_s) / gen;
    double rank_wait = DF_MAX(0.0, (r->net[1].wait_s - r->net[0].wait_s) / gen - net_wait);
    /* On a GPU every weight is in device memory: the floor is the bytes a pass reads there over the device's own
     * measured read rate (the disk plays no part). */
    double gpu_floor = r->gpu_gbps > 0 ? r->gpu_bytes / (r->gpu_gbps * 1e9) : 0, gpu_spp = r->decode_s / passes;
    if (json) {
        printf("{\"backend\":\"%s\",\"gpu_read_gbps\":%.1f,\"gpu_weight_bytes_per_pass\":%llu,"
               "\"gpu_roofline_s_per_pass\":%.6f,\"s_per_pass\":%.6f,\"gpu_roofline_share\":%.4f,"
               "\"prefill_tokens_per_s\":%.1f,", r->backend, r->gpu_gbps,
               (unsigned long long)r->gpu_bytes, gpu_floor, gpu_spp, gpu_spp > 0 ? gpu_floor / gpu_spp : 0,
               r->prefill_s > 0 ? (double)r->prompt * r->parallel / r->prefill_s : 0);
        printf("\"spec\":\"%s\",\"passes\":%d,\"tokens_per_pass\":%.4f,\"drafted\":%d,\"accepted\":%d,", r->spec,
               r->passes, r->passes ? gen / r->passes : 0, r->drafted, r->accepted);
        printf("\"parallel\":%d,\"tokens_per_stream\":%d,\"aggregate_tokens_per_s\":%.4f,\"disk_bytes_per_pass\":%.0f,"
               "\"io_floor_s_per_pass\":%.6f,\"prefill_chunks\":%d,\"prefill_rows_per_pass\":%d,"
               "\"prefill_expert_requests\":%llu,\"prefill_lookahead_loads\":%llu,\"session_bytes\":%llu,",
               r->parallel, r->n, agg, disk / passes, disk / passes / (r->disk_gbps * 1e9), r->prefill_passes,
               r->prefill_rows, (unsigned long long)r->prefill_asked, (unsigned long long)pre_guess,
               (unsigned long long)r->session_bytes);
        if (r->prefill_unique >= 0) printf("\"prefill_unique_experts\":%lld,", (long long)r->prefill_unique);
        else printf("\"prefill_unique_experts\":null,");
        printf("\"model\":\"%s\",\"tokens\":%.0f,\"prompt_tokens\":%d,\"s_per_token\":%.6f,"
               "\"io_floor_s_per_token\":%.6f,"
               "\"compute_s_per_token\":%.6f,\"floor_ratio\":%.4f,\"io_ratio\":%.4f,\"compute_wall_s_per_token\":%.6f,"
               "\"compute_rerun_disk_bytes\":%llu,\"compute_reruns\":%d,\"rerun_logits_identical\":%s,"
               "\"lookahead\":\"%s\",\"disk_bytes_per_token\":%.0f,\"expert_bytes_per_token\":%.0f,"
               "\"spine_bytes_per_token\":%.0f,\"disk_gbps\":%.4f,\"probe_gbps\":%.4f,\"engine_gbps\":%.4f,"
               "\"read_gbps\":%.4f,\"disk_busy_share\":%.4f,"
               "\"cache_hit_rate\":%.4f,"
               "\"rss_peak_bytes\":%llu,\"mem_budget_bytes\":%llu,\"cache_slots\":%d,\"streamed_layers\":%d,"
               "\"split_layers\":%d,"
               "\"prefill_s\":%.4f,\"prefill_expert_bytes\":%llu,\"prefill_expert_reads\":%llu,"
               "\"io\":\"%s\",\"lookahead_recall\":%.4f,\"lookahead_loads_per_token\":%.2f,"
               "\"breakdown\":{\"spine_read\":%.6f,\"expert_read\":%.6f,"
               "\"spine_compute\":%.6f,\"attention\":%.6f,\"expert_compute\":%.6f,\"lm_head\":%.6f,\"other\":%.6f},"
               "\"ranks\":%d,\"rank_disk_bytes_per_token\":[%s],\"net_bytes_per_token\":%.0f,"
               "\"net_wait_s_per_token\":%.6f,\"rank_wait_s_per_token\":%.6f,\"spine_remote_s_per_token\":%.6f,"
               "\"rank_lookahead_loads_per_token\":[%s],\"generated\":[",
               dir, gen, r->prompt, spt, floor, r->compute_s, ratio, floor_stream > 0 ? spt / floor_stream : 0,
               r->compute_wall_s, (unsigned long long)r->compute_disk_bytes, r->reruns,
               r->rerun_same ? "true" : "false", la_mode, bpt, ebpt, sbpt, r->disk_gbps, r->probe_gbps, r->engine_gbps,
               read_gbps, busy, hit,
               (unsigned long long)r->rss_peak, (unsigned long long)r->s2.mem_budget, r->s2.cache_slots,
               r->s2.streamed_layers, r->s2.split_layers, r->prefill_s, (unsigned long long)pre_exp,
               (unsigned long long)pre_loads,
               r->s2.io_uring ? "uring" : "pread", recall, la_loads / gen, r->prof.spine_read / n,
               r->prof.expert_read / n, r->prof.spine_compute / n, r->prof.attention / n, r->prof.expert_compute / n,
               r->prof.lm_head / n, other > 0 ? other : 0, r->ranks, rank_list, net_bpt, net_wait,
               rank_wait, r->prof.spine_remote / n, la_list);
        for (int i = 0; i < r->n; i++) printf("%s%d", i ? "," : "", r->tokens[i]);
        printf("],\"generated_streams\":[");
        for (int k = 0; k < r->parallel; k++) {
            printf("%s[", k ? "," : "");
            for (int i = 0; i < r->n; i++) printf("%s%d", i ? "," : "", r->tokens[(size_t)k * r->n + i]);
            printf("]");
        }
        printf("],\"disk_probe\":[");
        for (int i = 0; i <= PROBE_PATTERNS; i++)
            printf("%s{\"pattern\":\"%s%s\",\"gbps\":%.4f}", i ? "," : "",
                   probe_patterns[i < PROBE_PATTERNS ? i : probe_best(&r->probe)].name,
                   i < PROBE_PATTERNS ? "" : ", after decoding", r->probe.gbps[i]);
        printf("],\"lookahead_layers\":[");
        for (int l = 0, k = 0; l < r->n_layers; l++)
            if (r->la[l].requests || r->la[l].loads) {
                printf("%s{\"layer\":%d,\"requests\":%llu,\"recalled\":%llu,\"recall\":%.4f,\"loads\":%llu,"
                       "\"read_ranks\":%d,\"precision_by_rank\":", k++ ? "," : "", l,
                       (unsigned long long)r->la[l].requests, (unsigned long long)r->la[l].recalled,
                       r->la[l].requests ? (double)r->la[l].recalled / (double)r->la[l].requests : 0.0,
                       (unsigned long long)r->la[l].loads, r->la[l].read_ranks);
                cli_lookahead_precision(stdout, &r->la[l], 1, 1);
                printf("}");
            }
        printf("],\"lookahead_precision_by_rank\":");
        cli_lookahead_precision(stdout, r->la, r->n_layers, 1);
        printf("}\n");
        return;
    }
    printf("model %s\n", dir);
    if (r->gpu_gbps > 0)
        printf("gpu: memory read %.0f GB/s (measured); %.3f GB of weights per decode pass: roofline %.3f ms, decode "
               "%.3f ms per pass = %.1f %% of it; prefill %.0f tokens/s\n", r->gpu_gbps, r->gpu_bytes / 1e9,
               gpu_floor * 1e3, gpu_spp * 1e3, gpu_spp > 0 ? 100 * gpu_floor / gpu_spp : 0,
               r->prefill_s > 0 ? (double)r->prompt * r->parallel / r->prefill_s : 0);
    printf("memory: budget %.2f GiB; spine %s (%d layers streamed, %d of them in parts, %.2f GiB resident, %.2f GiB "
           "stream buffers); "
           "expert cache %d slots (%.2f GiB); %d session%s %.2f MiB\n", r->s2.mem_budget / 1073741824.0,
           r->s2.streamed_layers ? "streamed" : "resident", r->s2.streamed_layers, r->s2.split_layers,
           r->s2.resident_spine_bytes / 1073741824.0, r->s2.stream_buffer_bytes / 1073741824.0, r->s2.cache_slots,
           r->s2.cache_bytes / 1073741824.0, r->parallel, r->parallel > 1 ? "s" : "", r->session_bytes / 1048576.0);
    printf("disk: %.2f GB/s O_DIRECT, best of:", r->disk_gbps);
    for (int i = 0; i <= PROBE_PATTERNS; i++)
        printf("%s %s%s %.2f", i ? ";" : "", probe_patterns[i < PROBE_PATTERNS ? i : probe_best(&r->probe)].name,
               i < PROBE_PATTERNS ? "" : " (after decoding)", r->probe.gbps[i]);
    printf(" (%.2f GB probed); the engine's reads while in flight during the decode %.2f\nreader: %s\n",
           r->probe.bytes / 1e9, r->engine_gbps, r->s2.io_uring ? "io_uring" : "pread pool");
    if (r->prefill_passes) {
        printf("prefill: %d tokens", r->prompt);
        if (r->parallel > 1) printf(" x %d streams", r->parallel);
        printf(" in %.2f s, %d pass%s of up to %d rows; experts read %llu (%.2f GB) for ", r->prefill_s,
               r->prefill_passes, r->prefill_passes > 1 ? "es" : "", r->prefill_rows, (unsigned long long)pre_loads,
               pre_exp / 1e9);
        if (r->prefill_unique >= 0)
            printf("%lld unique (layer, expert) needed: reads %s unique pairs", (long long)r->prefill_unique,
                   (int64_t)pre_loads == r->prefill_unique ? "==" : (int64_t)pre_loads < r->prefill_unique ? "<" : ">");
        else
            printf("an unknown number of unique (layer, expert) pairs (routing trace unreadable)");
        printf(" (%llu of the reads started by look-ahead guesses; per-pass unions summed: %llu)\n",
               (unsigned long long)pre_guess, (unsigned long long)r->prefill_asked);
    } else {
        printf("prefill: %d tokens in %.2f s (inside the speculative decode; its reads are not counted here)\n",
               r->prompt, r->prefill_s);
    }
    if (r->parallel > 1)
        printf("decode: %d streams x %d tokens, %d passes: %.3f s/token per stream, %.3f tokens/s aggregate; I/O floor "
               "%.3f s/pass (%.2f GB/pass at %.2f GB/s), %.3f s/generated token; compute-only %.3f s/pass; "
               "s/token / max(floor, compute) = %.2f\n", r->parallel, r->n, r->passes, spt, agg, floor_stream,
               disk / passes / 1e9, r->disk_gbps, floor, r->compute_s, ratio);
    else
        printf("decode: %d tokens, %.3f s/token; I/O floor %.3f s/token (%.2f GB/token at %.2f GB/s); compute-only "
               "%.3f s/token; s/token / max(floor, compute) = %.2f\n", r->n, spt, floor, bpt / 1e9, r->disk_gbps,
               r->compute_s, ratio);
    if (r->reruns)
        printf("  compute-only: the last %s again from its saved state, best of %d: %.3f s wall - read waits, "
               "%.2f GB read in that run%s; logits %s the timed run's\n", r->parallel > 1 ? "pass" : "token",
               r->reruns, r->compute_wall_s, r->compute_disk_bytes / 1e9,
               r->compute_disk_bytes ? " (not everything fit the cache)" : "",
               r->rerun_same ? "identical to" : "DIFFER from");
    printf("  disk %.2f GB/%s (experts %.2f, spine %.2f), read %.2f GB/s, reads in flight %.0f%% of the time, "
           "cache hit rate %.1f%%\n", bpt / 1e9, r->parallel > 1 ? "generated token" : "token", ebpt / 1e9,
           sbpt / 1e9, read_gbps, 100 * busy, 100 * hit);
    if (r->ranks > 1)
        printf("  ranks %d: expert disk bytes/token by rank [%s]; %.0f network bytes/token; rank 0 waits %.6f s/token "
               "on the network, %.6f s on the others' work\n", r->ranks, rank_list, net_bpt, net_wait, rank_wait);
    printf("  per %s: spine read wait %.3f s, expert read wait %.3f s, spine compute %.3f s, attention %.3f s, "
           "expert compute %.3f s, lm_head %.3f s, other %.3f s\n", r->parallel > 1 ? "pass" : "token",
           r->prof.spine_read / n, r->prof.expert_read / n, r->prof.spine_compute / n, r->prof.attention / n,
           r->prof.expert_compute / n, r->prof.lm_head / n, other > 0 ? other : 0);
    printf("  speculation %s: %d passes, %.2f tokens/pass, drafted %d, accepted %d\n", r->spec, r->passes,
           r->passes ? gen / r->passes : 0, r->drafted, r->accepted);
    if (r->s2.lookahead_requests || la_loads) {
        printf("  look-ahead %s: recall %.1f%% of the experts asked for, %.1f guessed reads/%s\n  ", la_mode,
               100 * recall, la_loads / gen, r->parallel > 1 ? "generated token" : "token");
        cli_lookahead_layers(stdout, r->la, r->n_layers, "at the end");
        printf("\n  precision of the guesses by confidence rank, all layers: ");
        cli_lookahead_precision(stdout, r->la, r->n_layers, 0);
        printf("\n");
    }
    printf("  peak RSS %.2f GiB\n", r->rss_peak / 1073741824.0);
}

/* The engine's own reads are a measurement of the disk too, with exactly its request sizes and queue depths:
 * the decode's bytes over the time it had reads in flight. The floor takes it when it beats every probe pattern,
 * as it does where several sources' reads overlap; a floor below what the engine itself read at would let
 * s/token come out under its floor. Too few bytes or too short a time say nothing. */
static double bench_engine_gbps(const bench_result *r) {
    double busy = r->s2.io_busy_s - r->s1.io_busy_s, disk = (double)(r->s2.disk_bytes - r->s1.disk_bytes);
    return busy >= 0.05 && disk >= 64e6 ? disk / busy / 1e9 : 0;
}

/* The compute-only time: the last decode pass evaluated again, `reruns` times, from the states saved before
 * it, so its experts are the ones just read (cached, if the cache holds one pass's experts); each run's wall
 * time minus whatever it still waited for reads (a streamed spine is re-read every pass), the best run kept.
 * Its logits must equal the timed run's (b->logits, after that pass; tok: its tokens). */
static int bench_rerun(df_engine *eng, bench_streams *b, const int32_t *tok, int reruns, bench_result *r,
                       df_error *err) {
    size_t nl = (size_t)b->n * (size_t)b->vocab;
    float *got = xmalloc(nl * sizeof(float));
    int rc = DF_OK;
    r->rerun_same = 1;
    for (int k = 0; !rc && k < reruns; k++) {
        rc = bench_streams_restore(b, err);
        df_stats a, c;
        df_profile pp;
        df_engine_profile_reset(eng);
        df_engine_stats(eng, &a);
        double t = df_now();
        if (!rc) rc = bench_streams_eval(b, tok, got, err);
        double wall = df_now() - t;
        if (rc) break;
        df_engine_profile(eng, &pp);
        df_engine_stats(eng, &c);
        double comp = DF_MAX(0.0, wall - pp.spine_read - pp.expert_read);
        if (!k || comp < r->compute_s) {
            r->compute_s = comp;
            r->compute_wall_s = wall;
            r->compute_disk_bytes = c.disk_bytes - a.disk_bytes;
        }
        r->rerun_same &= !memcmp(got, b->logits, nl * sizeof(float));
        r->reruns++;
    }
    free(got);
    return rc;
}

int bench_model(int argc, char **argv) {
    enum { OPT_JSON = 0x2000, OPT_PROMPT, OPT_PROBE, OPT_RERUNS, OPT_PROMPTS, OPT_KIND, OPT_PARALLEL,
           OPT_PREFILL_ROWS };
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"json", 0, 0, OPT_JSON}, {"prompt", 1, 0, OPT_PROMPT},
                                       {"threads", 1, 0, 't'}, {"probe-gb", 1, 0, OPT_PROBE}, {"help", 0, 0, 'h'},
                                       {"reruns", 1, 0, OPT_RERUNS}, {"prompts", 1, 0, OPT_PROMPTS},
                                       {"kind", 1, 0, OPT_KIND}, {"parallel", 1, 0, OPT_PARALLEL},
                                       {"prefill-rows", 1, 0, OPT_PREFILL_ROWS}, CLI_STORAGE_LONGOPTS,
                                       CLI_SPEC_LONGOPTS, {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    int json = 0, c, n = 8, prompt = 8, reruns = BENCH_RERUNS, parallel = 1, prefill_rows = 0;
    double probe_gb = 1.5;
    bench_spec_args sa = {0};
    spec_opts_default(&sa.spec);
    sa.spec.mode = SPEC_OFF;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:h", lo, NULL)) != -1) {
        int s = cli_storage_opt(c, optarg, &opts);
        if (s < 0) return 2;
        if (s) continue;
        if ((s = cli_spec_opt(c, optarg, &sa.spec)) < 0) return 2;
        if (s) continue;
        switch (c) {
        case OPT_PROMPTS: sa.prompts_path = optarg; break;
        case OPT_KIND: sa.kind = optarg; break;
        case 'm': opts.model_dir = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 't': opts.n_threads = atoi(optarg); break;
        case OPT_JSON: json = 1; break;
        case OPT_PROMPT: prompt = atoi(optarg); break;
        case OPT_PROBE: probe_gb = atof(optarg); break;
        case OPT_RERUNS: reruns = atoi(optarg); break;
        case OPT_PARALLEL:
        case OPT_PREFILL_ROWS: {
            long v;
            if (cli_parse_int(c == OPT_PARALLEL ? "--parallel" : "--prefill-rows", optarg, 1,
                              c == OPT_PARALLEL ? BENCH_MAX_STREAMS : 1 << 20, &v) < 0)
                return 2;
            *(c == OPT_PARALLEL ? &parallel : &prefill_rows) = (int)v;
            break;
        }
        default: usage(c == 'h' ? stdout : stderr); return c == 'h' ? 0 : 2;
        }
    }
    if (optind < argc) {   /* e.g. "--lookahead off", which getopt reads as a bare --lookahead and a word */
        fprintf(stderr, "deltafin bench: unexpected argument '%s' (options with a value: --opt=VALUE)\n", argv[optind]);
        return 2;
    }
    if (n < 1 || prompt < 1 || probe_gb <= 0 || reruns < 0) {
        usage(stderr);
        return 2;
    }
    if (!opts.model_dir) {   /* a benchmark names what it measures */
        fprintf(stderr, "deltafin bench: -m DIR is required (or `deltafin bench kernels`)\n");
        usage(stderr);
        return 2;
    }
    int served;
    if (cli_rank_serve(&opts, "bench", &served)) return served;
    int spec_path = sa.spec.mode != SPEC_OFF || sa.prompts_path;
    if (spec_path && (parallel > 1 || prefill_rows)) {
        fprintf(stderr, "deltafin bench: --parallel and --prefill-rows measure the plain decode: they cannot be "
                        "combined with --spec or --prompts\n");
        return 2;
    }
    bench_result r = {.n = n, .prompt = prompt, .lookahead = opts.lookahead, .passes = n, .parallel = parallel,
                      .spec = spec_mode_name(sa.spec.mode), .backend = "cpu"};
    char perr[8192] = "";
    uint64_t probe_limit = (uint64_t)(probe_gb * 1e9);
    int probe_rc = probe_init(&r.probe, opts.model_dir, perr, sizeof perr);
    r.probe.eng_kind = opts.io_kind;
    r.probe.eng_threads = opts.io_threads > 0 ? opts.io_threads : 8;
    if (!probe_rc) probe_find_experts(&r.probe);
    if (probe_rc || probe_all(&r.probe, probe_limit, perr, sizeof perr)) {
        fprintf(stderr, "deltafin bench: %s\n", perr);
        probe_free(&r.probe);
        return 1;
    }
    /* The prefill's unique expert pairs come from the routing trace: the user's, or one of our own. */
    char trace_tmp[64] = "";
    if (!spec_path && !opts.trace_routing) {
        const char *tmp = getenv("TMPDIR");
        snprintf(trace_tmp, sizeof trace_tmp, "%s/deltafin-bench-routing-XXXXXX",
                 tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp");
        int fd = mkstemp(trace_tmp);
        if (fd >= 0) {
            close(fd);
            opts.trace_routing = trace_tmp;
        } else {
            trace_tmp[0] = 0;
        }
    }
    df_error err = {0};
    df_engine *eng = NULL;
    bench_streams b = {0};
    int rc = df_engine_open(&eng, &opts, &err);
    if (!rc) df_engine_populate_wait(eng);   /* times below leave out the first touch of the cache's pages */
    if (!rc) rc = bench_streams_init(&b, eng, parallel, prompt, reruns && !spec_path, &err);
    int V = rc ? 0 : b.vocab;
    r.tokens = xmalloc(sizeof *r.tokens * (size_t)n * (size_t)parallel);
    int32_t *step = xmalloc(sizeof *step * (size_t)parallel);
    bench_spec_result br = {0};
    if (!rc && spec_path) {   /* prefills happen inside: counters and profile cover the decode phases only */
        df_engine_stats(eng, &r.s0);
        r.s1 = r.s0;
        df_engine_profile_reset(eng);
        sa.model_dir = opts.model_dir;
        sa.spec.n_threads = opts.n_threads;
        sa.random_prompt = b.ids;
        sa.n_random = prompt;
        sa.n = n;
        rc = bench_spec_decode(eng, b.s[0], &sa, &br, &err);
        if (!rc) {
            r.n = (int)br.tokens.n;
            r.tokens = xrealloc(r.tokens, sizeof *r.tokens * (br.tokens.n ? br.tokens.n : 1));
            memcpy(r.tokens, br.tokens.v, br.tokens.n * sizeof *r.tokens);
            r.prompt = br.prompt_tokens;
            r.prefill_s = br.prefill_s;
            r.decode_s = br.decode_s;
            r.passes = br.passes;
            r.drafted = br.drafted;
            r.accepted = br.accepted;
            df_engine_stats(eng, &r.s2);
            bench_spec_shift(&r.s2, &r.s1, &br.delta);
            r.prof = br.prof;
            r.rss_peak = budget_rss_peak();
        }
        tok_ids_free(&br.tokens);
    } else if (!rc) {
        struct stat sb;
        int64_t trace_from = opts.trace_routing && !stat(opts.trace_routing, &sb) ? (int64_t)sb.st_size : 0;
        r.prefill_rows = prefill_rows ? prefill_rows : df_engine_pass_rows(eng);
        df_engine_stats(eng, &r.s0);
        double t0 = df_now();
        rc = bench_streams_prefill(&b, r.prefill_rows, &r.prefill_passes, &err);
        r.prefill_s = df_now() - t0;
        df_engine_stats(eng, &r.s1);
        if (!rc) rc = bench_rank_snap(eng, &r, 0, &err);
        df_engine_profile_reset(eng);
        r.prefill_asked = r.s1.expert_requests - r.s0.expert_requests;
        uint64_t traced = 0;
        r.prefill_unique = opts.trace_routing ? bench_trace_unique(opts.trace_routing, trace_from, &traced) : -1;
        if (traced != r.prefill_asked) r.prefill_unique = -1;   /* not this prefill's records alone */
        if (r.prefill_unique < 0 && r.prefill_passes == 1) r.prefill_unique = (int64_t)r.prefill_asked;
    }
    double t1 = df_now();
    for (int i = 0; !rc && !spec_path && i < n; i++) {
        for (int k = 0; k < parallel; k++)
            step[k] = r.tokens[(size_t)k * n + i] = argmax(b.logits + (size_t)k * V, V);
        if (b.saved && i == n - 1) {   /* outside the timed loop's work only by a copy of the states */
            double tc = df_now();
            rc = bench_streams_save(&b, &err);
            t1 += df_now() - tc;
        }
        if (!rc) rc = bench_streams_eval(&b, step, b.logits, &err);
    }
    if (!spec_path) r.decode_s = df_now() - t1;
    if (!rc && !spec_path) {
        df_engine_stats(eng, &r.s2);
        rc = bench_rank_snap(eng, &r, 1, &err);
        df_engine_profile(eng, &r.prof);
        r.backend = df_engine_backend(eng);
        r.gpu_gbps = df_engine_gpu_read_gbps(eng);
        r.gpu_bytes = df_engine_decode_weight_bytes(eng);
        r.rss_peak = budget_rss_peak();
        r.n_layers = df_engine_info(eng)->n_layers;
        r.la = xcalloc((size_t)r.n_layers + 1, sizeof *r.la);
        for (int l = 0; l < r.n_layers; l++) df_engine_lookahead_layer(eng, l, &r.la[l]);
    }
    if (!rc) r.session_bytes = bench_streams_memory(&b);
    if (!rc && b.saved) rc = bench_rerun(eng, &b, step, reruns, &r, &err);
    bench_streams_free(&b);
    df_engine_free(eng);   /* its memory goes back before the probe allocates buffers again */
    eng = NULL;
    if (trace_tmp[0]) unlink(trace_tmp);
    if (!rc) {
        r.probe.gbps[PROBE_PATTERNS] = probe_run(&r.probe, &probe_patterns[probe_best(&r.probe)], probe_limit, perr,
                                                 sizeof perr);
        if (r.probe.gbps[PROBE_PATTERNS] < 0) {
            df_error_set(&err, DF_EIO, "%s", perr);
            rc = DF_EIO;
        }
    }
    if (!rc) {
        r.probe_gbps = probe_gbps(&r.probe);
        r.engine_gbps = bench_engine_gbps(&r);
        r.disk_gbps = DF_MAX(r.probe_gbps, r.engine_gbps);
        print_result(&r, json, opts.model_dir);
    } else {
        fprintf(stderr, "deltafin bench: %s\n", err.msg);
    }
    probe_free(&r.probe);
    free(r.la);
    free(step);
    free(r.tokens);
    return rc ? 1 : 0;
}
