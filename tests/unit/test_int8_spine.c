/* test_int8_spine.c — the int8 spine: the per-row quantiser (scale = fp16(max/127), round trip within half a
 * step, zero rows, bad values), the eligibility rule, and end to end on fixtures (written into a temporary
 * folder of symlinks): storage hands out I8 views with their row scales only when asked, a missing sidecar is
 * a clear error, the logits stay close to the checkpoint's and to the fixture reference, and the mapped,
 * streamed and sharded forms of the sidecar give identical logits. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"
#include "st_fixture.h"
#include "format/int8_spine.h"
#include "residency/store.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void test_quantizer(void) {
    enum { N = 1000 };
    float w[N], back[N];
    int8_t q[N];
    int ok_scale = 1, ok_round = 1, ok_peak = 1;
    for (int trial = 0; trial < 50; trial++) {
        float mag = ldexpf(1.0f, trial % 20 - 12);   /* 2^-12 .. 2^7: subnormal fp16 scales included */
        for (int i = 0; i < N; i++) w[i] = frand() * mag;
        float amax = 0;
        for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(w[i]));
        uint16_t h = int8_quantize_row(w, N, q);
        float s = df_f16_to_f32(h);
        ok_scale &= h == df_f32_to_f16(amax / 127.0f);
        df_tensor t = {.dtype = DF_DT_I8, .ndim = 2, .shape = {1, N}, .data = q, .scale = &h};
        tensor_row_f32(&t, 0, back);
        for (int i = 0; i < N; i++) {
            /* half a step, plus what clamping at 127 can cost when fp16 rounded the scale down */
            float bound = s / 2 + fmaxf(0.0f, amax - 127 * s) + 1e-9f;
            ok_round &= fabsf(back[i] - w[i]) <= bound;
            if (fabsf(w[i]) == amax) ok_peak &= abs(q[i]) >= 126;
        }
    }
    CHECK(ok_scale, "quantiser: scale is the fp16 rounding of max|w|/127");
    CHECK(ok_round, "quantiser: every weight dequantises within half a step of itself");
    CHECK(ok_peak, "quantiser: the largest magnitude maps to +-127 (+-126 when fp16 rounded the scale up)");
    for (int i = 0; i < N; i++) w[i] = 0, q[i] = 5;
    CHECK(int8_quantize_row(w, N, q) == 0 && !memchr(q, 5, N) && q[0] == 0, "quantiser: a zero row gets scale 0 "
          "and zero codes");
    w[3] = NAN;
    CHECK(int8_quantize_row(w, N, q) == INT8_BAD_SCALE, "quantiser: NaN is refused");
    w[3] = 1e9f;
    CHECK(int8_quantize_row(w, N, q) == INT8_BAD_SCALE, "quantiser: a scale beyond fp16 is refused");
    w[3] = 0;
    w[7] = -2.0f;
    int8_quantize_row(w, N, q);
    CHECK(q[7] == -127, "quantiser: a lone negative peak maps to -127");
}

static void test_rule(void) {
    int64_t big[2] = {128, 256}, small[2] = {32, 256}, odd[2] = {128, 255};
    CHECK(int8_spine_eligible("model.layers.3.self_attn.q_proj.weight", DF_DT_BF16, 2, big), "rule: q_proj in");
    CHECK(int8_spine_eligible("language_model.lm_head.weight", DF_DT_BF16, 2, big), "rule: K3 lm_head in");
    CHECK(int8_spine_eligible("model.embed_tokens.weight", DF_DT_F32, 2, big), "rule: embedding in");
    CHECK(int8_spine_eligible("model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", DF_DT_BF16, 2, big),
          "rule: shared expert in");
    CHECK(!int8_spine_eligible("model.layers.1.block_sparse_moe.experts.3.w1.weight", DF_DT_BF16, 2, big),
          "rule: routed expert out");
    CHECK(!int8_spine_eligible("model.layers.1.block_sparse_moe.gate.weight", DF_DT_BF16, 2, big), "rule: router out");
    CHECK(!int8_spine_eligible("model.layers.3.self_attn.kv_b_proj.weight", DF_DT_BF16, 2, big), "rule: kv_b out");
    CHECK(!int8_spine_eligible("model.layers.3.self_attn.q_proj.weight", DF_DT_BF16, 2, small), "rule: < 64 rows out");
    CHECK(!int8_spine_eligible("model.layers.3.self_attn.q_proj.weight", DF_DT_BF16, 2, odd), "rule: odd cols out");
    CHECK(!int8_spine_eligible("model.norm.weight", DF_DT_BF16, 1, big), "rule: 1-D out");
    CHECK(!int8_spine_eligible("vision_tower.x.weight", DF_DT_BF16, 2, big), "rule: non-text out");
}

