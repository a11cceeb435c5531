/* test_snapshot.c — df_session_snapshot_at, on every fixture: one evaluation of a whole prompt leaves in the
 * snapshot session exactly the state a session that evaluated only the prompt's first p tokens has (same
 * tokens, and the same logits bit for bit on every continuation), wherever p falls: inside the first mixer
 * block, on a block boundary, in a later block, at the evaluation's last row, and inside a short evaluation
 * that keeps a rollback record (rebuilt from the record). Scalar kernels, whose sums do not depend on how
 * many rows a product has. Also: a failed pass resets the snapshot session, a bad request is refused. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "test.h"
#include "engine_fixture.h"

static void make_ids(int32_t *ids, int n, int V) {
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)V);
    }
}

/* Logits after ids[0..p) then of ids[p..q) (all rows), evaluated on a fresh session in two evaluations. */
static int reference(df_engine *eng, const int32_t *ids, int p, int q, float *out) {
    df_error err = {0};
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    int rc = df_session_eval(s, ids, p, NULL, 0, &err);
    if (!rc) rc = df_session_eval(s, ids + p, q - p, out, 1, &err);
    df_session_free(s);
    return rc;
}

/* Session a at `start` tokens evaluates ids[start..n) in one call with a snapshot armed at p; the snapshot
 * then continues with ids[p..q). */
static void check_one(df_engine *eng, const char *name, const int32_t *ids, int start, int n, int p, int q) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    float *got = xcalloc((size_t)(q - p) * V, sizeof(float)), *want = xcalloc((size_t)(q - p) * V, sizeof(float));
    df_session *a = NULL, *b = NULL;
    df_session_init(&a, eng, &err);
    df_session_init(&b, eng, &err);
    int rc = start ? df_session_eval(a, ids, start, NULL, 0, &err) : DF_OK;
    if (!rc) rc = df_session_snapshot_at(a, p, b, &err);
    if (!rc) rc = df_session_eval(a, ids + start, n - start, NULL, 0, &err);
    int64_t nt = 0;
    const int32_t *toks = df_session_tokens(b, &nt);
    int hist_ok = !rc && nt == p && !memcmp(toks, ids, (size_t)p * sizeof(int32_t));
    if (!rc) rc = df_session_eval(b, ids + p, q - p, got, 1, &err);
    if (!rc) rc = reference(eng, ids, p, q, want);
    CHECK(!rc && hist_ok && !memcmp(got, want, (size_t)(q - p) * V * sizeof(float)),
          "%s: evaluating %d..%d with a snapshot at %d leaves the state of the first %d tokens (%s)", name, start, n,
          p, p, rc ? err.msg : hist_ok ? "logits differ" : "history differs");
    df_session_free(a);
    df_session_free(b);
    free(got);
    free(want);
}

static void check_failures(df_engine *eng, const char *name, const int32_t *ids) {
    df_error err = {0};
    df_session *a = NULL, *b = NULL;
    df_session_init(&a, eng, &err);
    df_session_init(&b, eng, &err);
    int rc = df_session_eval(b, ids, 5, NULL, 0, &err);
    int32_t bad[3] = {ids[0], df_engine_info(eng)->vocab_size, ids[1]};
    if (!rc) rc = df_session_snapshot_at(a, 2, b, &err);
    int failed = !rc && df_session_eval(a, bad, 3, NULL, 0, &err) != DF_OK;
    CHECK(failed && df_session_pos(a) == 0 && df_session_pos(b) == 0,
          "%s: a refused evaluation leaves the snapshot session reset (pos %lld)", name,
          (long long)df_session_pos(b));
    CHECK(df_session_snapshot_at(a, 1, a, &err) == DF_EINVAL && df_session_snapshot_at(a, 3, NULL, &err) == DF_EINVAL,
          "%s: a snapshot into the session itself or into nothing is refused", name);
    df_session_eval(a, ids, 4, NULL, 0, &err);
    CHECK(df_session_snapshot_at(a, 4, b, &err) == DF_EINVAL && strstr(err.msg, "after 4"),
          "%s: a snapshot at or before the session's position is refused (%s)", name, err.msg);
    df_session_free(a);
    df_session_free(b);
}

int main(void) {
    char names[EF_MAX_FIXTURES][256];
    int nf = ef_list_fixtures("tests/fixtures", "config.json", names);
    CHECK(nf >= 7, "found %d fixtures", nf);
    for (int f = 0; f < nf; f++) {
        char dir[512];
        snprintf(dir, sizeof dir, "tests/fixtures/%s", names[f]);
        df_error err = {0};
        df_engine *eng = ef_open(dir, "scalar", &err);
        CHECK(eng != NULL, "%s opens (%s)", names[f], eng ? "ok" : err.msg);
        if (!eng) continue;
        int n = (int)DF_MIN(300, df_engine_info(eng)->max_context - 8);
        int32_t ids[310];
        make_ids(ids, n + 8, df_engine_info(eng)->vocab_size);
        check_one(eng, names[f], ids, 0, n, 37, n + 4);        /* inside the first mixer block */
        check_one(eng, names[f], ids, 0, n, 256, n + 4);       /* on the block boundary */
        check_one(eng, names[f], ids, 0, n, n - 20, n + 4);    /* in a later block */
        check_one(eng, names[f], ids, 0, n, n, n + 4);         /* at the last row */
        check_one(eng, names[f], ids, 3, 12, 7, 16);           /* a short evaluation: from its rollback record */
        check_one(eng, names[f], ids, 3, 12, 12, 16);
        check_failures(eng, names[f], ids);
        df_engine_free(eng);
    }
    TEST_EXIT();
}
