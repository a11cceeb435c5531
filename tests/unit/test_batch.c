/* test_batch.c — several sessions in one forward pass give each session the logits it gets evaluated alone,
 * on every fixture: sessions at different positions, a prompt slice beside decode rows and verify rows,
 * entries with and without logits, then a second batch on the states the first one left. Bit for bit with
 * the kernels whose sums never depend on how many rows a product has (scalar, and AVX-512 / AVX2 where this
 * CPU runs them); with the best kernels of this CPU within BATCH_TOL of the logits' scale (AMX takes MXFP4
 * products from 4 rows and sums in another order). Also: a failed batch leaves its sessions as they were,
 * and a batch reads the spine once and each expert of a layer's union once. A long prompt in one pass (its
 * experts run in groups, its GLUs in row blocks) gives the logits of the same prompt in small passes. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "test.h"
#include "engine_fixture.h"

/* Largest logit difference allowed between a batched and an alone evaluation with row-count-dependent
 * kernels, relative to the largest |logit| (at least 1): float rounding, a few ulps of the logits. */
#define BATCH_TOL 1e-6f

enum { N_SESS = 4 };

/* Session i's history before the batch, and its rows in the two batches. */
static const int hist_len[N_SESS] = {9, 0, 3, 17};
static const int rows1[N_SESS] = {1, 12, 4, 1};      /* decode, prompt slice, verify rows, decode */
static const int all1[N_SESS] = {0, 0, 1, 0};
static const int has1[N_SESS] = {1, 1, 1, 0};         /* session 3 asks for no logits */
static const int rows2[N_SESS] = {1, 1, 2, 1};

static void make_ids(int32_t *ids, int n, int V, int salt) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(1 + ((i + 1) * 37 + salt * 101) % (V - 1));
}

/* Runs the batches and the alone evaluations on one engine; returns the largest relative difference seen (INFINITY
 * on an error) and sets *identical when every row matched bit for bit. */
static float run_case(df_engine *eng, int *identical) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[N_SESS][64];
    df_session *b[N_SESS], *a[N_SESS];
    float *lb[N_SESS], *la[N_SESS];
    int rc = DF_OK;
    for (int i = 0; i < N_SESS; i++) {
        make_ids(ids[i], 64, V, i);
        df_session_init(&b[i], eng, &err);
        df_session_init(&a[i], eng, &err);
        if (hist_len[i]) {
            rc |= df_session_eval(b[i], ids[i], hist_len[i], NULL, 0, &err);
            rc |= df_session_eval(a[i], ids[i], hist_len[i], NULL, 0, &err);
        }
        lb[i] = xcalloc((size_t)16 * V, sizeof(float));
        la[i] = xcalloc((size_t)16 * V, sizeof(float));
    }
    float worst = 0.0f;
    *identical = 1;
    df_batch *bt = NULL;
    df_batch_init(&bt, eng, &err);
    for (int pass = 0; !rc && pass < 2; pass++) {
        df_batch_clear(bt);
        for (int i = 0; !rc && i < N_SESS; i++) {
            int at = hist_len[i] + (pass ? rows1[i] : 0), n = pass ? rows2[i] : rows1[i];
            int all = pass ? 1 : all1[i];
            float *out = pass || has1[i] ? lb[i] : NULL;
            rc = df_batch_add(bt, b[i], ids[i] + at, n, out, all, &err);
        }
        if (!rc) rc = df_batch_eval(bt, &err);
        for (int i = 0; !rc && i < N_SESS; i++) {
            int at = hist_len[i] + (pass ? rows1[i] : 0), n = pass ? rows2[i] : rows1[i];
            int all = pass ? 1 : all1[i], has = pass || has1[i];
            rc = df_session_eval(a[i], ids[i] + at, n, has ? la[i] : NULL, all, &err);
            if (rc || !has) continue;
            int64_t cnt = (int64_t)(all ? n : 1) * V;
            float d = ef_rel_diff(lb[i], la[i], cnt);
            if (d > worst) worst = d;
            if (memcmp(lb[i], la[i], (size_t)cnt * sizeof(float))) *identical = 0;
        }
        for (int i = 0; !rc && i < N_SESS; i++)
            if (df_session_pos(b[i]) != df_session_pos(a[i])) rc = DF_EINVAL;
    }
    if (rc) {
        printf("# error: %s\n", err.msg);
        worst = INFINITY;
    }
    df_batch_free(bt);
    for (int i = 0; i < N_SESS; i++) {
        df_session_free(b[i]);
        df_session_free(a[i]);
        free(lb[i]);
        free(la[i]);
    }
    return worst;
}

/* A 300-row prompt in one pass against the same prompt in passes of 8 rows, every row's logits: the long pass
 * runs its expert union in groups that fit the expert-output pool and its GLUs in row blocks, the short ones
 * run everything at once. Returns the largest difference relative to the largest |logit|. */
