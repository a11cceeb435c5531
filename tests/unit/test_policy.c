/* test_policy.c — the expert cache's replacement policies and their simulator: Belady's optimum on textbook
 * traces and against exhaustive search, LRU/LFU/ARC on hand-worked traces, every policy run inside the real
 * slot bank against its own simulation, and routing traces written by the store and read back. */
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "residency/cache.h"
#include "residency/policy.h"
#include "residency/trace.h"
#include "test.h"

/* One record per access (no record protection), keys 0..n_keys-1 in one layer. */
static uint64_t sim(int kind, const int64_t *keys, int64_t n, int slots, int64_t n_keys) {
    int64_t rec[64], base[2] = {0, n_keys};
    DF_ASSERT(n < 64);
    for (int64_t i = 0; i <= n; i++) rec[i] = i;
    policy_trace t = {keys, rec, n, n, 1, base, 0};
    return policy_simulate(kind, &t, slots);
}

/* Fewest misses over every possible eviction choice: an independent reference for Belady. */
static int brute_misses(const int64_t *keys, int n, int i, int64_t *held, int used, int slots) {
    if (i == n) return 0;
    for (int j = 0; j < used; j++)
        if (held[j] == keys[i]) return brute_misses(keys, n, i + 1, held, used, slots);
    if (used < slots) {
        held[used] = keys[i];
        int m = 1 + brute_misses(keys, n, i + 1, held, used + 1, slots);
        return m;
    }
    int best = 1 << 30;
    for (int j = 0; j < used; j++) {
        int64_t old = held[j];
        held[j] = keys[i];
        int m = 1 + brute_misses(keys, n, i + 1, held, used, slots);
        held[j] = old;
        best = DF_MIN(best, m);
    }
    return best;
}

static void test_textbook(void) {
    /* the reference string of Silberschatz et al., 3 frames: OPT 9 faults, LRU 12 */
    static const int64_t s[20] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
    CHECK(sim(POLICY_COUNT, s, 20, 3, 8) == 11, "belady: textbook string, 3 slots, 9 misses (%llu hits)",
          (unsigned long long)sim(POLICY_COUNT, s, 20, 3, 8));
    CHECK(sim(POLICY_LRU, s, 20, 3, 8) == 8, "lru: textbook string, 3 slots, 12 misses (%llu hits)",
          (unsigned long long)sim(POLICY_LRU, s, 20, 3, 8));
    /* A A B C A, 2 slots: LRU evicts A for C (A is older than B); LFU keeps A (2 uses) and evicts B */
    static const int64_t f[5] = {0, 0, 1, 2, 0};
    CHECK(sim(POLICY_LRU, f, 5, 2, 3) == 1 && sim(POLICY_LFU, f, 5, 2, 3) == 2,
          "lfu keeps the twice-used expert where lru drops it (%llu vs %llu hits)",
          (unsigned long long)sim(POLICY_LFU, f, 5, 2, 3), (unsigned long long)sim(POLICY_LRU, f, 5, 2, 3));
    /* A B A B C D E A B, 2 slots: the scan C D E flushes LRU; ARC keeps B (in its frequency list) */
    static const int64_t a[9] = {0, 1, 0, 1, 2, 3, 4, 0, 1};
    CHECK(sim(POLICY_LRU, a, 9, 2, 5) == 2 && sim(POLICY_ARC, a, 9, 2, 5) == 3,
          "arc: a scan does not flush the frequently used (%llu vs lru %llu hits)",
          (unsigned long long)sim(POLICY_ARC, a, 9, 2, 5), (unsigned long long)sim(POLICY_LRU, a, 9, 2, 5));
    /* A B C A, 2 slots, one layer (the next token is the next record): LFU drops A, the older of two single
     * uses; told that A comes next, lfu+next drops B and hits, as Belady does */
    static const int64_t n[4] = {0, 1, 2, 0};
    CHECK(sim(POLICY_LFU, n, 4, 2, 3) == 0 && sim(POLICY_ORACLE_NEXT, n, 4, 2, 3) == 1 &&
              sim(POLICY_COUNT, n, 4, 2, 3) == 1 && !strcmp(policy_name(POLICY_ORACLE_NEXT), "lfu+next"),
          "lfu+next keeps what the next token asks for (%llu hits, lfu %llu)",
          (unsigned long long)sim(POLICY_ORACLE_NEXT, n, 4, 2, 3), (unsigned long long)sim(POLICY_LFU, n, 4, 2, 3));
}

