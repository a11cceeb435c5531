/* test_remote.c — range fetching against the test server (tests/remote/server.py on 127.0.0.1): exact
 * bytes, every fault mode with its expected outcome, the partial-install source (holes fetched once into
 * the disk cache, then served from it), disk-full cache writes leaving nothing behind, and a soak of 2,000
 * range requests over reused connections (leaks are caught by the ASan build this runs under). */
#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "install/dcache.h"
#include "install/remote.h"
#include "remote_server.h"
#include "test.h"

#define FIXTURE "tests/fixtures/kl-mxfp4"

static uint8_t *fixture_bytes(size_t *n) {
    df_error e;
    return (uint8_t *)df_read_file(FIXTURE "/model.safetensors", n, &e);
}

/* One fetch of [off, off+len) under an injected fault; returns rc and leaves the message in err. */
static int fetch_with_fault(remote *r, const server *s, const char *fault, uint64_t off, uint64_t len,
                            const uint8_t *want, int *same, int *attempts, df_error *err) {
    char buf[4096], path[256];
    ctl(s, "/_reset", buf);
    if (fault) {
        snprintf(path, sizeof path, "/_fault?%s", fault);
        ctl(s, path, buf);
    }
    uint8_t *dst = xcalloc(1, len);
    remote_req q = {.file = "model.safetensors", .off = off, .len = len, .what = "expert 5 of layer 1", .dst = dst};
    memset(err, 0, sizeof *err);
    int rc = remote_fetch(r, &q, 1, err);
    *same = !memcmp(dst, want + off, len);
    *attempts = q.attempts;
    free(dst);
    return rc;
}

static void test_faults(const server *s, const uint8_t *file) {
    remote_opts o = {.jobs = 4, .stall_s = 1, .attempts = 4, .backoff_s = 0.02, .retry_after_max_s = 5};
    remote *r;
    df_error err;
    CHECK(remote_open(&r, s->base, &o, &err) == DF_OK, "remote_open");
    int same, att;
    const uint64_t off = 447776, len = 6528 * 4;
    int rc = fetch_with_fault(r, s, NULL, off, len, file, &same, &att, &err);
    CHECK(rc == DF_OK && same && att == 1, "plain range: exact bytes in one request");
    rc = fetch_with_fault(r, s, "mode=reset&count=2", off, len, file, &same, &att, &err);
    CHECK(rc == DF_OK && same && att == 3, "reset mid-body twice: retried, exact bytes (attempts %d)", att);
    rc = fetch_with_fault(r, s, "mode=500&count=2", off, len, file, &same, &att, &err);
    CHECK(rc == DF_OK && same && att == 3, "500 twice: retried with backoff");
    double t0 = df_now();
    rc = fetch_with_fault(r, s, "mode=503&count=1&arg=1", off, len, file, &same, &att, &err);
    double dt = df_now() - t0;
    CHECK(rc == DF_OK && same && dt >= 0.9 && dt < 4, "503 with Retry-After: 1 honoured (%.2f s)", dt);
    rc = fetch_with_fault(r, s, "mode=503&count=100", off, len, file, &same, &att, &err);
    CHECK(rc == DF_EIO && att == 4 && strstr(err.msg, "HTTP 503") && strstr(err.msg, "expert 5 of layer 1") &&
              strstr(err.msg, s->base) && strstr(err.msg, "4 attempts"),
          "503 forever: gives up naming expert and URL: %s", err.msg);
    rc = fetch_with_fault(r, s, "mode=short&count=1", off, len, file, &same, &att, &err);
    CHECK(rc == DF_OK && same && att == 2, "short body: rest asked again");
    t0 = df_now();
    rc = fetch_with_fault(r, s, "mode=stall&count=1&arg=4", off, len, file, &same, &att, &err);
    dt = df_now() - t0;
    CHECK(rc == DF_OK && same && att == 2 && dt < 3.5, "stalled server: low-speed limit, then retried (%.2f s, %d "
          "attempts, rc %d: %s)", dt, att, rc, err.msg);
    rc = fetch_with_fault(r, s, "mode=200&count=1", off, len, file, &same, &att, &err);
    CHECK(rc == DF_EIO && att == 1 && strstr(err.msg, "instead of 206") && strstr(err.msg, "expert 5 of layer 1"),
          "200 instead of 206: clear error, no retry: %s", err.msg);
    rc = fetch_with_fault(r, s, "mode=badrange&count=1", off, len, file, &same, &att, &err);
    CHECK(rc == DF_EIO && att == 1 && strstr(err.msg, "wrong Content-Range"), "wrong Content-Range: %s", err.msg);
    rc = fetch_with_fault(r, s, "mode=404&count=1", off, len, file, &same, &att, &err);
    CHECK(rc == DF_EIO && att == 1 && strstr(err.msg, "404"), "404: %s", err.msg);
    remote_free(r);

    CHECK(remote_open(&r, "http://nonexistent.invalid/org/m/resolve/main", &o, &err) == DF_OK, "remote_open (DNS)");
    uint8_t b[16];
    remote_req q = {.file = "model.safetensors", .off = 0, .len = 16, .what = "expert 0 of layer 1", .dst = b};
    rc = remote_fetch(r, &q, 1, &err);
    CHECK(rc == DF_EIO && q.attempts == 1 && strstr(err.msg, "resolve") && strstr(err.msg, "nonexistent.invalid"),
          "DNS failure: %s", err.msg);
    remote_free(r);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += de->d_name[0] != '.' || !strncmp(de->d_name, ".tmp-", 5);
    if (d) closedir(d);
    return n;
}

