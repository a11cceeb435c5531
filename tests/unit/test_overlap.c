/* test_overlap.c — experts applied in the order their bytes arrive. Storage hands out a layer's prefetched
 * experts as they become ready (a test hook delays chosen reads so they arrive scrambled; unannounced experts
 * are still read); the model's logits through scrambled arrival, a 1-slot cache and every look-ahead mode are
 * bit-identical to the engine's default path on every fixture; the look-ahead cost model reads guesses only
 * when recall and spare disk time pay for them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"
#include "model/model.h"
#include "residency/expert_index.h"
#include "residency/readahead.h"
#include "residency/store.h"

/* Delays: expert e of any layer waits (e * 5 + layer) % 7 ms before its read, so arrival follows neither id
 * order nor request order. With hold set, expert 0 of layer 1 is not read until the test lets it go (or 10 s
 * pass), which fixes one arrival order however the scheduler runs the I/O threads. */
typedef struct delay_ctx {
    atomic_int calls;
    atomic_int hold;
} delay_ctx;

static void delay_read(void *ctx, int layer, int e) {
    delay_ctx *dc = ctx;
    atomic_fetch_add(&dc->calls, 1);
    for (int ms = 0; layer == 1 && e == 0 && atomic_load(&dc->hold) && ms < 10000; ms++) usleep(1000);
    usleep((useconds_t)(((e * 5 + layer) % 7) * 1000));
}

/* ---- storage: arrival order ------------------------------------------------------------------------- */

