/* bench_fetch.c — `deltafin bench fetch --from URL`: how fast routed experts stream from a repository.
 * Fetches every expert (or the first --experts N) layer by layer, each layer's experts in parallel as the
 * runtime does, into memory, optionally also through the disk cache; reports experts/s, MB/s, requests per
 * expert and connections opened, then downloads the same byte ranges with the curl program (same
 * parallelism, keep-alive) and prints the ratio. Against tests/remote/server.py the server's own counters
 * (/_stats) are printed too, as proof of connection reuse. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/util.h"
#include "install/dcache.h"
#include "install/install_job.h"

typedef struct bench_fetch_opts {
    const char *from, *cache_dir;
    int jobs, max_experts, json;
} bench_fetch_opts;

static int bench_fetch_usage(FILE *f) {
    fprintf(f, "usage: deltafin bench fetch --from URL [--jobs N] [--experts N] [--cache DIR] [--json]\n"
               "  --from URL     repository (org/name[@rev] or http(s) URL), e.g. tests/remote/server.py on loopback\n"
               "  --jobs N       parallel connections (default 8)\n"
               "  --experts N    only the first N experts (default all)\n"
               "  --cache DIR    also time a pass that writes every expert into a disk cache under DIR\n");
    return f == stdout ? 0 : 2;
}

/* Fetches spans [0, n) layer by layer; with c, publishes each into the cache. Returns seconds or -1. */
static double bench_fetch_pass(remote *r, const install_span *v, int n, dcache *c, df_error *err) {
    uint64_t maxlen = 0;
    int maxl = 0;
    for (int i = 0, run = 0; i < n; i++) {
        maxlen = DF_MAX(maxlen, v[i].len);
        run = i && v[i].layer == v[i - 1].layer && v[i].file == v[i - 1].file ? run + 1 : 1;
        maxl = DF_MAX(maxl, run);
    }
    uint8_t *buf = xmalloc((size_t)maxlen * (size_t)maxl);
    memset(buf, 0, (size_t)maxlen * (size_t)maxl);   /* the runtime's slots are long faulted in: so are these */
    remote_req *q = xcalloc((size_t)maxl, sizeof *q);
    double t0 = df_now();
    int rc = DF_OK;
    for (int i = 0; i < n && !rc;) {
        int k = 0;
        for (; i + k < n && (k == 0 || (v[i + k].layer == v[i].layer && v[i + k].file == v[i].file)); k++)
            q[k] = (remote_req){.file = v[i + k].file, .off = v[i + k].off, .len = v[i + k].len, .what = "expert",
                                .dst = buf + (size_t)k * maxlen};
        rc = remote_fetch(r, q, k, err);
        for (int j = 0; c && !rc && j < k; j++)
            rc = dcache_put(c, v[i + j].file, (dc_span){v[i + j].off, v[i + j].len}, q[j].dst, "expert", err);
        i += k;
    }
    double dt = df_now() - t0;
    free(q);
    free(buf);
    return rc ? -1 : dt;
}

/* The same ranges with the curl program: a config of url/range/output entries, --parallel. */
static double bench_fetch_curl(const char *base, const install_span *v, int n, int jobs) {
    char cfg[] = "/tmp/deltafin-bench-curl-XXXXXX";
    int fd = mkstemp(cfg);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "url = \"%s/%s\"\nrange = %llu-%llu\noutput = /dev/null\n", base, v[i].file,
                (unsigned long long)v[i].off, (unsigned long long)(v[i].off + v[i].len - 1));
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "curl -s --no-progress-meter -f --http1.1 --parallel --parallel-max %d -K %s 2>/dev/null", jobs, cfg);
    double t0 = df_now();
    int rc = system(cmd);
    double dt = df_now() - t0;
    unlink(cfg);
    return rc ? -1 : dt;
}

/* The test server's counters, when the URL's server is ours. */
static void bench_fetch_server_stats(const char *base, char *out, size_t cap) {
    out[0] = 0;
    const char *p = strstr(base, "://");
    if (!p) return;
    const char *slash = strchr(p + 3, '/');
    size_t hl = slash ? (size_t)(slash - base) : strlen(base);
    char *host = xmalloc(hl + 1);
    memcpy(host, base, hl);
    host[hl] = 0;
    remote *r;
    df_error err;
    remote_opts o = {.jobs = 1, .attempts = 1};
    if (!remote_open(&r, host, &o, &err)) {
        char *data;
        size_t len;
        int missing;
        if (!remote_get_file(r, "_stats", &data, &len, &missing, &err) && !missing) {
            char *paths = strstr(data, ", \"paths\"");
            if (paths) strcpy(paths, "}");
            snprintf(out, cap, "%s", data);
            free(data);
        }
        remote_free(r);
    }
    free(host);
}