static float long_prompt_case(df_engine *eng, int *identical) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    int n = (int)DF_MIN(300, df_engine_info(eng)->max_context);
    int32_t ids[300];
    make_ids(ids, n, V, 7);
    float *one = xcalloc((size_t)n * V, sizeof(float)), *parts = xcalloc((size_t)n * V, sizeof(float));
    df_session *a = NULL, *b = NULL;
    df_session_init(&a, eng, &err);
    df_session_init(&b, eng, &err);
    int rc = df_session_eval(a, ids, n, one, 1, &err);
    for (int t = 0; !rc && t < n; t += 8)
        rc = df_session_eval(b, ids + t, (int)DF_MIN(8, n - t), parts + (size_t)t * V, 1, &err);
    float worst = rc ? INFINITY : 0.0f, scale = 1.0f;
    for (size_t i = 0; !rc && i < (size_t)n * V; i++) scale = fmaxf(scale, fabsf(one[i]));
    for (size_t i = 0; !rc && i < (size_t)n * V; i++) worst = fmaxf(worst, fabsf(one[i] - parts[i]) / scale);
    *identical = !rc && !memcmp(one, parts, (size_t)n * V * sizeof(float));
    if (rc) printf("# long prompt: %s\n", err.msg);
    df_session_free(a);
    df_session_free(b);
    free(one);
    free(parts);
    return worst;
}

static df_engine *open_engine(const char *dir, const char *isa) {
    df_error err = {0};
    df_engine *eng = ef_open(dir, isa, &err);
    if (!eng) printf("# %s (%s): %s\n", dir, isa ? isa : "best", err.msg);
    return eng;
}

static int cancel_at_layer(void *ctx, int layer, int n_layers) {
    (void)n_layers;
    return layer == *(const int *)ctx;
}

/* Logits of ids[0..n) then ids[at] evaluated on a fresh session, in those two evaluations. */
static void reference(df_engine *eng, const int32_t *ids, int n, int at, float *out) {
    df_error err = {0};
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    df_session_eval(s, ids, n, NULL, 0, &err);
    df_session_eval(s, ids + at, 1, out, 0, &err);
    df_session_free(s);
}

/* A batch refused (a token outside the vocabulary in its last entry) or cancelled part-way (a step callback
 * of one session stops it after layer 1) leaves every session of it where it was: same position and the
 * same continuation as a session that never saw the batch. */
static void check_failures(df_engine *eng, const char *name) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[32];
    make_ids(ids, 32, V, 7);
    int32_t bad[2] = {ids[12], (int32_t)V};
    df_session *s[2];
    for (int i = 0; i < 2; i++) {
        df_session_init(&s[i], eng, &err);
        df_session_eval(s[i], ids, 5 + i, NULL, 0, &err);
    }
    int layer = 1;
    df_batch *bt = NULL;
    df_batch_init(&bt, eng, &err);
    df_batch_add(bt, s[0], ids + 10, 2, NULL, 0, &err);
    df_batch_add(bt, s[1], bad, 2, NULL, 0, &err);
    int rc = df_batch_eval(bt, &err);
    CHECK(rc == DF_EINVAL && df_session_pos(s[0]) == 5 && df_session_pos(s[1]) == 6,
          "%s: a batch with a bad token is refused and changes nothing (%s)", name, err.msg);
    df_batch_clear(bt);
    df_batch_add(bt, s[0], ids + 10, 2, NULL, 0, &err);
    df_batch_add(bt, s[1], ids + 12, 3, NULL, 0, &err);
    df_session_set_step_callback(s[1], cancel_at_layer, &layer);
    rc = df_batch_eval(bt, &err);
    df_session_set_step_callback(s[1], NULL, NULL);
    int ok = rc == DF_ECANCELLED && df_session_pos(s[0]) == 5 && df_session_pos(s[1]) == 6;
    float *got = xmalloc((size_t)V * sizeof(float)), *want = xmalloc((size_t)V * sizeof(float));
    for (int i = 0; ok && i < 2; i++) {
        df_session_eval(s[i], ids + 20, 1, got, 0, &err);
        reference(eng, ids, 5 + i, 20, want);
        ok = !memcmp(got, want, (size_t)V * sizeof(float));
    }
    CHECK(ok, "%s: a batch cancelled after layer 1 leaves both sessions as they were", name);
    df_batch_free(bt);
    for (int i = 0; i < 2; i++) df_session_free(s[i]);
    free(got);
    free(want);
}

/* What a batch reads, with every layer's spine streamed and a one-slot expert cache: the spine once per pass
 * (against once per session evaluated alone), and each expert of a
 * layer's union once (requests = the union per layer; no more than the sessions alone ask for). */
