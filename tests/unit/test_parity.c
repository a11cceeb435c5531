/* test_parity.c — the backbone: logits of every fixture in tests/fixtures (made by tools/make_fixtures.py
 * with independent references) reproduced by the engine on every kernel ISA this CPU runs: same argmax at
 * every row and max |Δlogit| <= 2e-4. Also checks that splitting the prefill into two batches gives the
 * same rows (state carried across multi-token batches). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "engine_fixture.h"
#include "kernels/kernels.h"

#define TOL 2e-4f

typedef struct {
    float max_diff;
    int argmax_mismatch;
} cmp_result;

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void cmp_rows(const float *got, const float *want, int rows, int V, cmp_result *r) {
    for (int t = 0; t < rows; t++) {
        const float *g = got + (int64_t)t * V, *w = want + (int64_t)t * V;
        for (int i = 0; i < V; i++) {
            float d = fabsf(g[i] - w[i]);
            if (!(d <= r->max_diff)) r->max_diff = isnan(d) ? INFINITY : d;
        }
        if (argmax(g, V) != argmax(w, V)) r->argmax_mismatch++;
    }
}

/* Runs the fixture with the prefill split at `split` (0 = one batch) and compares every row with want, which
 * must hold exactly (np + nd) rows of the model's vocabulary (want_len bytes). */
static int run_fixture(const char *dir, const char *isa, int split, const float *want, size_t want_len,
                       const int32_t *pre, int np, const int32_t *dec, int nd, cmp_result *r, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, isa);
    int V = 0;
    float *got = ef_logits(&o, pre, np, split, dec, nd, &V, NULL, err);
    if (!got) return err->code ? err->code : DF_EINVAL;   /* never a pass without logits */
    int rc = want_len == (size_t)(np + nd) * V * sizeof(float) ? DF_OK : DF_EFORMAT;
    if (rc)
        df_error_set(err, rc, "%s/logits.f32 has %zu bytes, expected %d rows x %d logits x 4 = %zu", dir, want_len,
                     np + nd, V, (size_t)(np + nd) * V * sizeof(float));
    else
        cmp_rows(got, want, np + nd, V, r);
    free(got);
    return rc;
}

static void check_fixture(const char *dir, const char *name, const ef_prompt *p) {
    char path[2100];
    const int32_t *pre = p->pre, *dec = p->dec;
    int np = p->np, nd = p->nd;
    df_error err = {0};
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    size_t len = 0;
    float *want = (float *)df_read_file(path, &len, &err);
    if (!want) CHECK(0, "%s: %s", name, err.msg);
    const df_kernels *isas[8];
    int n_isa = kern_available(isas, 8);
    for (int i = 0; want && i < n_isa; i++) {
        cmp_result r = {0};
        int rc = run_fixture(dir, isas[i]->isa, 0, want, len, pre, np, dec, nd, &r, &err);
        CHECK(!rc, "%s [%s]: engine runs (%s)", name, isas[i]->isa, rc ? err.msg : "ok");
        CHECK(!rc && r.argmax_mismatch == 0 && r.max_diff <= TOL, "%s [%s]: %d rows, max|dlogit| %.3g, %d argmax "
              "mismatches", name, isas[i]->isa, np + nd, r.max_diff, r.argmax_mismatch);
    }
    if (want && np > 2) {
        cmp_result r = {0};
        int rc = run_fixture(dir, NULL, np / 2 + 1, want, len, pre, np, dec, nd, &r, &err);
        CHECK(!rc && r.argmax_mismatch == 0 && r.max_diff <= TOL, "%s: prefill in two batches matches (max %.3g)%s%s",
              name, r.max_diff, rc ? ": " : "", rc ? err.msg : "");
    }
    free(want);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    int n = ef_each_fixture(root, "logits.f32", check_fixture);
    CHECK(n > 0, "found %d fixtures in %s", n, root);
    TEST_EXIT();
}
