/* test_scratch.c — the forward pass's working memory and bound weights: the scratch arena's bump, spill and
 * regrowth rules; on the bundled model, no heap allocation by the arena while prefilling up to the engine's
 * pass rows or a prompt in chunks, decoding, or batching sessions (its growth counter stays 0), one growth for a
 * bigger pass and none for the next like it, with logits equal bit for bit; and a missing or misshapen tensor refused
 * when the engine opens (resident or streamed spine), naming the tensor and the model folder. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"
#include "engine/engine_internal.h"
#include "st_fixture.h"

#define MODEL "models/default"

static void test_arena(void) {
    scratch a;
    scratch_init(&a, 1000);
    uint8_t *p = scratch_alloc(&a, 10), *q = scratch_alloc(&a, 100);
    CHECK(a.cap == 1024 && ((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0 && q == p + 64 && a.grows == 0,
          "arena: 64-byte aligned bumps inside the capacity take nothing from the heap");
    size_t mark = scratch_mark(&a);
    uint8_t *big = scratch_alloc(&a, 4000);
    memset(big, 7, 4000);
    CHECK(a.grows == 1 && (big < a.base || big >= a.base + a.cap), "arena: what does not fit spills to the heap");
    scratch_release(&a, mark);
    uint8_t *r = scratch_alloc(&a, 64);
    CHECK(r == p + 192 && a.grows == 1, "arena: a release returns to the mark");
    scratch_end_pass(&a);
    CHECK(a.grows == 2 && a.cap >= 192 + 4000 && a.used == 0 && a.n_spill == 0,
          "arena: the pass's end grows it once to what the pass needed (cap %zu)", a.cap);
    scratch_alloc(&a, 10);
    scratch_alloc(&a, 100);
    scratch_alloc(&a, 4000);
    scratch_end_pass(&a);
    CHECK(a.grows == 2, "arena: the same pass again takes nothing from the heap");
    scratch_free(&a);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static df_engine *open_default(int stream, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, MODEL, NULL);
    o.mem_budget = 128ull << 20;       /* pass rows = budget / 16 / (64 floats x hidden 256) = 128 */
    o.spine_stream = stream;
    o.lookahead = DF_LOOKAHEAD_ON;      /* the look-ahead's routing takes scratch too */
    df_engine *e = NULL;
    return df_engine_open(&e, &o, err) ? NULL : e;
}

/* A prompt of n ids, deterministic. */
static void prompt_ids(int32_t *ids, int n, int vocab, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % (uint32_t)(vocab - 300));
    }
}

