/* test_rollback.c — df_session_truncate after a verify pass (speculation rollback) returns the session to the
 * accepted prefix without weight reads (counted in df_stats) and leaves a state identical to a session that
 * never saw the rejected tokens: with the scalar kernels the saved state files (history, KDA and conv
 * states, MLA caches) are byte-identical and continuations bit-identical; with this CPU's best kernels the
 * continuations agree within float rounding (the verify pass's products had more rows). On every fixture. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"

enum { PREFIX = 7, VERIFY = 5 };

static void make_ids(int32_t *ids, int n, int V) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(1 + ((i + 3) * 53) % (V - 1));
}

/* The two sessions' saved states are byte-identical. */
static int same_state(const df_session *a, const df_session *b) {
    char pa[64], pb[64];
    snprintf(pa, sizeof pa, "/tmp/df_rollback_a_%d", (int)getpid());
    snprintf(pb, sizeof pb, "/tmp/df_rollback_b_%d", (int)getpid());
    df_error err = {0};
    size_t na = 0, nb = 0;
    int ok = !df_session_save(a, pa, &err) && !df_session_save(b, pb, &err);
    char *ba = ok ? df_read_file(pa, &na, &err) : NULL, *bb = ok ? df_read_file(pb, &nb, &err) : NULL;
    ok = ba && bb && na == nb && na > 0 && !memcmp(ba, bb, na);
    free(ba);
    free(bb);
    unlink(pa);
    unlink(pb);
    return ok;
}

/* Accepting `keep` of the VERIFY drafted tokens: the rolled-back session against one that evaluated the
 * prefix and then only the accepted tokens. Returns the relative logit difference of the continuation
 * (INFINITY on error); *state_same gets whether the states are byte-identical. */
static float check_accept(df_engine *eng, const int32_t *ids, int keep, int via_batch, int *state_same) {
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    df_session *s = NULL, *r = NULL, *other = NULL;
    df_session_init(&s, eng, &err);
    df_session_init(&r, eng, &err);
    float *verify = xmalloc((size_t)VERIFY * V * sizeof(float));
    float *got = xmalloc((size_t)V * sizeof(float)), *want = xmalloc((size_t)V * sizeof(float));
    int rc = df_session_eval(s, ids, PREFIX, NULL, 0, &err);
    if (via_batch) {             /* the verify rows ride in a batch beside another session's prompt */
        df_batch *b = NULL;
        df_session_init(&other, eng, &err);
        df_batch_init(&b, eng, &err);
        df_batch_add(b, other, ids + 20, 6, NULL, 0, &err);
        df_batch_add(b, s, ids + PREFIX, VERIFY, verify, 1, &err);
        if (!rc) rc = df_batch_eval(b, &err);
        df_batch_free(b);
    } else if (!rc) {
        rc = df_session_eval(s, ids + PREFIX, VERIFY, verify, 1, &err);
    }
    if (!rc) rc = df_session_truncate(s, PREFIX + keep, &err);
    if (!rc) rc = df_session_eval(r, ids, PREFIX, NULL, 0, &err);
    /* keeping every drafted token truncates nothing: s still holds the verify pass's last logits */
    if (!rc && keep) rc = df_session_eval(r, ids + PREFIX, keep, keep == VERIFY ? want : NULL, 0, &err);
    *state_same = !rc && same_state(s, r);
    if (!rc) rc = df_session_eval(s, ids + 30, 1, got, 0, &err);
    if (!rc) rc = df_session_eval(r, ids + 30, 1, want, 0, &err);
    float d = rc ? INFINITY : ef_rel_diff(got, want, V);
    if (rc) printf("# error: %s\n", err.msg);
    df_session_free(s);
    df_session_free(r);
    df_session_free(other);
    free(verify);
    free(got);
    free(want);
    return d;
}

