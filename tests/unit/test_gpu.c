/* test_gpu.c — the GPU backend through the public API. Without a usable GPU (CI): --gpu N fails the open with the
 * reason, auto runs on the CPU and says why. With one: every fixture's logits on the GPU against the CPU's (same
 * argmax, max |dlogit| <= 2e-4), a batch equal to its sessions alone, a session saved from the GPU and loaded on
 * the CPU going on the same, a truncate back, and a budget too small refused naming both sizes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "engine_fixture.h"

#define TOL 2e-4f

static const char *gpu_id(void) {
    const char *g = getenv("DELTAFIN_GPU");
    return g && *g && strcmp(g, "off") && strcmp(g, "auto") ? g : "0";
}

static df_engine *open_on(const char *dir, const char *gpu, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.gpu = gpu;
    df_engine *e = NULL;
    return df_engine_open(&e, &o, err) ? NULL : e;
}

static int on_gpu(df_engine *e) {
    static char buf[1 << 16];
    df_engine_describe(e, buf, sizeof buf);
    return strstr(buf, "gpu: not used") == NULL && strstr(buf, "gpu: ") != NULL;
}

static float max_diff(const float *a, const float *b, int64_t n, int V, int *argmax_bad) {
    float m = 0.0f;
    *argmax_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    for (int64_t r = 0; r < n / V; r++) {
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            if (a[r * V + i] > a[r * V + ia]) ia = i;
            if (b[r * V + i] > b[r * V + ib]) ib = i;
        }
        *argmax_bad += ia != ib;
    }
    return m;
}

static void fixture_cpu_vs_gpu(const char *dir, const char *name, const ef_prompt *p) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    df_error err = {0};
    int V = 0, V2 = 0, bad = 0;
    o.gpu = "off";
    float *cpu = ef_logits(&o, p->pre, p->np, 0, p->dec, p->nd, &V, NULL, &err);
    o.gpu = gpu_id();
    float *gpu = ef_logits(&o, p->pre, p->np, 0, p->dec, p->nd, &V2, NULL, &err);
    CHECK(cpu && gpu && V == V2, "%s: runs on CPU and GPU (%s)", name, err.msg);
    if (cpu && gpu) {
        float d = max_diff(gpu, cpu, (int64_t)(p->np + p->nd) * V, V, &bad);
        CHECK(d <= TOL && !bad, "%s: GPU logits vs CPU: max |dlogit| %.3g, %d argmax mismatches over %d rows", name, d,
              bad, p->np + p->nd);
    }
    free(cpu);
    free(gpu);
}

static void test_batch_and_state(const char *dir) {
    df_error err = {0};
    df_engine *e = open_on(dir, gpu_id(), &err), *c = open_on(dir, "off", &err);
    CHECK(e && c, "open %s on the GPU and the CPU (%s)", dir, err.msg);
    if (!e || !c) {
        df_engine_free(e);
        df_engine_free(c);
        return;
    }
    int V = df_engine_info(e)->vocab_size;
    int32_t pr[3][5] = {{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}, {11, 12, 13, 14, 15}};
    df_session *s[3], *a[3];
    float *lb = calloc((size_t)3 * V, sizeof(float)), *la = calloc((size_t)3 * V, sizeof(float));
    for (int i = 0; i < 3; i++) {
        df_session_init(&s[i], e, &err);
        df_session_init(&a[i], e, &err);
        df_session_eval(s[i], pr[i], 4, NULL, 0, &err);
        df_session_eval(a[i], pr[i], 4, NULL, 0, &err);
    }
    df_batch *b;
    df_batch_init(&b, e, &err);
    for (int i = 0; i < 3; i++) df_batch_add(b, s[i], &pr[i][4], 1, lb + (int64_t)i * V, 0, &err);
    int rc = df_batch_eval(b, &err);
    for (int i = 0; i < 3; i++) df_session_eval(a[i], &pr[i][4], 1, la + (int64_t)i * V, 0, &err);
    int bad;
    float d = max_diff(lb, la, 3 * (int64_t)V, V, &bad);
    CHECK(!rc && d <= 1e-5f && !bad, "a batch of 3 equals its sessions alone on the GPU (max %.3g)", d);
    /* save on the GPU, load on the CPU: the next token's logits agree */
    char path[] = "/tmp/df_gpu_sessXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    df_session *cs;
    df_session_init(&cs, c, &err);
    rc = df_session_save(a[0], path, &err);
    if (!rc) rc = df_session_load(cs, path, &err);
    int32_t nx = 42;
    float *g1 = calloc(V, sizeof(float)), *c1 = calloc(V, sizeof(float));
    if (!rc) rc = df_session_eval(a[0], &nx, 1, g1, 0, &err);
    if (!rc) rc = df_session_eval(cs, &nx, 1, c1, 0, &err);
    d = max_diff(g1, c1, V, V, &bad);
    CHECK(!rc && d <= TOL && !bad, "a GPU session saved and loaded on the CPU goes on the same (max %.3g) %s", d, err.msg);
    /* and back: the CPU's state loaded on the GPU */
    rc = df_session_save(cs, path, &err);
    df_session *gs;
    df_session_init(&gs, e, &err);
    if (!rc) rc = df_session_load(gs, path, &err);
    if (!rc) rc = df_session_eval(gs, &nx, 1, g1, 0, &err);
    if (!rc) rc = df_session_eval(cs, &nx, 1, c1, 0, &err);
    d = max_diff(g1, c1, V, V, &bad);
    CHECK(!rc && d <= TOL && !bad, "a CPU session loaded on the GPU goes on the same (max %.3g) %s", d, err.msg);
    unlink(path);
    /* truncate within the rollback record, then evaluate again: as if never evaluated */
    int32_t seq[6] = {3, 1, 4, 1, 5, 9};
    df_session *t1, *t2;
    df_session_init(&t1, e, &err);
    df_session_init(&t2, e, &err);
    rc = df_session_eval(t1, seq, 6, NULL, 0, &err);
    if (!rc) rc = df_session_truncate(t1, 3, &err);
    if (!rc) rc = df_session_eval(t1, &seq[3], 1, g1, 0, &err);
    if (!rc) rc = df_session_eval(t2, seq, 4, c1, 0, &err);
    d = max_diff(g1, c1, V, V, &bad);
    CHECK(!rc && d <= 1e-5f && !bad, "truncate on the GPU then evaluate equals never having gone further (max %.3g)", d);
    df_session_free(t1);
    df_session_free(t2);
    df_session_free(gs);
    df_session_free(cs);
    free(g1);
    free(c1);
    df_batch_free(b);
    for (int i = 0; i < 3; i++) {
        df_session_free(s[i]);
        df_session_free(a[i]);
    }
    free(lb);
    free(la);
    df_engine_free(e);
    df_engine_free(c);
}