/* ---- end to end on fixtures ---- */

/* Logits of the fixture's prompt (prefill as one batch, then each decode token); caller frees. */
static float *run_logits(const char *dir, const char *fixture, int spine, int stream, int *rows, int *V,
                         df_error *err) {
    char path[1200];
    snprintf(path, sizeof path, "tests/fixtures/%s", fixture);
    int32_t *pre = NULL, *dec = NULL;
    int np = 0, nd = 0;
    if (ef_read_prompt(path, &pre, &np, &dec, &nd, err)) return NULL;
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.spine = spine;
    o.spine_stream = stream;
    float *out = ef_logits(&o, pre, np, 0, dec, nd, V, NULL, err);
    *rows = np + nd;
    free(pre);
    free(dec);
    return out;
}

static double row_kl(const float *a, const float *b, int V) {
    double ma = a[0], mb = b[0], sa = 0, sb = 0, kl = 0;
    for (int i = 1; i < V; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int i = 0; i < V; i++) sa += exp(a[i] - ma), sb += exp(b[i] - mb);
    for (int i = 0; i < V; i++) {
        double la = a[i] - ma - log(sa), lb = b[i] - mb - log(sb);
        kl += exp(la) * (la - lb);
    }
    return kl;
}

static void test_store_views(const char *dir, const char *fixture) {
    df_error err = {0};
    df_store *st = NULL;
    store_opts so = {0};
    so.spine = DF_SPINE_INT8;
    int rc = store_open_ex(&st, dir, &so, &err);
    CHECK(!rc, "%s: store opens with the int8 spine (%s)", fixture, rc ? err.msg : "ok");
    if (rc) return;
    const df_tensor *head = store_global(st, "lm_head.weight"), *norm = store_global(st, "model.norm.weight");
    CHECK(head && head->dtype == DF_DT_I8 && head->scale && head->ndim == 2, "%s: lm_head is an I8 view with scales",
          fixture);
    CHECK(norm && norm->dtype != DF_DT_I8, "%s: the final norm is left as it is (%s)", fixture,
          norm ? tensor_dtype_name(norm->dtype) : "absent");
    const df_store_layer *l = NULL;
    rc = store_layer_acquire(st, 0, &l, &err);
    static const char *const mats[] = {"self_attn.o_proj.weight", "self_attn.q_proj.weight", "mlp.gate_proj.weight",
                                       "mlp.down_proj.weight"};
    const char *which = NULL;
    for (int i = 0; !rc && i < 4 && !which; i++) {
        const df_tensor *t = store_layer_tensor(l, mats[i]);
        if (t && t->dtype == DF_DT_I8 && t->scale) which = mats[i];
    }
    CHECK(which != NULL, "%s: layer 0 serves an I8 view (%s)", fixture, which ? which : "none");
    if (l) store_layer_release(st, l);
    /* dequantised lm_head rows against the checkpoint's: within half a step */
    df_store *ref = NULL;
    int ok = head && store_open(&ref, dir, &err) == DF_OK;
    const df_tensor *h0 = ok ? store_global(ref, "lm_head.weight") : NULL;
    ok = ok && h0 && h0->dtype != DF_DT_I8;
    int64_t cols = ok ? h0->shape[1] : 0;
    float *a = xmalloc(sizeof(float) * (size_t)(cols + 1)), *b = xmalloc(sizeof(float) * (size_t)(cols + 1));
    for (int64_t r = 0; ok && r < h0->shape[0]; r++) {
        tensor_row_f32(h0, r, a);
        tensor_row_f32(head, r, b);
        float s = df_f16_to_f32(((const uint16_t *)head->scale)[r]);
        for (int64_t c = 0; c < cols; c++) ok &= fabsf(a[c] - b[c]) <= s * 0.5f + 1e-6f;
    }
    CHECK(ok, "%s: every lm_head weight of the int8 view is within half a step of the checkpoint's", fixture);
    free(a);
    free(b);
    store_free(ref);
    store_free(st);
}