static void run_fixture(const char *name, const char *isa) {
    char dir[512];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    df_error err = {0};
    df_engine *eng = ef_open(dir, isa, &err);
    if (!eng) {
        CHECK(0, "%s opens: %s", name, err.msg);
        return;
    }
    int V = df_engine_info(eng)->vocab_size, exact = isa && !strcmp(isa, "scalar");
    int32_t ids[40];
    make_ids(ids, 40, V);
    df_stats st0, st1;
    df_engine_stats(eng, &st0);
    float worst = 0.0f;
    int all_same = 1, cases = 0;
    for (int via_batch = 0; via_batch < 2; via_batch++)
        for (int keep = 0; keep <= VERIFY; keep += via_batch ? 2 : 1) {
            int same = 0;
            float d = check_accept(eng, ids, keep, via_batch, &same);
            if (d > worst) worst = d;
            all_same &= same;
            cases++;
        }
    df_engine_stats(eng, &st1);
    CHECK(st1.rollback_replays - st0.rollback_replays == (uint64_t)cases - 1 &&
              st1.rollback_reevals == st0.rollback_reevals,
          "%s (%s): %d rollbacks replayed, none evaluated again", name, isa ? isa : "best", cases - 1);
    if (exact)
        CHECK(all_same && worst == 0.0f, "%s (scalar): rolled-back state byte-identical to never having seen the "
              "rejected tokens, continuation bit-identical", name);
    else
        CHECK(worst <= 1e-6f, "%s (best kernels): continuation after rollback within 1e-6 relative (%g)", name,
              worst);
    df_engine_free(eng);
}

/* Truncating twice within one record, past a record-less evaluation, and with the record switched off. */
static void run_edges(void) {
    df_error err = {0};
    df_engine *eng = ef_open("tests/fixtures/kl-fp32", "scalar", &err);
    if (!eng) {
        CHECK(0, "kl-fp32 opens: %s", err.msg);
        return;
    }
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[40];
    make_ids(ids, 40, V);
    df_session *s = NULL, *r = NULL;
    df_session_init(&s, eng, &err);
    df_session_init(&r, eng, &err);
    df_session_eval(s, ids, 6, NULL, 0, &err);
    df_session_eval(s, ids + 6, 8, NULL, 0, &err);
    int rc = df_session_truncate(s, 12, &err);
    if (!rc) rc = df_session_truncate(s, 8, &err);
    df_session_eval(r, ids, 6, NULL, 0, &err);
    df_session_eval(r, ids + 6, 2, NULL, 0, &err);
    CHECK(!rc && same_state(s, r), "two truncations within one evaluation");
    rc = df_session_truncate(s, 10, &err);
    CHECK(rc == DF_EINVAL, "truncate forward is refused: %s", err.msg);

    df_stats a, b;
    uint64_t with_record = df_session_memory(s);
    df_session_set_rollback_rows(s, 0);
    uint64_t without = df_session_memory(s);
    CHECK(without < with_record, "the record counts in the session's memory (%llu -> %llu bytes)",
          (unsigned long long)with_record, (unsigned long long)without);
    /* the largest evaluation that kept a record had 8 rows: the estimate's share for it is what it held */
    int64_t pos = df_session_pos(s);
    uint64_t est = df_session_state_bytes(eng, pos, 8) - df_session_state_bytes(eng, pos, 0);
    CHECK(est == with_record - without && df_session_state_bytes(eng, pos, 1) == df_session_state_bytes(eng, pos, 0),
          "df_session_state_bytes counts an 8-row rollback record as held (%llu bytes), a 1-row one as none",
          (unsigned long long)est);
    df_session_eval(s, ids + 8, 3, NULL, 0, &err);
    df_engine_stats(eng, &a);
    rc = df_session_truncate(s, 9, &err);
    df_engine_stats(eng, &b);
    df_session_eval(r, ids + 8, 1, NULL, 0, &err);
    CHECK(!rc && b.rollback_reevals == a.rollback_reevals + 1 && df_session_pos(s) == 9,
          "without a record, truncate evaluates the history again");
    df_session_free(s);
    df_session_free(r);
    df_engine_free(eng);
}

int main(void) {
    char names[EF_MAX_FIXTURES][256];
    int n = ef_list_fixtures("tests/fixtures", "config.json", names);
    CHECK(n >= 0, "tests/fixtures is readable");
    if (n < 0) TEST_EXIT();
    for (int i = 0; i < n; i++) {
        run_fixture(names[i], "scalar");
        run_fixture(names[i], NULL);
    }
    run_edges();
    TEST_EXIT();
}
