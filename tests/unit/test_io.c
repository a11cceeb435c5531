/* test_io.c — the local read source and the look-ahead path: O_DIRECT reads through the pread
 * loop and io_uring place every byte where the placement rule says (unaligned ranges, ranges spanning many
 * 1 MiB requests and more than one ring's worth of them), a read past the end is an error naming the file;
 * the DELTAFIN_TEST_NO_DIRECT hook reaches both buffered fallbacks (O_DIRECT refused at open and at read) and
 * the data stays right; the cache's hint loads only idle slots, leaves the prefetch list alone and scores
 * recall; preloading a mapped spine reads the ranges it is given and not what lies between; look-ahead on the
 * bundled trained model keeps logits identical and its guess before attention names
 * over 80 % of the experts each layer asks for (the earlier guess, made a layer ahead, named 77.6 %). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"
#include "residency/cache.h"
#include "io/io.h"
#include "residency/spine_warm.h"

#define FILE_BYTES ((70u << 20) + 1234u)

static uint8_t pattern_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static int write_pattern(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t *buf = xmalloc(1 << 20);
    for (uint64_t at = 0; at < FILE_BYTES;) {
        size_t n = (size_t)DF_MIN((uint64_t)(1 << 20), FILE_BYTES - at);
        for (size_t i = 0; i < n; i++) buf[i] = pattern_at(at + i);
        if (fwrite(buf, 1, n, f) != n) break;
        at += n;
    }
    free(buf);
    return fclose(f);
}

/* Reads [off, off+len) and checks the bytes landed at dst + off % IO_ALIGN. */
static int read_ok(io_source *src, uint64_t off, uint64_t len, df_error *err) {
    size_t cap = (size_t)io_span_bytes(off, len);
    uint8_t *dst = io_mem_alloc(cap);
    int rc = src->read(src, 0, off, len, dst, "test range", err);
    const uint8_t *p = dst + off % IO_ALIGN;
    for (uint64_t i = 0; !rc && i < len; i++)
        if (p[i] != pattern_at(off + i)) {
            df_error_set(err, DF_EIO, "byte %llu differs", (unsigned long long)(off + i));
            rc = -1;
        }
    io_mem_free(dst, cap);
    return rc;
}

static void check_source(const char *path, int kind, const char *hook, const char *label) {
    io_source *src = NULL;
    df_error err = {0};
    if (hook) setenv("DELTAFIN_TEST_NO_DIRECT", hook, 1);
    io_local_opts o = {1, kind};
    int rc = io_local_open_ex(&src, 1, &path, &o, &err);
    unsetenv("DELTAFIN_TEST_NO_DIRECT");
    CHECK(!rc, "%s: open (%s)", label, rc ? err.msg : "ok");
    if (rc) return;
    static const uint64_t ranges[][2] = {{0, 4096},      {123, 777},           {5000, (5u << 20) + 17},
                                         {(1u << 20) - 3, 10}, {4096, 67u << 20}, {FILE_BYTES - 999, 999}};
    int bad = 0;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0] && !bad; i++)
        if (read_ok(src, ranges[i][0], ranges[i][1], &err)) {
            bad = 1;
            CHECK(0, "%s: range [%llu, +%llu): %s", label, (unsigned long long)ranges[i][0],
                  (unsigned long long)ranges[i][1], err.msg);
        }
    CHECK(!bad, "%s: every range read byte-exact, placed by the rule (%llu bytes transferred)", label,
          (unsigned long long)atomic_load(&src->bytes));
    uint8_t *dst = io_mem_alloc(1 << 20);
    rc = src->read(src, 0, FILE_BYTES - 100, 5000, dst, "expert 7 of layer 3", &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "expert 7 of layer 3") && strstr(err.msg, "end of file") &&
              strstr(err.msg, path), "%s: a read past the end names the file and the data: %s", label, err.msg);
    io_mem_free(dst, 1 << 20);
    if (hook)
        CHECK(atomic_load(&src->direct_fallbacks) == 1, "%s: O_DIRECT refusal counted once (%d)", label,
              (int)atomic_load(&src->direct_fallbacks));
    else
        CHECK(atomic_load(&src->direct_fallbacks) == 0, "%s: O_DIRECT used", label);
    if (kind == IO_KIND_PREAD) CHECK(io_source_kind(src) == IO_KIND_PREAD, "%s: pread kind kept", label);
    io_source_free(src);
}

/* ---- the cache's hint ------------------------------------------------------------------------------ */

static int fake_load(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err) {
    (void)ctx;
    (void)err;
    slot[0] = (uint8_t)(layer * 16 + e);
    memset(view, 0, sizeof *view);
    view->w1.data = slot;
    return DF_OK;
}

