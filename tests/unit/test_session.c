/* test_session.c — the session's own history: df_session_sync reuses what the session already holds and
 * gives the same logits as evaluating the tokens from scratch; df_session_truncate returns to an earlier
 * position as if the later tokens had never been seen; a batch gives each session the logits it gets alone.
 * Run on the bundled model (bit-identical comparisons where the same kernels run on the same rows; a batch
 * changes the row counts of the products, see close()). */
#include <math.h>
#include <string.h>
#include "test.h"
#include "deltafin.h"
#include "common/util.h"

static int same(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

/* Evaluating a prompt in other chunks changes the row counts of the matrix products, and with them the
 * kernels' summation order (AMX from 4 rows): equal within float rounding, not bit for bit. */
static int close(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= 1e-5f)) return 0;
    return 1;
}

/* Logits after ids[0..n) evaluated from scratch, one batch. */
static void fresh(df_engine *eng, const int32_t *ids, int n, float *out) {
    df_error err = {0};
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    df_session_eval(s, ids, n, out, 0, &err);
    df_session_free(s);
}

int main(void) {
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.model_dir = "models/default";
    o.n_threads = 2;
    df_engine *eng = NULL;
    df_error err = {0};
    int rc = df_engine_open(&eng, &o, &err);
    CHECK(rc == DF_OK, "bundled model opens (%s)", err.msg);
    if (rc) TEST_EXIT();
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)(1 + (i * 97) % (V - 1));
    float *want = xmalloc((size_t)V * sizeof(float)), *got = xmalloc((size_t)V * sizeof(float));
    df_session *s = NULL;
    df_session_init(&s, eng, &err);

    int64_t reused = -1, n = 0;
    rc = df_session_sync(s, ids, 20, got, &reused, &err);
    fresh(eng, ids, 20, want);
    CHECK(rc == DF_OK && reused == 0 && same(got, want, V), "sync from empty equals a fresh evaluation");
    const int32_t *h = df_session_tokens(s, &n);
    CHECK(n == 20 && !memcmp(h, ids, 20 * sizeof(int32_t)), "the session holds the tokens it consumed");

    rc = df_session_sync(s, ids, 30, got, &reused, &err);
    fresh(eng, ids, 30, want);
    CHECK(rc == DF_OK && reused == 20 && close(got, want, V), "sync of an extension evaluates only the new part");

    rc = df_session_sync(s, ids, 30, got, &reused, &err);
    CHECK(rc == DF_OK && reused == 30 && close(got, want, V), "sync of the same tokens returns the held logits");

    rc = df_session_sync(s, ids, 25, got, &reused, &err);
    fresh(eng, ids, 25, want);
    CHECK(rc == DF_OK && df_session_pos(s) == 25 && close(got, want, V), "sync of a shorter prefix");

    int32_t alt[30];
    memcpy(alt, ids, sizeof alt);
    alt[28] = ids[5];
    rc = df_session_sync(s, alt, 30, got, &reused, &err);
    fresh(eng, alt, 30, want);
    CHECK(rc == DF_OK && close(got, want, V), "sync of a diverging prompt");

    /* truncate within the last evaluation, then continue: as if the dropped tokens never came */
    df_session_reset(s);
    df_session_eval(s, ids, 10, NULL, 0, &err);
    df_session_eval(s, ids + 10, 8, NULL, 0, &err);
    rc = df_session_truncate(s, 13, &err);
    CHECK(rc == DF_OK && df_session_pos(s) == 13, "truncate inside the last evaluation");
    df_session_eval(s, ids + 30, 4, got, 0, &err);
    int32_t path[17];
    memcpy(path, ids, 13 * sizeof(int32_t));
    memcpy(path + 13, ids + 30, 4 * sizeof(int32_t));
    fresh(eng, path, 17, want);
    CHECK(close(got, want, V), "after truncate the logits equal a session that never saw the dropped tokens");
    rc = df_session_truncate(s, 5, &err);
    CHECK(rc == DF_EINVAL && strstr(err.msg, "position 5"), "truncate before the last evaluation is refused: %s",
          err.msg);

    /* a batch of three sessions at different positions */
    df_session *b[3];
    float *bl[3], *al[3];
    for (int i = 0; i < 3; i++) {
        df_session_init(&b[i], eng, &err);
        df_session_eval(b[i], ids + i, 5 + 3 * i, NULL, 0, &err);
        bl[i] = xmalloc((size_t)V * 2 * sizeof(float));
        al[i] = xmalloc((size_t)V * 2 * sizeof(float));
    }
    df_batch *bt = NULL;
    df_batch_init(&bt, eng, &err);
    for (int i = 0; i < 3; i++) df_batch_add(bt, b[i], ids + 20 + i, 1 + (i == 1), bl[i], 1, &err);
    rc = df_batch_add(bt, b[0], ids, 1, NULL, 0, &err);
    CHECK(rc == DF_EINVAL, "a session twice in one batch is refused");
    rc = df_batch_eval(bt, &err);
    int all_same = rc == DF_OK;
    for (int i = 0; i < 3; i++) {
        df_session *a = NULL;
        df_session_init(&a, eng, &err);
        df_session_eval(a, ids + i, 5 + 3 * i, NULL, 0, &err);
        df_session_eval(a, ids + 20 + i, 1 + (i == 1), al[i], 1, &err);
        all_same = all_same && close(al[i], bl[i], V * (1 + (i == 1)));
        df_session_free(a);
    }
    CHECK(all_same, "each session's logits in a batch equal its logits alone");
    df_batch_free(bt);
    for (int i = 0; i < 3; i++) {
        df_session_free(b[i]);
        free(bl[i]);
        free(al[i]);
    }
    df_session_free(s);
    free(want);
    free(got);
    df_engine_free(eng);
    TEST_EXIT();
}
