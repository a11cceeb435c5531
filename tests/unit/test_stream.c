/* test_stream.c — expert streaming: logits through a cache so small it evicts constantly, with
 * every layer's spine streamed, with O_DIRECT and with the buffered fallback, are bit-identical to the default
 * path on every fixture; a prefill batch reads each expert it needs once per layer; concurrent requests for
 * one expert share one read; a corrupt or truncated shard fails naming the expert; a budget too small for
 * the model is refused clearly. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"
#include "st_fixture.h"
#include "residency/expert_index.h"
#include "residency/store.h"

typedef struct run_cfg {
    const char *label;
    int slots, stream, buffered;
    int io_kind, lookahead;
    const char *no_direct;   /* DELTAFIN_TEST_NO_DIRECT while the engine opens (io.h) */
} run_cfg;

/* All rows of logits of the prompt with c's options (caller frees). */
static float *run_logits(const char *dir, const run_cfg *c, const int32_t *pre, int np, const int32_t *dec, int nd,
                         int *V, df_stats *stats, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.cache_slots = c->slots;
    o.spine_stream = c->stream;
    o.buffered_io = c->buffered;
    o.io_kind = c->io_kind;
    o.lookahead = c->lookahead;
    if (c->no_direct) setenv("DELTAFIN_TEST_NO_DIRECT", c->no_direct, 1);
    float *got = ef_logits(&o, pre, np, 0, dec, nd, V, stats, err);
    unsetenv("DELTAFIN_TEST_NO_DIRECT");
    return got;
}

static void check_fixture(const char *dir, const char *name, const ef_prompt *p) {
    const int32_t *pre = p->pre, *dec = p->dec;
    int np = p->np, nd = p->nd, V = 0;
    df_error err = {0};
    enum { AUTO = DF_LOOKAHEAD_AUTO, ON = DF_LOOKAHEAD_ON, OFF = DF_LOOKAHEAD_OFF };
    static const run_cfg cfgs[] = {
        {"default (look-ahead auto)", 0, 0, 0, 0, AUTO, NULL},
        {"1 slot, spine streamed, O_DIRECT, look-ahead off", 1, 1, 0, 0, OFF, NULL},
        {"3 slots, spine streamed, buffered, look-ahead off", 3, 1, 1, 0, OFF, NULL},
        {"2 slots, look-ahead on, pread pool", 2, 0, 0, 1, ON, NULL},
        {"5 slots, look-ahead on, spine streamed, io_uring", 5, 1, 0, 2, ON, NULL},
        {"1 slot, look-ahead on", 1, 0, 0, 0, ON, NULL},
        {"1 slot, look-ahead auto", 1, 0, 0, 0, AUTO, NULL},
        {"full cache, look-ahead off", 0, 0, 0, 0, OFF, NULL},
        {"full cache, look-ahead on", 0, 0, 0, 0, ON, NULL},
        {"4 slots, look-ahead auto, spine streamed", 4, 1, 0, 0, AUTO, NULL},
        {"2 slots, O_DIRECT refused at read -> buffered fallback", 2, 0, 0, 0, OFF, "read:*"},
        {"2 slots, O_DIRECT refused at open -> buffered fallback", 2, 1, 0, 0, OFF, "open:*"}};
    enum { N_CFG = sizeof cfgs / sizeof cfgs[0] };
    df_stats st[N_CFG];
    float *ref = run_logits(dir, &cfgs[0], pre, np, dec, nd, &V, &st[0], &err);
    CHECK(ref != NULL, "%s: default run (%s)", name, ref ? "ok" : err.msg);
    for (int k = 1; ref && k < N_CFG; k++) {
        float *got = run_logits(dir, &cfgs[k], pre, np, dec, nd, &V, &st[k], &err);
        CHECK(got && !memcmp(got, ref, (size_t)(np + nd) * V * sizeof(float)),
              "%s: %s: logits bit-identical to the default path (%s)", name, cfgs[k].label, got ? "compared" : err.msg);
        if (got && cfgs[k].no_direct)
            CHECK(st[k].direct_fallbacks > 0, "%s: %s: the refusal was seen (%d files fell back)", name,
                  cfgs[k].label, st[k].direct_fallbacks);
        if (got && cfgs[k].lookahead == ON)
            CHECK(st[k].lookahead_recalled <= st[k].lookahead_requests, "%s: %s: %llu of %llu next-layer experts "
                  "guessed, %llu guessed reads", name, cfgs[k].label, (unsigned long long)st[k].lookahead_recalled,
                  (unsigned long long)st[k].lookahead_requests, (unsigned long long)st[k].lookahead_loads);
        if (got && st[k].expert_requests && k < 3)
            CHECK(st[k].expert_loads > (uint64_t)st[k].cache_slots && st[k].streamed_layers > 0,
                  "%s: %s: cache evicted (%llu reads into %d slots), %d layers streamed", name, cfgs[k].label,
                  (unsigned long long)st[k].expert_loads, st[k].cache_slots, st[k].streamed_layers);
        free(got);
    }
    if (ref && st[1].expert_requests)
        CHECK(st[1].expert_loads == st[1].expert_requests && st[0].expert_loads - st[0].lookahead_loads <= st[0].expert_requests,
              "%s: each expert a batch needs is read once per layer (%llu reads for %llu requested with 1 slot; "
              "%llu for %llu with a full cache)", name, (unsigned long long)st[1].expert_loads,
              (unsigned long long)st[1].expert_requests, (unsigned long long)st[0].expert_loads,
              (unsigned long long)st[0].expert_requests);
    free(ref);
}