/* Keeps the cache busy (asks for expert 0, which it holds) while waiting up to 10 s for the background thread
 * to fault in at least want slots, then a little longer to see whether it stops there; returns how many it
 * faulted in. */
static int populated_busy(ecache *c, int want) {
    ecache_stats s;
    df_expert x;
    df_error err = {0};
    struct timespec pause = {0, 2000000};
    for (int i = 0, reached = -1; i < 5000 && (reached < 0 || i < reached + 25); i++) {   /* 2 ms each */
        if (ecache_acquire(c, 0, 0, &x, &err) == DF_OK) ecache_release(c, 0, 0);
        ecache_get_stats(c, &s);
        if (reached < 0 && s.populated_slots >= want) reached = i;
        nanosleep(&pause, NULL);
    }
    ecache_get_stats(c, &s);
    return s.populated_slots;
}

/* While the model asks for experts, the bank's pages are faulted in a bounded distance ahead of the slots used
 * so far; once it has been idle a while, all of them. */
static void test_populate(void) {
    void *probe = mmap(NULL, IO_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int supported = probe != MAP_FAILED && !madvise(probe, IO_ALIGN, MADV_POPULATE_WRITE);
    if (probe != MAP_FAILED) munmap(probe, IO_ALIGN);
    if (!supported) {
        SKIP("no MADV_POPULATE_WRITE in this kernel (before 5.14)", "cache: pages faulted in ahead of use");
        return;
    }
    io_pool *pool = io_pool_new(2);
    int ne[1] = {64};
    ecache *c = ecache_new(1, ne, 64, IO_ALIGN, 8 * IO_ALIGN, pool, fake_load, NULL);
    int first = populated_busy(c, 9), ok = 1;   /* expert 0 in slot 0: 1 + 8 slots */
    df_expert x;
    df_error err = {0};
    for (int e = 1; e < 20; e++) {   /* empty slots are taken lowest first: slots 1..19 */
        ok &= ecache_acquire(c, 0, e, &x, &err) == DF_OK;
        ecache_release(c, 0, e);
    }
    int twenty = populated_busy(c, 28);
    CHECK(ok && first == 9 && twenty == 28, "cache: while busy, pages faulted in 8 slots ahead of use (%d of 64 "
          "slots with 1 used, %d with 20)", first, twenty);
    ecache_populate_wait(c);
    ecache_stats s;
    ecache_get_stats(c, &s);
    CHECK(s.populated_slots == 64, "cache: asked to, it faults the whole bank in (%d of 64)", s.populated_slots);
    ecache_free(c);
    c = ecache_new(1, ne, 64, IO_ALIGN, 8 * IO_ALIGN, pool, fake_load, NULL);
    ok = ecache_acquire(c, 0, 0, &x, &err) == DF_OK;
    ecache_release(c, 0, 0);
    struct timespec pause = {0, 2000000};
    for (int i = 0; i < 5000 && (ecache_get_stats(c, &s), s.populated_slots < 64); i++) nanosleep(&pause, NULL);
    CHECK(ok && s.populated_slots == 64, "cache: once idle, the whole bank faulted in (%d of 64)", s.populated_slots);
    ecache_free(c);
    io_pool_free(pool);
}

static void test_hint(void) {
    io_pool *pool = io_pool_new(2);
    int ne[3] = {8, 8, 8};
    ecache *c = ecache_new(3, ne, 4, IO_ALIGN, 0, pool, fake_load, NULL);
    int cur[2] = {0, 1}, guess[3] = {2, 3, 4}, rank[3] = {0, 1, 1}, real[2] = {2, 5};
    ecache_prefetch(c, 0, cur, 2);
    ecache_hint(c, 1, guess, rank, 3, 2);
    df_expert x;
    df_error err = {0};
    int ok = 1;
    for (int i = 0; i < 2; i++) {   /* layer 0's prefetched experts were not displaced by the guess */
        ok &= ecache_acquire(c, 0, cur[i], &x, &err) == DF_OK && ((uint8_t *)x.w1.data)[0] == cur[i];
        ecache_release(c, 0, cur[i]);
    }
    ecache_stats s;
    ecache_get_stats(c, &s);
    CHECK(ok && s.lookahead_loads == 2 && s.misses == 2 && s.hits == 0,
          "hint: reads only into the 2 idle slots, current prefetch intact (hint loads %llu, misses %llu, hits %llu)",
          (unsigned long long)s.lookahead_loads, (unsigned long long)s.misses, (unsigned long long)s.hits);
    ecache_prefetch(c, 1, real, 2);
    for (int i = 0; i < 2; i++) {
        ok &= ecache_acquire(c, 1, real[i], &x, &err) == DF_OK && ((uint8_t *)x.w1.data)[0] == 16 + real[i];
        ecache_release(c, 1, real[i]);
    }
    ecache_get_stats(c, &s);
    CHECK(ok && s.lookahead_requests == 2 && s.lookahead_recalled == 1 && s.hits == 1 && s.misses == 3,
          "hint: recall scored (%llu of %llu), the guessed expert served without a second read",
          (unsigned long long)s.lookahead_recalled, (unsigned long long)s.lookahead_requests);
    ecache_hint_stats h;
    ecache_hint_layer(c, 1, &h);
    CHECK(h.scored == 1 && h.guessed_rank[0] == 1 && h.recalled_rank[0] == 1 && h.guessed_rank[1] == 2 &&
          h.recalled_rank[1] == 0 && h.guessed_rank[2] == 0, "hint: precision scored per rank (rank 0: %llu of %llu, "
          "rank 1: %llu of %llu)", (unsigned long long)h.recalled_rank[0], (unsigned long long)h.guessed_rank[0],
          (unsigned long long)h.recalled_rank[1], (unsigned long long)h.guessed_rank[1]);
    ecache_free(c);
    io_pool_free(pool);
}

/* A hint read to one rank reads only the experts the router was surest of, however many slots are idle. */
static void test_hint_ranks(void) {
    io_pool *pool = io_pool_new(2);
    int ne[2] = {8, 8};
    ecache *c = ecache_new(2, ne, 6, IO_ALIGN, 0, pool, fake_load, NULL);
    int guess[4] = {6, 1, 3, 0}, rank[4] = {0, 0, 1, 2};
    ecache_hint(c, 1, guess, rank, 4, 1);
    ecache_hint_stats h;
    ecache_hint_layer(c, 1, &h);
    int real[2] = {1, 6}, ok = 1;
    ecache_prefetch(c, 1, real, 2);
    for (int i = 0; i < 2; i++) {
        df_expert x;
        df_error err = {0};
        ok &= ecache_acquire(c, 1, real[i], &x, &err) == DF_OK && ((uint8_t *)x.w1.data)[0] == 16 + real[i];
        ecache_release(c, 1, real[i]);
    }
    ecache_stats s;
    ecache_get_stats(c, &s);
    CHECK(ok && h.loads == 2 && h.read_hints == 1 && s.hits == 2 && s.lookahead_hits == 2 && s.misses == 0,
          "hint: read to rank 1, only the two rank-0 experts are read, and serve the layer (loads %llu, hits %llu, "
          "%llu of them owed to the guess)", (unsigned long long)h.loads, (unsigned long long)s.hits,
          (unsigned long long)s.lookahead_hits);
    ecache_free(c);
    io_pool_free(pool);
}

/* ---- look-ahead on the trained model ------------------------------------------------------------------ */

static float *run_default(int lookahead, int slots, int n, int *V, df_stats *st, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, "models/default", NULL);
    o.lookahead = lookahead;
    o.cache_slots = slots;
    df_engine *eng = NULL;
    df_session *s = NULL;
    int rc = df_engine_open(&eng, &o, err);
    if (!rc) rc = df_session_init(&s, eng, err);
    float *out = NULL;
    if (!rc) {
        *V = df_engine_info(eng)->vocab_size;
        out = xmalloc((size_t)n * *V * sizeof(float));
        int32_t tok = 1;
        for (int i = 0; !rc && i < n; i++) {
            rc = df_session_eval(s, &tok, 1, out + (size_t)i * *V, 0, err);
            int b = 0;   /* greedy, so the text (and its routing) is the model's own */
            for (int v = 1; v < *V; v++)
                if (out[(size_t)i * *V + v] > out[(size_t)i * *V + b]) b = v;
            tok = b;
        }
        df_engine_stats(eng, st);
    }
    df_session_free(s);
    df_engine_free(eng);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

static void sleep_job(void *arg) {
    (void)arg;
    nanosleep(&(struct timespec){0, 60 * 1000000L}, NULL);
}

/* The pool's busy clocks: a guess keeps the disk busy but not busy with sure reads, the share look-ahead
 * decides from. */
static void test_pool_busy(void) {
    io_pool *pool = io_pool_new(2);
    io_pool_submit(pool, IO_PRIO_GUESS, sleep_job, NULL);
    nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    double all = io_pool_busy_seconds(pool, 0), sure = io_pool_busy_seconds(pool, 1);
    io_pool_submit(pool, IO_PRIO_HIGH, sleep_job, NULL);
    nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    double sure2 = io_pool_busy_seconds(pool, 1);
    CHECK(all >= 0.05 && sure == 0 && sure2 >= 0.05, "io pool: a guess counts as busy (%.3f s) but not as sure reads "
          "(%.3f s), a high-priority read does (%.3f s)", all, sure, sure2);
    io_pool_free(pool);
}

static void test_lookahead(void) {
    enum { N = 24 };
    df_stats s0, s1;
    df_error err = {0};
    int V0 = 0, V1 = 0;
    float *off = run_default(DF_LOOKAHEAD_OFF, 12, N, &V0, &s0, &err);
    float *on = off ? run_default(DF_LOOKAHEAD_ON, 12, N, &V1, &s1, &err) : NULL;
    CHECK(off && on && V0 == V1 && !memcmp(off, on, (size_t)N * V0 * sizeof(float)),
          "look-ahead: logits bit-identical with it on and off (models/default, 12 slots): %s",
          on ? "compared" : err.msg);
    double recall = on && s1.lookahead_requests ? (double)s1.lookahead_recalled / (double)s1.lookahead_requests : 0;
    CHECK(on && recall > 0.8 && s1.lookahead_loads > 0,
          "look-ahead: recall %.1f%% of the experts asked for (%llu guessed reads)", 100 * recall,
          on ? (unsigned long long)s1.lookahead_loads : 0ull);
    free(off);
    free(on);
}

/* Pages of [off, off + len) of the mapping m now in memory. */
static size_t resident_pages(const uint8_t *m, size_t off, size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = len / pg, in = 0;
    unsigned char *v = xmalloc(n ? n : 1);
    if (!mincore((void *)(m + off), n * pg, v))
        for (size_t i = 0; i < n; i++) in += v[i] & 1;
    free(v);
    return in;
}

/* Preloading reads the ranges it is given into memory and nothing far beyond them: a file evicted from the page
 * cache, two unaligned ranges with a 32 MiB gap; the gap's second half (beyond any read-ahead) stays out. */
static void test_spine_warm(const char *path) {
    const size_t M = 1u << 20, pg = (size_t)sysconf(_SC_PAGESIZE);
    int fd = open(path, O_RDONLY);
    uint8_t *m = fd < 0 ? MAP_FAILED : mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        CHECK(0, "spine warm: map %s", path);
        if (fd >= 0) close(fd);
        return;
    }
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (resident_pages(m, 0, 56 * M)) {
        SKIP("the page cache here cannot be emptied of the file (tmpfs?)", "spine warm: reads the ranges given");
    } else {
        warm_range r[2] = {{m + 100, 16 * M - 100}, {m + 48 * M + 7, 8 * M - 7}};
        spine_warm *w = spine_warm_start(r, 2);
        spine_warm_wait(w);
        size_t a = resident_pages(m, 0, 16 * M), b = resident_pages(m, 48 * M, 8 * M),
               gap = resident_pages(m, 32 * M, 16 * M);
        CHECK(w && a == 16 * M / pg && b == 8 * M / pg && !gap && spine_warm_done(w) == 24 * M,
              "spine warm: both ranges in memory (%zu and %zu pages), none of the gap's far half (%zu), %llu bytes",
              a, b, gap, (unsigned long long)spine_warm_done(w));
        spine_warm_free(w);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        spine_warm_free(spine_warm_start(r, 2));   /* stopped before it is done: no wait, no leak */
        CHECK(!spine_warm_start(r, 0), "spine warm: nothing to read starts nothing");
    }
    munmap(m, FILE_BYTES);
    close(fd);
}

int main(void) {
    char path[] = "/tmp/deltafin-test-io-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write_pattern(path) == 0, "pattern file %s", path);
    if (fd < 0) TEST_EXIT();
    close(fd);
    check_source(path, IO_KIND_PREAD, NULL, "pread");
    check_source(path, IO_KIND_URING, NULL, "io_uring");
    const char *base = strrchr(path, '/') + 1;
    char hook[128];
    snprintf(hook, sizeof hook, "open:nothing,read:%s", base);
    check_source(path, IO_KIND_URING, hook, "io_uring, O_DIRECT refused at read");
    check_source(path, IO_KIND_PREAD, hook, "pread, O_DIRECT refused at read");
    snprintf(hook, sizeof hook, "open:%s", base);
    check_source(path, IO_KIND_URING, hook, "O_DIRECT refused at open");
    test_spine_warm(path);
    unlink(path);
    test_populate();
    test_hint();
    test_hint_ranks();
    test_pool_busy();
    test_lookahead();
    TEST_EXIT();
}