static void test_arrival_order(const char *dir) {
    delay_ctx dc = {0};
    atomic_store(&dc.hold, 1);
    store_opts o = {.cache_slots = 8, .test_before_read = delay_read, .test_ctx = &dc};
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open_ex(&st, dir, &o, &err);
    CHECK(!rc, "arrival: open %s with the delay hook (%s)", dir, rc ? err.msg : "ok");
    if (rc) return;
    int n = DF_MIN(store_expert_count(st, 1), 8);
    int ids[8], order[8], seen[8] = {0};
    uint8_t done[8] = {0};
    for (int i = 0; i < n; i++) ids[i] = i;
    rc = store_experts_prefetch(st, 1, ids, n, &err);
    for (int k = 0; !rc && k < n; k++) {
        df_expert x;
        int u = -1;
        rc = store_expert_acquire_next(st, 1, ids, n, done, &u, &x, &err);
        if (rc) break;
        order[k] = u;
        seen[u]++;
        store_expert_release(st, 1, ids[u]);
        if (k == n - 2) atomic_store(&dc.hold, 0);   /* everything else is out: expert 0 may arrive now */
    }
    int once = !rc;
    for (int i = 0; i < n; i++) once &= seen[i] == 1;
    char got[64] = "";
    for (int k = 0; !rc && k < n; k++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", order[k]);
    CHECK(once && n >= 4 && order[n - 1] == 0, "arrival: %d prefetched experts handed out once each, in arrival "
          "order (%s), the held expert 0 last", n, rc ? err.msg : got);
    /* experts nobody prefetched are read on the spot, one by one */
    memset(done, 0, sizeof done);
    int layer = store_layer_count(st) - 1, ok = 1;
    for (int k = 0; ok && k < n; k++) {
        df_expert x;
        int u = -1;
        ok = store_expert_acquire_next(st, layer, ids, n, done, &u, &x, &err) == DF_OK && u >= 0;
        if (ok) store_expert_release(st, layer, ids[u]);
    }
    int all = 1;
    for (int i = 0; i < n; i++) all &= done[i];
    CHECK(ok && all, "arrival: unannounced experts are read where asked (%s)", ok ? "all handed out" : err.msg);
    int bad_ids[2] = {0, 1 << 20};
    memset(done, 0, sizeof done);
    df_expert x;
    int u = -1;
    rc = store_expert_acquire_next(st, 1, bad_ids, 2, done, &u, &x, &err);
    CHECK(rc == DF_EINVAL && u == 1 && strstr(err.msg, "out of range"), "arrival: an out-of-range id is refused "
          "naming it: %s", err.msg);
    store_free(st);
}

/* ---- the model through the storage seam, with the hook ----------------------------------------------- */

/* Prefill as one batch, then each decode token; all rows of logits (caller frees), or NULL. */
static float *model_logits(const char *dir, const store_opts *so, const int32_t *pre, int np, const int32_t *dec,
                           int nd, df_error *err) {
    df_model m;
    memset(&m, 0, sizeof m);
    df_kern kern;
    df_store *st = NULL;
    int rc = store_open_ex(&st, dir, so, err);
    if (rc) return NULL;
    rc = config_parse(&m.cfg, store_config_text(st), dir, err);
    if (rc) {
        store_free(st);
        return NULL;
    }
    if (kern_init(&kern, 2, NULL)) abort();
    m.store = st;
    m.kern = &kern;
    m.dir = dir;
    rc = model_init(&m, np, err);
    if (rc) {
        kern_free(&kern);
        config_free(&m.cfg);
        store_free(st);
        return NULL;
    }
    df_state *s = state_new(&m);
    int V = m.cfg.vocab;
    float *out = xmalloc((size_t)(np + nd) * V * sizeof(float));
    model_seg seg = {.s = s, .T = np, .logits = out, .all_rows = 1};
    rc = model_forward_batch(&m, &seg, 1, pre, err);
    for (int i = 0; !rc && i < nd; i++) {
        seg = (model_seg){.s = s, .T = 1, .logits = out + (int64_t)(np + i) * V, .all_rows = 1};
        rc = model_forward_batch(&m, &seg, 1, dec + i, err);
    }
    state_free(s);
    model_free(&m);
    kern_free(&kern);
    config_free(&m.cfg);
    store_free(st);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

static void check_fixture(const char *dir, const char *name, const ef_prompt *p) {
    const int32_t *pre = p->pre, *dec = p->dec;
    int np = p->np, nd = p->nd, V = 0;
    df_error err = {0};
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.lookahead = DF_LOOKAHEAD_OFF;
    float *ref = ef_logits(&o, pre, np, 0, dec, nd, &V, NULL, &err);
    CHECK(ref != NULL, "%s: engine run (%s)", name, ref ? "ok" : err.msg);
    static const struct {
        const char *label;
        int slots, stream, lookahead, delay;
    } cfgs[] = {
        {"scrambled arrival, full cache, look-ahead off", 0, 0, DF_LOOKAHEAD_OFF, 1},
        {"scrambled arrival, 1 slot, look-ahead off", 1, 0, DF_LOOKAHEAD_OFF, 1},
        {"scrambled arrival, 3 slots, spine streamed, look-ahead on", 3, 1, DF_LOOKAHEAD_ON, 1},
        {"scrambled arrival, 1 slot, look-ahead on", 1, 0, DF_LOOKAHEAD_ON, 1},
        {"scrambled arrival, 6 slots, look-ahead auto", 6, 0, DF_LOOKAHEAD_AUTO, 1},
        {"1 slot, spine streamed, look-ahead auto", 1, 1, DF_LOOKAHEAD_AUTO, 0},
    };
    for (size_t k = 0; ref && k < sizeof cfgs / sizeof cfgs[0]; k++) {
        delay_ctx dc = {0};
        store_opts so = {.cache_slots = cfgs[k].slots, .spine_stream = cfgs[k].stream,
                         .lookahead = cfgs[k].lookahead, .test_before_read = cfgs[k].delay ? delay_read : NULL,
                         .test_ctx = &dc};
        float *got = model_logits(dir, &so, pre, np, dec, nd, &err);
        int same = got && !memcmp(got, ref, (size_t)(np + nd) * V * sizeof(float));
        CHECK(same && (!cfgs[k].delay || atomic_load(&dc.calls) > 0), "%s: %s: logits bit-identical to the engine's "
              "(%d delayed reads; %s)", name, cfgs[k].label, atomic_load(&dc.calls), got ? "compared" : err.msg);
        free(got);
    }
    free(ref);
}

/* ---- the look-ahead cost model ------------------------------------------------------------------------ */

/* One token's guess of 8 experts (size 1 per rank) with these precisions, against a layer that reads 8. */
static int ranks_read(const double *precision, double util, double hit_rate, int reading) {
    double size[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ra_inputs in = {precision, size, 8, 8.0, util, hit_rate};
    return ra_read_ranks(&in, reading);
}

static void test_policy(void) {
    /* fit = min(1, (1 - u) / u x 8 / w) for the w surest ranks; gain = sum p x fit x (1 - hit),
     * cost = sum (1 - p) x ((1 - fit) + hit); the width worth most is read */
    double p90[8] = {.9, .9, .9, .9, .9, .9, .9, .9}, p75[8] = {.75, .75, .75, .75, .75, .75, .75, .75},
           p50[8] = {.5, .5, .5, .5, .5, .5, .5, .5}, p76[8] = {.76, .76, .76, .76, .76, .76, .76, .76},
           falling[8] = {.95, .9, .8, .6, .4, .3, .2, .1}, gap[8] = {.9, -1, .9, .9, .9, .9, .9, .9};
    CHECK(!ranks_read(p90, 1.0, 0.0, 0) && !ranks_read(p90, 1.0, 0.0, 1),
          "policy: a saturated disk never reads guesses (no idle time to fill)");
    CHECK(ranks_read(p75, 0.3, 0.1, 0) == 8, "policy: 75%% precision with the disk 30%% busy reads the whole guess");
    CHECK(!ranks_read(p50, 0.05, 0.95, 0), "policy: a cache that already serves 95%% does not trade it for guesses");
    int r50 = ranks_read(p50, 0.7, 0.05, 0), r76 = ranks_read(p76, 0.7, 0.05, 0);
    CHECK(r50 == 3 && r76 == 4, "policy: with the disk 70%% busy (idle time for 3.4 reads), 50%% precision reads "
          "the 3 reads that fit (%d), 76%% one more (%d)", r50, r76);
    CHECK(ranks_read(falling, 0.9, 0.05, 0) == 1, "policy: with the disk 90%% busy only the surest guess is read "
          "(95%% precision; the second, 90%%, would spill into busy time)");
    CHECK(ranks_read(gap, 0.3, 0.0, 0) == 1, "policy: ranks past one not yet measured are not read");
    double one[1] = {0.55}, size[1] = {1};
    ra_inputs between = {one, size, 1, 1.0, 0.65, 0.1};   /* gain 0.267, cost 0.253: keep reading, do not start */
    CHECK(ra_read_ranks(&between, 1) == 1 && ra_read_ranks(&between, 0) == 0,
          "policy: hysteresis between start and stop");
}

int main(void) {
    test_policy();
    test_arrival_order("tests/fixtures/k3-tiny");
    const char *root = "tests/fixtures";
    CHECK(ef_each_fixture(root, "prompt.json", check_fixture) >= 0, "fixtures folder %s", root);
    TEST_EXIT();
}