/* ---- coalescing ------------------------------------------------------------------------------------ */

typedef struct racer {
    df_store *st;
    pthread_barrier_t *bar;
    df_expert ex;
    int rc;
} racer;

static void *race_one(void *arg) {
    racer *r = arg;
    df_error err = {0};
    pthread_barrier_wait(r->bar);
    r->rc = store_expert_acquire(r->st, 1, 3, &r->ex, &err);
    return NULL;
}

static void test_coalesce(const char *dir) {
    store_opts o = {.cache_slots = 4};
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open_ex(&st, dir, &o, &err);
    CHECK(!rc, "coalesce: open (%s)", rc ? err.msg : "ok");
    if (rc) return;
    enum { N = 6 };
    racer r[N];
    pthread_t th[N];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
        r[i] = (racer){.st = st, .bar = &bar, .rc = -1};
        pthread_create(&th[i], NULL, race_one, &r[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    int same = 1;
    for (int i = 0; i < N; i++) same &= r[i].rc == 0 && r[i].ex.w1.data == r[0].ex.w1.data;
    store_stats s;
    store_get_stats(st, &s);
    CHECK(same && s.expert_loads == 1, "coalesce: %d concurrent acquires of one expert -> %llu read, one slot", N,
          (unsigned long long)s.expert_loads);
    /* the pinned slot survives pressure from other experts */
    for (int e = 4; e < 12; e++) {
        df_expert x;
        if (!store_expert_acquire(st, 1, e, &x, &err)) store_expert_release(st, 1, e);
    }
    df_expert again;
    store_expert_acquire(st, 1, 3, &again, &err);
    store_get_stats(st, &s);
    CHECK(again.w1.data == r[0].ex.w1.data && s.expert_loads == 9,
          "coalesce: a pinned expert is not evicted while others stream through (%llu reads)",
          (unsigned long long)s.expert_loads);
    store_expert_release(st, 1, 3);
    for (int i = 0; i < N; i++) store_expert_release(st, 1, 3);
    store_free(st);
}

/* ---- damaged shards --------------------------------------------------------------------------------- */

/* A writable copy of the fixture's files in a new temp folder. */
static void copy_fixture(const char *src, char *dir, size_t cap) {
    fx_mkdir("stream", dir, cap);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char path[2048];
        size_t n;
        df_error err = {0};
        snprintf(path, sizeof path, "%s/%s", src, files[i]);
        char *data = df_read_file(path, &n, &err);
        if (!data) exit(2);
        fx_write_file(dir, files[i], data, n);
        free(data);
    }
}

static const store_expert_part *find_part(const store_expert_loc *loc, const char *suffix) {
    for (int p = 0; p < loc->n_parts; p++) {
        size_t a = strlen(loc->parts[p].name), b = strlen(suffix);
        if (a >= b && !strcmp(loc->parts[p].name + a - b, suffix)) return &loc->parts[p];
    }
    return NULL;
}

static void test_damage(const char *fixture, int buffered) {
    char dir[1024], shard[1100];
    copy_fixture(fixture, dir, sizeof dir);
    snprintf(shard, sizeof shard, "%s/model.safetensors", dir);
    store_opts o = {.cache_slots = 2, .buffered_io = buffered};
    const char *mode = buffered ? "buffered" : "O_DIRECT";
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open_ex(&st, dir, &o, &err);
    const store_expert_loc *loc = rc ? NULL : store_expert_locate(st, 2, 5);
    const store_expert_part *sc = loc ? find_part(loc, "w2.weight_scale") : NULL;
    CHECK(sc != NULL, "damage: open copy and locate expert 5 of layer 2 (%s)", rc ? err.msg : "ok");
    if (!sc) {
        store_free(st);
        fx_rmtree(dir);
        return;
    }
    FILE *f = fopen(shard, "r+b");
    fseek(f, (long)(sc->offset + 7), SEEK_SET);
    fputc(0xFF, f);
    fclose(f);
    df_expert x;
    rc = store_expert_acquire(st, 2, 5, &x, &err);
    CHECK(rc == DF_EFORMAT && strstr(err.msg, "expert 5 of layer 2") && strstr(err.msg, "0xFF"),
          "damage (%s): corrupt scale byte -> error naming the expert: %s", mode, err.msg);
    rc = store_expert_acquire(st, 2, 4, &x, &err);
    CHECK(rc == DF_OK, "damage (%s): other experts still load", mode);
    if (!rc) store_expert_release(st, 2, 4);
    /* cut the file inside the last expert of the last MoE layer, after open */
    int last = store_layer_count(st) - 1, ne = store_expert_count(st, last);
    uint64_t cut = 0;
    int victim = -1;
    for (int e = 0; e < ne; e++) {
        const store_expert_loc *l = store_expert_locate(st, last, e);
        if (l->offset > cut) cut = l->offset, victim = e;
    }
    if (truncate(shard, (off_t)(cut + 5)) == 0 && victim >= 0) {
        rc = store_expert_acquire(st, last, victim, &x, &err);
        char want[64];
        snprintf(want, sizeof want, "expert %d of layer %d", victim, last);
        CHECK(rc == DF_EIO && strstr(err.msg, want) && strstr(err.msg, "truncated"),
              "damage (%s): shard truncated after open -> error naming the expert: %s", mode, err.msg);
    } else {
        CHECK(0, "damage: truncate %s", shard);
    }
    store_free(st);
    rc = store_open_ex(&st, dir, &o, &err);
    CHECK(rc == DF_EFORMAT && strstr(err.msg, "truncated") && strstr(err.msg, "experts."),
          "damage: truncated shard refused at open naming the expert tensor: %s", err.msg);
    store_free(st);
    fx_rmtree(dir);
}

static void test_budget(const char *fixture) {
    df_store *st = NULL;
    df_error err = {0};
    store_opts o = {.mem_budget = 4096};
    int rc = store_open_ex(&st, fixture, &o, &err);
    CHECK(rc == DF_ENOMEM && strstr(err.msg, "budget"), "budget: too small a budget is refused: %s", err.msg);
    store_free(st);
    o = (store_opts){.mem_budget = 96ull << 20};
    rc = store_open_ex(&st, fixture, &o, &err);
    store_stats s = {0};
    if (!rc) store_get_stats(st, &s);
    CHECK(!rc && s.mem_budget == (96ull << 20) &&
              s.reserve_bytes + s.resident_spine_bytes + s.stream_buffer_bytes + s.cache_bytes <= s.mem_budget,
          "budget: the plan fits the budget (reserve %llu + spine %llu + buffers %llu + cache %llu)",
          (unsigned long long)s.reserve_bytes, (unsigned long long)s.resident_spine_bytes,
          (unsigned long long)s.stream_buffer_bytes, (unsigned long long)s.cache_bytes);
    store_free(st);
}

int main(void) {
    const char *root = "tests/fixtures";
    CHECK(ef_each_fixture(root, "prompt.json", check_fixture) >= 0, "fixtures folder %s", root);
    test_coalesce("tests/fixtures/k3-tiny");
    test_damage("tests/fixtures/k3-tiny", 0);
    test_damage("tests/fixtures/k3-tiny", 1);
    test_budget("tests/fixtures/k3-tiny");
    TEST_EXIT();
}