static void test_fixture(const char *tmp, const char *fixture, double kl_bound) {
    char dir[1024], src[1024];
    snprintf(dir, sizeof dir, "%s/%s", tmp, fixture);
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    int made = !ef_link_model(dir, src);
    CHECK(made, "%s: temporary model folder", fixture);
    if (!made) return;
    df_error err = {0};
    int rows = 0, V = 0;
    float *bf = run_logits(dir, fixture, DF_SPINE_BF16, 0, &rows, &V, &err);
    float *missing = run_logits(dir, fixture, DF_SPINE_INT8, 0, &rows, &V, &err);
    CHECK(!missing && strstr(err.msg, "deltafin quantize"), "%s: --spine int8 without a sidecar fails clearly (%s)",
          fixture, err.msg);
    free(missing);
    int8_write_stats ws;
    int rc = int8_spine_write(dir, 0, NULL, &ws, &err);
    CHECK(!rc && ws.n_quantised > 0 && ws.n_files == 1 && ws.out_bytes < ws.src_bytes, "%s: sidecar written (%d "
          "matrices, %llu -> %llu bytes)", fixture, ws.n_quantised, (unsigned long long)ws.src_bytes,
          (unsigned long long)ws.out_bytes);
    test_store_views(dir, fixture);
    float *bf2 = run_logits(dir, fixture, DF_SPINE_BF16, 0, &rows, &V, &err);
    float *q = run_logits(dir, fixture, DF_SPINE_INT8, 0, &rows, &V, &err);
    float *qs = run_logits(dir, fixture, DF_SPINE_INT8, 1, &rows, &V, &err);
    CHECK(bf && bf2 && !memcmp(bf, bf2, sizeof(float) * (size_t)rows * V), "%s: the default ignores the sidecar "
          "(identical logits)", fixture);
    CHECK(q && qs && !memcmp(q, qs, sizeof(float) * (size_t)rows * V), "%s: int8 spine streamed == mapped", fixture);
    double kl_sum = 0, kl_max = 0, dmax = 0;
    for (int r = 0; bf && q && r < rows; r++) {
        double kl = row_kl(bf + (int64_t)r * V, q + (int64_t)r * V, V);
        kl_sum += kl;
        kl_max = fmax(kl_max, kl);
        for (int i = 0; i < V; i++) dmax = fmax(dmax, fabs(bf[(int64_t)r * V + i] - q[(int64_t)r * V + i]));
    }
    CHECK(bf && q && kl_sum / rows < kl_bound && dmax > 0, "%s: int8 logits close to the checkpoint's: mean KL %.4g "
          "(< %g), max KL %.4g, max |dlogit| %.3g", fixture, kl_sum / (rows ? rows : 1), kl_bound, kl_max, dmax);
    /* sharded: one matrix per shard plus an index; the same bytes, so the same logits */
    rc = int8_spine_write(dir, 1, NULL, &ws, &err);
    char idx[1300];
    snprintf(idx, sizeof idx, "%s/%s", dir, INT8_SPINE_INDEX);
    float *qsh = rc ? NULL : run_logits(dir, fixture, DF_SPINE_INT8, 0, &rows, &V, &err);
    CHECK(!rc && ws.n_files == ws.n_quantised && access(idx, F_OK) == 0 && qsh && q &&
          !memcmp(q, qsh, sizeof(float) * (size_t)rows * V), "%s: sharded sidecar (%d files + index) gives the same "
          "logits", fixture, ws.n_files);
    rc = int8_spine_write(dir, 0, NULL, &ws, &err);
    CHECK(!rc && access(idx, F_OK) != 0, "%s: rewriting as one file removes the old shards' index", fixture);
    free(qsh);
    free(bf);
    free(bf2);
    free(q);
    free(qs);
    fx_rmtree(dir);
}

static int copy_into(const char *from, const char *to) {
    size_t n = 0;
    df_error e = {0};
    char *b = df_read_file(from, &n, &e);
    FILE *f = b ? fopen(to, "wb") : NULL;
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f) fclose(f);
    free(b);
    return ok ? 0 : -1;
}

/* What `deltafin info` prints for dir (problems included), opened with the given spine; NULL with err set when
 * the open fails. */
static char *describe(const char *dir, int spine, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.spine = spine;
    df_engine *eng = NULL;
    if (df_engine_open(&eng, &o, err)) return NULL;
    char *buf = xmalloc(1 << 16);
    df_engine_describe(eng, buf, 1 << 16);
    df_engine_free(eng);
    return buf;
}

/* A sidecar made from other weights: the checkpoint's tensors change under the same names, shapes and dtypes
 * (each quantised matrix in turn gets new values in every row). The
 * int8 spine then refuses to open, naming the sidecar, and `info` without it reports the sidecar as stale; the
 * same bytes rewritten (a new modification time) are still the same weights. */
