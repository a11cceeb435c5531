/* bench_model.c — `deltafin bench -m DIR [-n N] [--json]`: the decode benchmark of the streaming engine.
 *
 * In one run it measures the disk (O_DIRECT sequential reads of the model's own largest shard, several
 * requests in flight), prefills a short prompt (reporting the expert bytes that prefill read against the
 * unique experts it needed), then decodes N tokens greedily and reports s/token, where the time went
 * (df_engine_profile), bytes read from disk per token, the cache hit rate, the read rate achieved, the peak
 * resident set and the I/O floor: bytes that had to come from disk / the measured disk bandwidth. */
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
#include "cli.h"
#include "cli_opts.h"
#include "common/util.h"
#include "storage/budget.h"

#define PROBE_BLOCK (8u << 20)
#define PROBE_THREADS 8

typedef struct probe {
    int fd;
    uint64_t bytes;
    int next;      /* next block to read, under mu */
    int n_blocks;
    pthread_mutex_t mu;
    int failed;
} probe;

static void *probe_main(void *arg) {
    probe *p = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, PROBE_BLOCK)) return NULL;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int b = p->next < p->n_blocks ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (b < 0) break;
        ssize_t r = pread(p->fd, buf, PROBE_BLOCK, (off_t)b * PROBE_BLOCK);
        if (r < 0) p->failed = 1;
    }
    free(buf);
    return NULL;
}

/* Sequential O_DIRECT read bandwidth (GB/s) over up to `limit` bytes of the largest shard in dir. */
static double probe_disk(const char *dir, uint64_t limit, uint64_t *probed, char *err, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return snprintf(err, cap, "%s: %s", dir, strerror(errno)), -1;
    char best[4096] = "";
    off_t best_size = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors")) continue;
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &sb) == 0 && sb.st_size > best_size) best_size = sb.st_size, snprintf(best, sizeof best, "%s", path);
    }
    closedir(d);
    if (!best_size) return snprintf(err, cap, "%s: no .safetensors file", dir), -1;
    probe p = {.fd = open(best, O_RDONLY | O_DIRECT | O_CLOEXEC)};
    if (p.fd < 0) p.fd = open(best, O_RDONLY | O_CLOEXEC);
    if (p.fd < 0) return snprintf(err, cap, "%s: %s", best, strerror(errno)), -1;
    uint64_t span = DF_MIN((uint64_t)best_size, limit);
    p.n_blocks = (int)(span / PROBE_BLOCK);
    if (p.n_blocks < 1) p.n_blocks = 1;
    pthread_mutex_init(&p.mu, NULL);
    pthread_t th[PROBE_THREADS];
    double t0 = df_now();
    for (int i = 0; i < PROBE_THREADS; i++) pthread_create(&th[i], NULL, probe_main, &p);
    for (int i = 0; i < PROBE_THREADS; i++) pthread_join(th[i], NULL);
    double dt = df_now() - t0;
    pthread_mutex_destroy(&p.mu);
    close(p.fd);
    *probed = (uint64_t)p.n_blocks * PROBE_BLOCK;
    if (p.failed) return snprintf(err, cap, "%s: read failed during the disk probe", best), -1;
    return (double)*probed / dt / 1e9;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin bench -m DIR [-n N] [--prompt T] [--json] [--threads N] [storage options]\n"
               "  decodes N tokens (default 8) after a T-token prompt (default 8) and reports s/token, its\n"
               "  breakdown, disk bytes per token, cache hit rate, read GB/s and the I/O floor\n"
               "  --probe-gb G      bytes of the largest shard read to measure the disk (default 2)\n"
               "storage options:\n" CLI_STORAGE_USAGE
               "(`deltafin bench kernels` benchmarks the matmul kernels)\n");
}

typedef struct bench_result {
    int n, prompt;
    double prefill_s, decode_s, disk_gbps;
    uint64_t probe_bytes, rss_peak;
    df_stats s0, s1, s2;     /* after open, after prefill, after decode */
    df_profile prof;
    int32_t *tokens;
} bench_result;