/* A partial install made by hand: the shard with two expert spans zeroed and listed as holes. */
static void test_install(const server *s, const uint8_t *file, size_t n, const char *tmp) {
    char dir[512], shard[600], cdir[700];
    snprintf(dir, sizeof dir, "%s/inst", tmp);
    snprintf(shard, sizeof shard, "%s/model.safetensors", dir);
    snprintf(cdir, sizeof cdir, "%s/.deltafin/cache/model.safetensors", dir);
    df_error err;
    df_mkdir_p(dir, &err);
    dc_span holes[2] = {{447776, 6528}, {454304, 6528}};
    uint8_t *copy = xmalloc(n);
    memcpy(copy, file, n);
    for (int i = 0; i < 2; i++) memset(copy + holes[i].off, 0, holes[i].len);
    CHECK(dc_write_atomic(shard, 0, copy, n, &err) == DF_OK, "write sparse shard");
    free(copy);
    dc_shard sh = {.name = xstrdup("model.safetensors"), .size = n, .state = DC_SPINE, .n_holes = 2, .holes = xmalloc(sizeof holes)};
    memcpy(sh.holes, holes, sizeof holes);
    dc_manifest m = {xstrdup("test"), 1, &sh};
    CHECK(dc_manifest_save(dir, &m, &err) == DF_OK, "manifest saved");
    free(sh.name);
    free(sh.holes);
    free(m.source);

    const char *paths[1] = {shard};
    io_source *src;
    CHECK(io_install_open(&src, dir, 1, paths, 1, NULL, &err) == DF_OK, "install source without remote");
    uint8_t *dst = xaligned_alloc(4096, 64 << 10);
    int rc = src->read(src, 0, holes[0].off, holes[0].len, dst, "expert 0 of layer 1", &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "expert 0 of layer 1") && strstr(err.msg, "--remote"),
          "missing expert without --remote: clear error, no zeros: %s", err.msg);
    rc = src->read(src, 0, 0, 4096, dst, "header", &err);
    CHECK(rc == DF_OK && !memcmp(dst, file, 4096), "present bytes read locally");
    io_source_free(src);

    char buf[4096];
    ctl(s, "/_reset", buf);
    CHECK(io_install_open(&src, dir, 1, paths, 1, s->base, &err) == DF_OK, "install source with remote");
    uint64_t off = holes[1].off;
    rc = src->read(src, 0, off, holes[1].len, dst, "expert 1 of layer 1", &err);
    CHECK(rc == DF_OK && !memcmp(dst + off % 4096, file + off, holes[1].len), "missing expert fetched: exact bytes");
    CHECK(stat_of(s, "range_requests") == 1, "one range request for the span");
    CHECK(count_files(cdir) == 1, "one cache entry, no temp files");
    memset(dst, 0, 64 << 10);
    rc = src->read(src, 0, off, holes[1].len, dst, "expert 1 of layer 1", &err);
    CHECK(rc == DF_OK && !memcmp(dst + off % 4096, file + off, holes[1].len) && stat_of(s, "range_requests") == 1,
          "second read served from the disk cache");
    CHECK(atomic_load(&src->net_bytes) == holes[1].len, "network bytes counted once (%llu)",
          (unsigned long long)atomic_load(&src->net_bytes));
    /* a part of a hole (per-tensor reads): the whole span is fetched once, the part returned */
    off = holes[0].off + 1000;
    rc = src->read(src, 0, off, 2000, dst, "expert 0 of layer 1", &err);
    CHECK(rc == DF_OK && !memcmp(dst + off % 4096, file + off, 2000) && stat_of(s, "range_requests") == 2,
          "part of a span: whole span fetched and cached");
    rc = src->read(src, 0, holes[0].off - 10, 100, dst, "x", &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "straddles"), "read straddling a hole refused");
    io_source_free(src);

    char info[2048] = "";
    install_describe(dir, info, sizeof info);
    CHECK(strstr(info, "expert spans cached: 2 of 2") && strstr(info, "(100.0%)"), "install_describe: %s", info);

    /* disk full: a min-free that cannot be met, then a real write failure (file size limit) */
    dcache *c;
    dcache_open(&c, dir, UINT64_MAX / 4, &err);
    dc_span e = {4096, 8192};
    rc = dcache_put(c, "other.safetensors", e, file, "expert 9 of layer 2", &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "disk full") && strstr(err.msg, "expert 9 of layer 2") &&
              !dcache_has(c, "other.safetensors", e), "cache write refused when the disk would be full: %s", err.msg);
    dcache_free(c);
    dcache_open(&c, dir, 0, &err);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    rc = dcache_put(c, "model.safetensors", e, file, "expert 9 of layer 2", &err);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(rc == DF_EIO && strstr(err.msg, "disk full") && !dcache_has(c, "model.safetensors", e) &&
              count_files(cdir) == 2, "write failing mid-entry: error, no entry, no temp file: %s", err.msg);
    dcache_free(c);
    free(dst);
}