static void test_belady_brute(void) {
    uint64_t r = 12345;
    int ok = 1, trials = 0;
    for (int t = 0; t < 300; t++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int n = 6 + (int)(r >> 60) % 7, slots = 1 + (int)((r >> 50) % 3), nk = slots + 1 + (int)((r >> 40) % 3);
        int64_t keys[16], held[8];
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            keys[i] = (int64_t)((r >> 33) % (uint64_t)nk);
        }
        uint64_t hits = sim(POLICY_COUNT, keys, n, slots, nk);
        ok &= (int)hits == n - brute_misses(keys, n, 0, held, 0, slots);
        for (int k = 0; k < POLICY_COUNT; k++) ok &= sim(k, keys, n, slots, nk) <= hits;
        trials++;
    }
    CHECK(ok, "belady equals exhaustive search and bounds every policy on %d random traces", trials);
}

/* ---- each policy inside the slot bank matches its simulation ---------------------------------------- */

static int mark_load(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err) {
    (void)ctx, (void)err;
    slot[0] = (uint8_t)layer;
    slot[1] = (uint8_t)e;
    memset(view, 0, sizeof *view);
    view->w1.data = slot;
    return DF_OK;
}

enum { TL = 3, TE = 16, TK = 3, TTOK = 200 };

/* A skewed trace: TTOK tokens, TK distinct experts per layer, the square of a uniform draw favouring low ids. */
static void make_trace(int64_t *keys, int64_t *rec, int64_t *base) {
    uint64_t r = 99;
    int n = 0, nr = 0;
    for (int l = 0; l <= TL; l++) base[l] = (int64_t)l * TE;
    rec[0] = 0;
    for (int t = 0; t < TTOK; t++)
        for (int l = 0; l < TL; l++) {
            int got = 0, ids[TK];
            while (got < TK) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                double u = (double)(r >> 11) / 9007199254740992.0;
                int e = (int)(u * u * TE), dup = 0;
                for (int j = 0; j < got; j++) dup |= ids[j] == e;
                if (!dup) ids[got++] = e;
            }
            for (int j = 0; j < TK; j++) keys[n++] = base[l] + ids[j];
            rec[++nr] = n;
        }
}