static void print_result(const bench_result *r, int json, const char *dir) {
    double n = r->n;
    uint64_t disk = r->s2.disk_bytes - r->s1.disk_bytes, hits = r->s2.expert_hits - r->s1.expert_hits,
             miss = r->s2.expert_misses - r->s1.expert_misses;
    double spt = r->decode_s / n, bpt = disk / n, floor = bpt / (r->disk_gbps * 1e9);
    double hit = hits + miss ? (double)hits / (double)(hits + miss) : 1.0;
    double other = spt - r->prof.total / n;
    uint64_t pre_exp = r->s1.expert_disk_bytes - r->s0.expert_disk_bytes, pre_loads = r->s1.expert_loads - r->s0.expert_loads,
             pre_req = r->s1.expert_requests - r->s0.expert_requests;
    if (json) {
        printf("{\"model\":\"%s\",\"tokens\":%d,\"prompt_tokens\":%d,\"s_per_token\":%.6f,\"io_floor_s_per_token\":%.6f,"
               "\"floor_ratio\":%.4f,\"disk_bytes_per_token\":%.0f,\"expert_bytes_per_token\":%.0f,"
               "\"spine_bytes_per_token\":%.0f,\"disk_gbps\":%.4f,\"read_gbps\":%.4f,\"cache_hit_rate\":%.4f,"
               "\"rss_peak_bytes\":%llu,\"mem_budget_bytes\":%llu,\"cache_slots\":%d,\"streamed_layers\":%d,"
               "\"prefill_s\":%.4f,\"prefill_expert_bytes\":%llu,\"prefill_expert_reads\":%llu,"
               "\"prefill_unique_experts\":%llu,\"breakdown\":{\"spine_read\":%.6f,\"expert_read\":%.6f,"
               "\"spine_compute\":%.6f,\"attention\":%.6f,\"expert_compute\":%.6f,\"other\":%.6f},\"generated\":[",
               dir, r->n, r->prompt, spt, floor, floor > 0 ? spt / floor : 0, bpt,
               (r->s2.expert_disk_bytes - r->s1.expert_disk_bytes) / n, (r->s2.spine_disk_bytes - r->s1.spine_disk_bytes) / n,
               r->disk_gbps, spt > 0 ? bpt / spt / 1e9 : 0, hit, (unsigned long long)r->rss_peak,
               (unsigned long long)r->s2.mem_budget, r->s2.cache_slots, r->s2.streamed_layers, r->prefill_s,
               (unsigned long long)pre_exp, (unsigned long long)pre_loads, (unsigned long long)pre_req,
               r->prof.spine_read / n, r->prof.expert_read / n, r->prof.spine_compute / n, r->prof.attention / n,
               r->prof.expert_compute / n, other > 0 ? other : 0);
        for (int i = 0; i < r->n; i++) printf("%s%d", i ? "," : "", r->tokens[i]);
        printf("]}\n");
        return;
    }
    printf("model %s\n", dir);
    printf("memory: budget %.2f GiB; spine %s (%d layers streamed, %.2f GiB resident, %.2f GiB stream buffers); "
           "expert cache %d slots (%.2f GiB)\n", r->s2.mem_budget / 1073741824.0,
           r->s2.streamed_layers ? "streamed" : "resident", r->s2.streamed_layers,
           r->s2.resident_spine_bytes / 1073741824.0, r->s2.stream_buffer_bytes / 1073741824.0, r->s2.cache_slots,
           r->s2.cache_bytes / 1073741824.0);
    printf("disk: %.2f GB/s O_DIRECT sequential (%.2f GB probed)\n", r->disk_gbps, r->probe_bytes / 1e9);
    printf("prefill: %d tokens in %.2f s; experts read %llu (%.2f GB) for %llu unique (layer, expert) needed\n",
           r->prompt, r->prefill_s, (unsigned long long)pre_loads, pre_exp / 1e9, (unsigned long long)pre_req);
    printf("decode: %d tokens, %.3f s/token; I/O floor %.3f s/token (ratio %.2f)\n", r->n, spt, floor,
           floor > 0 ? spt / floor : 0);
    printf("  disk %.2f GB/token (experts %.2f, spine %.2f), read %.2f GB/s, cache hit rate %.1f%%\n", bpt / 1e9,
           (r->s2.expert_disk_bytes - r->s1.expert_disk_bytes) / n / 1e9,
           (r->s2.spine_disk_bytes - r->s1.spine_disk_bytes) / n / 1e9, spt > 0 ? bpt / spt / 1e9 : 0, 100 * hit);
    printf("  per token: spine read wait %.3f s, expert read wait %.3f s, spine compute %.3f s, attention %.3f s, "
           "expert compute %.3f s, other %.3f s\n", r->prof.spine_read / n, r->prof.expert_read / n,
           r->prof.spine_compute / n, r->prof.attention / n, r->prof.expert_compute / n, other > 0 ? other : 0);
    printf("  peak RSS %.2f GiB\n", r->rss_peak / 1073741824.0);
}