/* 2,000 range requests in batches of 16 over 8 connections, every byte checked. */
static void test_soak(const server *s, const uint8_t *file, size_t n) {
    remote_opts o = {.jobs = 8};
    remote *r;
    df_error err;
    char buf[4096];
    ctl(s, "/_reset", buf);
    CHECK(remote_open(&r, s->base, &o, &err) == DF_OK, "soak: remote_open");
    uint64_t seed = 12345;
    int bad = 0, failed = 0;
    enum { B = 16, LEN = 6528 };
    uint8_t *dst = xmalloc((size_t)B * LEN);
    for (int round = 0; round < 2000 / B; round++) {
        remote_req q[B];
        for (int i = 0; i < B; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t off = (seed >> 20) % (n - LEN);
            q[i] = (remote_req){.file = "model.safetensors", .off = off, .len = LEN, .what = "soak", .dst = dst + i * LEN};
        }
        failed += remote_fetch(r, q, B, &err) != DF_OK;
        for (int i = 0; i < B; i++) bad += memcmp(dst + i * LEN, file + q[i].off, LEN) != 0;
    }
    remote_stats st;
    remote_get_stats(r, &st);
    long conns = stat_of(s, "connections"), reqs = stat_of(s, "range_requests");
    CHECK(!failed && !bad, "soak: 2000 ranges, all exact (%d failed, %d wrong)", failed, bad);
    CHECK(reqs == 2000 && st.requests == 2000, "soak: one request per range (%ld at the server)", reqs);
    CHECK(conns <= 8 && st.connects <= 8, "soak: connections reused (%ld opened for 2000 requests)", conns);
    free(dst);
    remote_free(r);
}

int main(void) {
    char tmp[] = "/tmp/df_remote_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    server s = {0};
    int up = server_start(&s, FIXTURE, tmp);
    CHECK(up, "test server started on 127.0.0.1");
    if (!up) return 1;
    size_t n;
    uint8_t *file = fixture_bytes(&n);
    CHECK(file != NULL, "fixture read");
    df_error err;
    char *b = remote_resolve_base("org/name@v1", &err);
    CHECK(b && !strncmp(b, "http", 4) && strstr(b, "/org/name/resolve/v1"), "hub id to URL: %s", b);
    free(b);
    double t0 = df_now();
    test_faults(&s, file);
    double t1 = df_now();
    test_install(&s, file, n, tmp);
    double t2 = df_now();
    test_soak(&s, file, n);
    printf("# faults %.1f s, install %.1f s, soak %.1f s\n", t1 - t0, t2 - t1, df_now() - t2);
    free(file);
    if (server_finish(&s, tmp)) return 1;
    TEST_EXIT();
}