static void test_no_allocation(int stream) {
    const char *how = stream ? "streamed spine" : "resident spine";
    df_error err = {0};
    df_engine *e = open_default(stream, &err);
    CHECK(e != NULL, "%s: the bundled model opens in 128 MiB (%s)", how, e ? "ok" : err.msg);
    if (!e) return;
    int R = df_engine_pass_rows(e), V = df_engine_info(e)->vocab_size, ctx = (int)df_engine_info(e)->max_context;
    const scratch *sc = &e->model.sc;
    store_stats ss;
    store_get_stats(e->store, &ss);
    CHECK(R == ctx && sc->cap >= model_scratch_bytes(&e->model, R) && sc->cap <= ss.reserve_bytes && sc->grows == 0,
          "%s: arena sized at open for a whole context within the %llu-byte working reserve: %zu bytes (pass rows "
          "%d of %d)", how, (unsigned long long)ss.reserve_bytes, sc->cap, R, ctx);
    R = ctx - 40;   /* leaves room to decode after a prefill of (nearly) the pass rows */
    int32_t ids[1000];
    prompt_ids(ids, 1000, V, 11);
    float *logits = xmalloc((size_t)2000 * V * sizeof(float));
    df_session *a = NULL, *b = NULL, *c = NULL;
    df_session_init(&a, e, &err);
    df_session_init(&b, e, &err);
    df_session_init(&c, e, &err);
    int rc = df_session_eval(a, ids, R, logits, 0, &err);
    CHECK(!rc && sc->grows == 0, "%s: a prefill of the pass rows (%d) allocates nothing (%s)", how, R,
          rc ? err.msg : "ok");
    int32_t tok = argmax(logits, V);
    for (int i = 0; !rc && i < 24; i++) {
        rc = df_session_eval(a, &tok, 1, logits, 0, &err);
        tok = argmax(logits, V);
    }
    CHECK(!rc && sc->grows == 0, "%s: 24 decoded tokens allocate nothing (%s)", how, rc ? err.msg : "ok");
    df_batch *bt = NULL;
    df_batch_init(&bt, e, &err);
    rc = df_batch_add(bt, a, &tok, 1, logits, 0, &err);
    if (!rc) rc = df_batch_add(bt, b, ids, R - 1, logits + V, 0, &err);
    if (!rc) rc = df_batch_eval(bt, &err);
    CHECK(!rc && sc->grows == 0, "%s: a batch of a decode row and a %d-row prefill allocates nothing (%s)", how,
          R - 1, rc ? err.msg : "ok");
    for (int i = 0; !rc && i < 8; i++) {
        int32_t next[2] = {argmax(logits, V), argmax(logits + V, V)};
        df_batch_clear(bt);
        rc = df_batch_add(bt, a, &next[0], 1, logits, 1, &err);
        if (!rc) rc = df_batch_add(bt, b, &next[1], 1, logits + V, 1, &err);
        if (!rc) rc = df_batch_eval(bt, &err);
    }
    CHECK(!rc && sc->grows == 0, "%s: batched decoding of two sessions allocates nothing (%s)", how,
          rc ? err.msg : "ok");
    rc = df_session_sync(c, ids, 500, logits, NULL, &err);
    CHECK(!rc && sc->grows == 0, "%s: a 500-token prompt through df_session_sync allocates nothing (%s)", how,
          rc ? err.msg : "ok");
    /* A pass beyond what the arena was sized for (here: 1000 rows of logits over two sessions) grows it once; the
     * next like it takes nothing more and gives the same logits bit for bit. Resident spine only (ASan time). */
    uint64_t grown = 0;
    for (int k = 0; !rc && !stream && k < 2; k++) {
        df_session_reset(b);
        df_session_reset(c);
        float *out = logits + (size_t)k * 1000 * V;
        df_batch_clear(bt);
        rc = df_batch_add(bt, b, ids, 500, out, 1, &err);
        if (!rc) rc = df_batch_add(bt, c, ids + 500, 500, out + (size_t)500 * V, 1, &err);
        if (!rc) rc = df_batch_eval(bt, &err);
        if (k) continue;
        CHECK(!rc && sc->grows >= 1, "%s: a pass with 1000 rows of logits over two sessions grows the arena (%llu "
              "heap allocations)", how, (unsigned long long)sc->grows);
        grown = sc->grows;
    }
    if (!stream)
        CHECK(!rc && sc->grows == grown && !memcmp(logits, logits + (size_t)1000 * V, (size_t)1000 * V * sizeof(float)),
              "%s: the same pass again allocates nothing and gives identical logits", how);
    df_batch_free(bt);
    df_session_free(a);
    df_session_free(b);
    df_session_free(c);
    free(logits);
    df_engine_free(e);
}

/* The bundled model's files, with one tensor name in the header changed (same length, so nothing else moves). */
static int copy_renamed(const char *dst, const char *from, const char *to) {
    size_t n = 0, nc = 0;
    df_error err = {0};
    char *st = df_read_file(MODEL "/model.safetensors", &n, &err), *cfg = df_read_file(MODEL "/config.json", &nc, &err);
    if (!st || !cfg || strlen(from) != strlen(to)) return -1;
    char *at = memmem(st, n, from, strlen(from));
    if (at) memcpy(at, to, strlen(to));
    fx_write_file(dst, "model.safetensors", st, n);
    fx_write_file(dst, "config.json", cfg, nc);
    free(st);
    free(cfg);
    return at ? 0 : -1;
}

static void test_bind_errors(const char *dir) {
    static const struct {
        const char *from, *to, *want;
    } cases[] = {
        {"\"model.layers.2.self_attn.dt_bias\"", "\"model.layers.2.self_attn.dt_biax\"",
         "model.layers.2.self_attn.dt_bias is missing"},
        {"\"model.layers.7.self_attn.o_proj.weight\"", "\"model.layers.7.self_attn.o_proj.weighx\"",
         "model.layers.7.self_attn.o_proj.weight is missing"},
        {"\"lm_head.weight\"", "\"lm_head.weighx\"", "lm_head.weight is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (copy_renamed(dir, cases[i].from, cases[i].to)) {
            CHECK(0, "bind: %s found in the bundled model's header", cases[i].from);
            continue;
        }
        for (int stream = 0; stream < 2; stream++) {
            df_engine_opts o;
            ef_opts(&o, dir, NULL);
            o.n_threads = 1;
            o.spine_stream = stream;
            df_engine *e = NULL;
            df_error err = {0};
            int rc = df_engine_open(&e, &o, &err);
            CHECK(rc == DF_EFORMAT && !e && strstr(err.msg, cases[i].want) && strstr(err.msg, dir),
                  "bind (%s spine): refused at open: %s", stream ? "streamed" : "resident", err.msg);
            df_engine_free(e);
        }
    }
}

int main(void) {
    test_arena();
    test_no_allocation(0);
    test_no_allocation(1);
    char dir[] = "/tmp/df_scratch_XXXXXX", path[512];
    if (!mkdtemp(dir)) return 2;
    test_bind_errors(dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
    TEST_EXIT();
}