int bench_fetch(int argc, char **argv) {
    static const struct option lo[] = {{"from", 1, 0, 'f'}, {"jobs", 1, 0, 'j'}, {"experts", 1, 0, 'e'},
                                       {"cache", 1, 0, 'c'}, {"json", 0, 0, 'J'}, {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    bench_fetch_opts o = {.jobs = 8};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "j:h", lo, NULL)) != -1) {
        switch (c) {
        case 'f': o.from = optarg; break;
        case 'j': o.jobs = atoi(optarg); break;
        case 'e': o.max_experts = atoi(optarg); break;
        case 'c': o.cache_dir = optarg; break;
        case 'J': o.json = 1; break;
        case 'h': return bench_fetch_usage(stdout);
        default: return bench_fetch_usage(stderr);
        }
    }
    if (!o.from || o.jobs < 1 || o.jobs > 64) return bench_fetch_usage(stderr);
    df_error err = {0};
    char *base = remote_resolve_base(o.from, &err);
    remote *r = NULL;
    remote_opts ro = {.jobs = o.jobs};
    install_span_list L = {0};
    int rc = base ? remote_open(&r, base, &ro, &err) : DF_EINVAL;
    if (!rc) rc = install_list_experts(r, &L, &err);
    if (!rc && !L.n) rc = (df_error_set(&err, DF_EINVAL, "%s: no routed experts in this repository", base), DF_EINVAL);
    if (rc) {
        fprintf(stderr, "deltafin bench fetch: %s\n", err.msg);
        install_span_list_free(&L);
        remote_free(r);
        free(base);
        return 1;
    }
    int n = o.max_experts > 0 ? DF_MIN(o.max_experts, L.n) : L.n;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += L.v[i].len;
    char before[512], after[512];
    bench_fetch_server_stats(base, before, sizeof before);
    remote_stats s0, s1;
    remote_get_stats(r, &s0);
    double t = bench_fetch_pass(r, L.v, n, NULL, &err);
    remote_get_stats(r, &s1);
    bench_fetch_server_stats(base, after, sizeof after);
    /* best of two for both, alternating, so neither side alone profits from the server's warm page cache */
    double tcurl = t >= 0 ? bench_fetch_curl(base, L.v, n, o.jobs) : -1;
    double t2 = t >= 0 ? bench_fetch_pass(r, L.v, n, NULL, &err) : -1;
    double tcurl2 = t2 >= 0 ? bench_fetch_curl(base, L.v, n, o.jobs) : -1;
    if (t2 >= 0 && t2 < t) t = t2;
    if (tcurl2 > 0 && (tcurl < 0 || tcurl2 < tcurl)) tcurl = tcurl2;
    double tc = -1;
    dcache *dc = NULL;
    if (t >= 0 && o.cache_dir) {
        dcache_open(&dc, o.cache_dir, 0, &err);
        tc = bench_fetch_pass(r, L.v, n, dc, &err);
        for (int i = 0; i < L.n_files; i++) dcache_drop_shard(dc, L.files[i]);
        dcache_free(dc);
    }
    if (t < 0) {
        fprintf(stderr, "deltafin bench fetch: %s\n", err.msg);
        rc = 1;
    } else {
        uint64_t reqs = s1.requests - s0.requests, conns = s1.connects - s0.connects;
        double mbs = (double)bytes / t / 1e6, curl_mbs = tcurl > 0 ? (double)bytes / tcurl / 1e6 : 0;
        if (o.json) {
            printf("{\"bench\":\"fetch\",\"experts\":%d,\"bytes\":%llu,\"jobs\":%d,\"seconds\":%.4f,\"experts_per_s\":%.2f,"
                   "\"mb_per_s\":%.2f,\"requests_per_expert\":%.3f,\"connections\":%llu,\"retries\":%llu,"
                   "\"with_cache_mb_per_s\":%.2f,\"curl_mb_per_s\":%.2f,\"ratio_to_curl\":%.3f,\"server_before\":%s,"
                   "\"server_after\":%s}\n", n, (unsigned long long)bytes, o.jobs, t, n / t, mbs, (double)reqs / n,
                   (unsigned long long)conns, (unsigned long long)(s1.retries - s0.retries),
                   tc > 0 ? (double)bytes / tc / 1e6 : 0, curl_mbs, curl_mbs > 0 ? mbs / curl_mbs : 0,
                   before[0] ? before : "null", after[0] ? after : "null");
        } else {
            printf("bench fetch: %s\n  %d experts, %.1f MB, %d connections allowed\n", base, n, (double)bytes / 1e6,
                   o.jobs);
            printf("  deltafin: %.3f s, %.1f experts/s, %.1f MB/s, %.3f requests per expert, %llu connections "
                   "opened, %llu retries\n", t, n / t, mbs, (double)reqs / n, (unsigned long long)conns,
                   (unsigned long long)(s1.retries - s0.retries));
            if (tc > 0) printf("  deltafin + disk cache (temp, fsync, rename): %.3f s, %.1f MB/s\n", tc, (double)bytes / tc / 1e6);
            if (tcurl > 0) printf("  curl --parallel-max %d, same ranges: %.3f s, %.1f MB/s; ratio deltafin/curl %.3f\n",
                                  o.jobs, tcurl, curl_mbs, mbs / curl_mbs);
            else printf("  curl: not run (no curl program?)\n");
            if (before[0]) printf("  server counters before: %s\n  server counters after:  %s\n", before, after);
        }
    }
    install_span_list_free(&L);
    remote_free(r);
    free(base);
    return rc;
}