static void test_stale(const char *tmp, const char *fixture) {
    char dir[1024], src[1024], from[1100], st_path[1100];
    snprintf(dir, sizeof dir, "%s/stale-%s", tmp, fixture);
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    mkdir(dir, 0755);
    snprintf(from, sizeof from, "%s/config.json", src);
    snprintf(st_path, sizeof st_path, "%s/config.json", dir);
    int ok = !copy_into(from, st_path);
    snprintf(from, sizeof from, "%s/model.safetensors", src);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    ok = ok && !copy_into(from, st_path);
    int8_write_stats ws;
    df_error err = {0};
    char victim[1100], planted[1200];   /* a symlink where the old predictable temp name was */
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(planted, sizeof planted, "%s/%s.tmp", dir, INT8_SPINE_FILE);
    FILE *vf = fopen(victim, "wb");
    if (vf) fputs("precious", vf), fclose(vf);
    int linked = !symlink(victim, planted);
    ok = ok && !int8_spine_write(dir, 0, NULL, &ws, &err);
    size_t vn = 0;
    char *vb = df_read_file(victim, &vn, &err);
    CHECK(ok && linked && vb && vn == 8, "%s: the sidecar is written through an exclusive temp file, not a planted "
          "symlink (%zu bytes left in the victim)", fixture, vn);
    free(vb);
    unlink(planted);
    unlink(victim);
    char *d = ok ? describe(dir, DF_SPINE_INT8, &err) : NULL;
    CHECK(d && !strstr(d, "problem: "), "%s: a fresh sidecar opens and info finds no problem (%s)", fixture,
          d ? "ok" : err.msg);
    free(d);
    st_file ck;
    if (!ok || st_file_open(&ck, st_path, &err)) {
        CHECK(0, "%s: stale setup: %s", fixture, err.msg);
        return;
    }
    int cases = 0, refused = 0, reported = 0;
    for (int i = 0; i < ck.n_tensors; i++) {
        const st_tensor *t = &ck.tensors[i];
        if (!int8_spine_eligible(t->name, t->dtype, t->ndim, t->shape)) continue;
        uint64_t row = (t->end - t->begin) / (uint64_t)t->shape[0];
        int fd = open(st_path, O_RDWR);
        int flipped = fd >= 0;   /* new weights for this matrix: a bit of every row changed */
        for (int64_t r = 0; flipped && r < t->shape[0]; r++) {
            uint64_t at = st_tensor_offset(&ck, t) + (uint64_t)r * row + (uint64_t)(r % (int64_t)row);
            uint8_t b = 0;
            flipped = pread(fd, &b, 1, (off_t)at) == 1 && (b ^= 0x10, pwrite(fd, &b, 1, (off_t)at) == 1);
        }
        cases++;
        err = (df_error){0};
        d = describe(dir, DF_SPINE_INT8, &err);
        refused += flipped && !d && strstr(err.msg, INT8_SPINE_FILE) && strstr(err.msg, "other weights");
        free(d);
        d = describe(dir, DF_SPINE_BF16, &err);
        reported += d && strstr(d, "problem: ") && strstr(d, INT8_SPINE_FILE);
        free(d);
        for (int64_t r = 0; flipped && r < t->shape[0]; r++) {   /* back as it was */
            uint64_t at = st_tensor_offset(&ck, t) + (uint64_t)r * row + (uint64_t)(r % (int64_t)row);
            uint8_t b = 0;
            if (pread(fd, &b, 1, (off_t)at) != 1 || (b ^= 0x10, pwrite(fd, &b, 1, (off_t)at) != 1)) cases = -1000;
        }
        if (fd >= 0) close(fd);
    }
    CHECK(cases > 0 && refused == cases && reported == cases, "%s: %d quantised matrices changed in turn: the int8 "
          "spine refused %d times naming the sidecar, info reported it %d times", fixture, cases, refused, reported);
    struct timespec ts[2] = {{1000000000, 0}, {1000000000, 0}};
    utimensat(AT_FDCWD, st_path, ts, 0);
    d = describe(dir, DF_SPINE_INT8, &err);
    CHECK(d != NULL, "%s: the same weights under a new modification time still match their sidecar (%s)", fixture,
          d ? "ok" : err.msg);
    free(d);
    st_file_close(&ck);
    fx_rmtree(dir);
}

int main(void) {
    test_quantizer();
    test_rule();
    char tmp[] = "/tmp/df_int8_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        TEST_EXIT();
    }
    /* random tiny fixtures have flat logits, so the bound is loose; the bundled model's is in test_int8_cli.sh */
    test_fixture(tmp, "kl-bf16", 0.1);
    test_fixture(tmp, "k3-tiny-bf16", 0.1);
    test_fixture(tmp, "kl-fp32", 0.1);
    test_stale(tmp, "kl-bf16");
    test_stale(tmp, "k3-tiny-bf16");
    rmdir(tmp);
    TEST_EXIT();
}