int bench_model(int argc, char **argv) {
    enum { OPT_JSON = 0x2000, OPT_PROMPT, OPT_PROBE };
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"json", 0, 0, OPT_JSON}, {"prompt", 1, 0, OPT_PROMPT},
                                       {"threads", 1, 0, 't'}, {"probe-gb", 1, 0, OPT_PROBE}, {"help", 0, 0, 'h'},
                                       CLI_STORAGE_LONGOPTS, {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    int json = 0, c, n = 8, prompt = 8;
    double probe_gb = 2;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:h", lo, NULL)) != -1) {
        int s = cli_storage_opt(c, optarg, &opts);
        if (s < 0) return 2;
        if (s) continue;
        switch (c) {
        case 'm': opts.model_dir = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 't': opts.n_threads = atoi(optarg); break;
        case OPT_JSON: json = 1; break;
        case OPT_PROMPT: prompt = atoi(optarg); break;
        case OPT_PROBE: probe_gb = atof(optarg); break;
        default: usage(c == 'h' ? stdout : stderr); return c == 'h' ? 0 : 2;
        }
    }
    if (n < 1 || prompt < 1 || probe_gb <= 0) {
        usage(stderr);
        return 2;
    }
    if (!opts.model_dir) {   /* a benchmark names what it measures */
        fprintf(stderr, "deltafin bench: -m DIR is required (or `deltafin bench kernels`)\n");
        usage(stderr);
        return 2;
    }
    bench_result r = {.n = n, .prompt = prompt};
    char perr[8192] = "";
    r.disk_gbps = probe_disk(opts.model_dir, (uint64_t)(probe_gb * 1e9), &r.probe_bytes, perr, sizeof perr);
    if (r.disk_gbps <= 0) {
        fprintf(stderr, "deltafin bench: %s\n", perr);
        return 1;
    }
    df_error err = {0};
    df_engine *eng = NULL;
    df_session *s = NULL;
    int rc = df_engine_open(&eng, &opts, &err);
    if (!rc) rc = df_session_init(&s, eng, &err);
    int V = rc ? 0 : df_engine_info(eng)->vocab_size;
    float *logits = rc ? NULL : xmalloc((size_t)V * sizeof(float));
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(prompt > n ? prompt : n));
    r.tokens = xmalloc(sizeof *r.tokens * (size_t)n);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < prompt; i++) {   /* a fixed pseudo-random prompt, the same every run */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = V ? (int32_t)(x % (uint64_t)V) : 0;
    }
    if (!rc) {
        df_engine_stats(eng, &r.s0);
        double t0 = df_now();
        rc = df_session_eval(s, ids, prompt, logits, 0, &err);
        r.prefill_s = df_now() - t0;
        df_engine_stats(eng, &r.s1);
        df_engine_profile_reset(eng);
    }
    double t1 = df_now();
    for (int i = 0; !rc && i < n; i++) {
        r.tokens[i] = argmax(logits, V);
        rc = df_session_eval(s, &r.tokens[i], 1, logits, 0, &err);
    }
    r.decode_s = df_now() - t1;
    if (!rc) {
        df_engine_stats(eng, &r.s2);
        df_engine_profile(eng, &r.prof);
        r.rss_peak = budget_rss_peak();
        print_result(&r, json, opts.model_dir);
    } else {
        fprintf(stderr, "deltafin bench: %s\n", err.msg);
    }
    free(ids);
    free(r.tokens);
    free(logits);
    df_session_free(s);
    df_engine_free(eng);
    return rc ? 1 : 0;
}