static void check_reads(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.spine_stream = 1;
    o.cache_slots = 1;
    o.buffered_io = 1;
    o.lookahead = DF_LOOKAHEAD_OFF;   /* guessed reads depend on timing; only needed reads are counted here */
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(&eng, &o, &err)) {
        CHECK(0, "%s opens streamed: %s", name, err.msg);
        return;
    }
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[N_SESS][64];
    df_session *s[N_SESS], *c = NULL;
    df_session_init(&c, eng, &err);
    for (int i = 0; i < N_SESS; i++) {
        make_ids(ids[i], 64, V, i);
        df_session_init(&s[i], eng, &err);
        if (hist_len[i]) df_session_eval(s[i], ids[i], hist_len[i], NULL, 0, &err);
    }
    df_stats a, b;
    uint64_t alone_spine = 0, alone_req = 0;
    int rc = DF_OK;
    for (int i = 0; !rc && i < N_SESS; i++) {
        rc = df_session_copy(c, s[i], &err);
        df_engine_stats(eng, &a);
        if (!rc) rc = df_session_eval(c, ids[i] + hist_len[i], rows1[i], NULL, 0, &err);
        df_engine_stats(eng, &b);
        alone_spine += b.spine_disk_bytes - a.spine_disk_bytes;
        alone_req += b.expert_requests - a.expert_requests;
    }
    df_batch *bt = NULL;
    df_batch_init(&bt, eng, &err);
    for (int i = 0; i < N_SESS; i++) df_batch_add(bt, s[i], ids[i] + hist_len[i], rows1[i], NULL, 0, &err);
    df_engine_stats(eng, &a);
    if (!rc) rc = df_batch_eval(bt, &err);
    df_engine_stats(eng, &b);
    uint64_t spine = b.spine_disk_bytes - a.spine_disk_bytes, req = b.expert_requests - a.expert_requests;
    uint64_t loads = b.expert_loads - a.expert_loads;
    /* The streamer reads ahead asynchronously, so a pass's count varies by a layer or so: a batch reads about
     * one pass's worth, the sessions alone N (here 4) times that. */
    if (strcmp(df_engine_backend(eng), "cpu")) {   /* a GPU holds every weight: storage reads nothing per pass */
        SKIP("weights resident on the GPU", "%s: a batch reads the spine and each expert of a union once", name);
    } else {
        CHECK(!rc && spine > 0 && spine * 2 < alone_spine,
              "%s: a batch of %d sessions reads the spine once (%llu bytes; alone %llu)", name, N_SESS,
              (unsigned long long)spine, (unsigned long long)alone_spine);
        CHECK(!rc && req > 0 && req <= alone_req && loads <= req,
              "%s: the batch asks for each expert of a layer's union once (%llu requests, %llu reads; alone %llu)",
              name, (unsigned long long)req, (unsigned long long)loads, (unsigned long long)alone_req);
    }
    df_batch_free(bt);
    for (int i = 0; i < N_SESS; i++) df_session_free(s[i]);
    df_session_free(c);
    df_engine_free(eng);
}

int main(void) {
    char names[EF_MAX_FIXTURES][256];
    int nf = ef_list_fixtures("tests/fixtures", "config.json", names);
    CHECK(nf >= 0, "tests/fixtures is readable");
    if (nf < 0) TEST_EXIT();
    CHECK(nf >= 7, "found %d fixtures", nf);
    for (int f = 0; f < nf; f++) {
        char dir[512];
        snprintf(dir, sizeof dir, "tests/fixtures/%s", names[f]);
        df_engine *eng = open_engine(dir, "scalar");
        int identical = 0;
        float diff = eng ? run_case(eng, &identical) : INFINITY;
        CHECK(eng && identical, "%s, scalar kernels: batched logits bit-identical to alone (max diff %g)", names[f],
              diff);
        if (eng) check_failures(eng, names[f]);
        diff = eng ? long_prompt_case(eng, &identical) : INFINITY;
        CHECK(eng && identical, "%s, scalar kernels: a long prompt in one pass gives the logits of small passes "
              "bit for bit (max diff %g)", names[f], diff);
        df_engine_free(eng);
        static const char *const exact_isas[] = {"avx512", "avx2"};
        for (int k = 0; k < 2; k++) {
            df_error err = {0};
            if (!(eng = ef_open(dir, exact_isas[k], &err))) {
                printf("# %s: isa %s not available here\n", names[f], exact_isas[k]);
                continue;
            }
            diff = run_case(eng, &identical);
            CHECK(identical, "%s, %s kernels: batched logits bit-identical to alone (max diff %g)", names[f],
                  exact_isas[k], diff);
            diff = long_prompt_case(eng, &identical);
            CHECK(identical, "%s, %s kernels: a long prompt in one pass gives the logits of small passes bit for bit "
                  "(max diff %g)", names[f], exact_isas[k], diff);
            df_engine_free(eng);
        }
        eng = open_engine(dir, NULL);
        diff = eng ? run_case(eng, &identical) : INFINITY;
        CHECK(eng && diff <= BATCH_TOL, "%s, best kernels: batched logits within %g relative of alone (max %g%s)",
              names[f], BATCH_TOL, diff, identical ? ", identical" : "");
        df_engine_free(eng);
    }
    check_reads("kl-mxfp4");
    check_reads("k3-tiny");
    TEST_EXIT();
}