static void test_cache_matches_sim(void) {
    static int64_t keys[TTOK * TL * TK], rec[TTOK * TL + 1];
    int64_t base[TL + 1];
    make_trace(keys, rec, base);
    policy_trace pt = {keys, rec, TTOK * TL * TK, TTOK * TL, TL, base, 0};
    int ne[TL] = {TE, TE, TE};
    for (int kind = 0; kind < POLICY_COUNT; kind++) {
        io_pool *pool = io_pool_new(1);
        int slots = 12;
        ecache *c = ecache_new(TL, ne, slots, IO_ALIGN, 0, pool, mark_load, NULL);
        ecache_set_policy(c, kind);
        int ok = 1;
        df_error err = {0};
        for (int64_t r = 0; r < pt.n_rec; r++) {
            int layer = (int)(r % TL), ids[TK];
            for (int j = 0; j < TK; j++) ids[j] = (int)(keys[rec[r] + j] - base[layer]);
            ecache_prefetch(c, layer, ids, TK);
            for (int j = 0; j < TK; j++) {
                df_expert x;
                ok &= ecache_acquire(c, layer, ids[j], &x, &err) == DF_OK;
                ok &= ((uint8_t *)x.w1.data)[0] == layer && ((uint8_t *)x.w1.data)[1] == ids[j];
                ecache_release(c, layer, ids[j]);
            }
        }
        ecache_stats s;
        ecache_get_stats(c, &s);
        uint64_t want = policy_simulate(kind, &pt, slots), belady = policy_simulate(POLICY_COUNT, &pt, slots);
        CHECK(ok && s.hits == want && s.hits + s.misses == (uint64_t)pt.n && want <= belady,
              "cache with policy %s: right bytes, %llu hits as simulated (%llu), belady %llu", policy_name(kind),
              (unsigned long long)s.hits, (unsigned long long)want, (unsigned long long)belady);
        ecache_free(c);
        io_pool_free(pool);
    }
    uint64_t lru = policy_simulate(POLICY_LRU, &pt, 12), lfu = policy_simulate(POLICY_LFU, &pt, 12);
    CHECK(lfu > lru, "skewed trace: lfu beats lru (%llu vs %llu hits)", (unsigned long long)lfu,
          (unsigned long long)lru);
    CHECK(policy_parse("lru") == POLICY_LRU && policy_parse("arc") == POLICY_ARC && policy_parse("x") < 0 &&
              !strcmp(policy_name(POLICY_DEFAULT), "lfu"),
          "policy names parse; the default is lfu");
}

/* ---- routing traces ------------------------------------------------------------------------------------ */

static void test_trace_file(void) {
    char path[] = "/tmp/deltafin-test-trace-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    int ne[3] = {0, 4, 6};
    df_error err = {0};
    for (int run = 0; run < 2; run++) {   /* two runs append to one file */
        rtrace_writer *w = NULL;
        int rc = rtrace_writer_open(&w, path, 3, ne, &err);
        int a[2] = {3, 1}, b[3] = {5, 0, 2};
        if (!rc) rc = rtrace_writer_record(w, 1, a, 2, &err);
        if (!rc) rc = rtrace_writer_record(w, 2, b, 3, &err);
        rc |= rtrace_writer_close(w, &err);
        CHECK(rc == DF_OK, "trace: run %d recorded: %s", run, rc ? err.msg : "ok");
    }
    rtrace t;
    int rc = rtrace_read(&t, path, &err);
    CHECK(rc == DF_OK && t.n_layers == 3 && t.n_records == 4 && t.n_access == 10 && t.keys[0] == 3 &&
              t.keys[1] == 1 && t.keys[2] == 4 + 5 && t.rec[2] == 5 && t.base[3] == 10,
          "trace: read back with keys, records and layer bases: %s", rc ? err.msg : "ok");
    if (!rc) rtrace_free(&t);
    static const char *const bad[] = {
        "1 2 3\n",                                                       /* no header */
        "deltafin-routing-trace 1\nexperts 0 4\n1 4\n",                  /* id out of range */
        "deltafin-routing-trace 1\nexperts 0 4\n0 1\n",                  /* dense layer */
        "deltafin-routing-trace 1\nexperts 0 4\n1 2\ndeltafin-routing-trace 1\nexperts 0 5\n",   /* mixed models */
        "deltafin-routing-trace 1\nexperts 0 4\n1 x\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        rc = rtrace_read(&t, path, &err);
        CHECK(rc == DF_EFORMAT && strstr(err.msg, path), "trace: malformed case %zu refused: %s", i, err.msg);
    }
    unlink(path);
    rtrace_writer *w = NULL;
    rc = rtrace_writer_open(&w, "/nonexistent-dir/trace", 3, ne, &err);
    CHECK(rc == DF_EIO && !w && strstr(err.msg, "/nonexistent-dir/trace"), "trace: unwritable path named: %s", err.msg);
}

int main(void) {
    test_textbook();
    test_belady_brute();
    test_cache_matches_sim();
    test_trace_file();
    TEST_EXIT();
}