static void test_budget(const char *dir) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.gpu = gpu_id();
    o.gpu_mem = 1 << 20;
    df_engine *e = NULL;
    df_error err = {0};
    int rc = df_engine_open(&e, &o, &err);
    CHECK(rc && strstr(err.msg, "needs") && strstr(err.msg, "budget"), "a GPU budget too small is refused naming both "
          "sizes (%s)", err.msg);
    df_engine_free(e);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    df_error err = {0};
    df_engine *e = open_on("models/default", gpu_id(), &err);
    if (!e) {
        CHECK(strstr(err.msg, "--gpu") && (strstr(err.msg, "driver") || strstr(err.msg, "GPU") || strstr(err.msg, "NVRTC")),
              "without a usable GPU, --gpu %s fails the open with the reason (%s)", gpu_id(), err.msg);
        df_engine *a = open_on("models/default", "auto", &err);
        CHECK(a && !on_gpu(a), "--gpu auto runs on the CPU and says why (%s)", a ? "ok" : err.msg);
        df_engine_free(a);
        SKIP("no usable GPU here", "GPU logits, batches, sessions and budget");
        TEST_EXIT();
    }
    CHECK(on_gpu(e), "--gpu %s runs on the GPU", gpu_id());
    df_engine_free(e);
    ef_each_fixture(root, "logits.f32", fixture_cpu_vs_gpu);
    test_batch_and_state("models/default");
    test_budget("models/default");
    TEST_EXIT();
}
