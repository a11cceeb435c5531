/* test_safetensors.c — the safetensors parser and the store's validation: a valid file gives the right
 * views; every malformed input (truncation, bad header length, offsets, overlaps, dtypes, sizes, JSON,
 * indexes, MXFP4 NaN scales) fails with a status and a message naming the file and the tensor. */
#include <sys/stat.h>
#include "test.h"
#include "st_fixture.h"
#include "residency/expert_index.h"
#include "format/safetensors.h"
#include "residency/store.h"

static char dir[256];

static int has(const char *msg, const char *a, const char *b) {
    return strstr(msg, a) && (!b || strstr(msg, b));
}

/* Opens dir/name with the parser; checks it fails naming the file (and the tensor when given). */
static void expect_file_fail(const char *name, const char *tensor, const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    st_file f;
    df_error err = {0};
    int rc = st_file_open(&f, path, &err);
    CHECK(rc < 0 && has(err.msg, name, tensor), "%s fails naming file%s (%s)", what, tensor ? " and tensor" : "",
          err.msg);
}

static void expect_store_fail(const char *a, const char *b, const char *what) {
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open(&st, dir, &err);
    CHECK(rc < 0 && !st && has(err.msg, a, b), "%s (%s)", what, err.msg);
    store_free(st);
}

static void test_valid(void) {
    float f32[6] = {1, 2, 3, 4, 5, 6};
    uint16_t bf16[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    int64_t i64[2] = {7, -9};
    uint8_t u8[5] = {1, 2, 3, 4, 5};
    double f64[1] = {1.5};
    fx_tensor ts[] = {
        {"b.f32", "F32", 2, {2, 3}, f32, sizeof f32},
        {"a.bf16", "BF16", 1, {4}, bf16, sizeof bf16},
        {"c.i64", "I64", 1, {2}, i64, sizeof i64},
        {"e.f64", "F64", 1, {1}, f64, sizeof f64},
        {"g.scalar", "I32", 0, {0}, (int32_t[]){42}, 4},
        {"f.empty", "F16", 2, {0, 3}, NULL, 0},
        {"d.u8", "U8", 1, {5}, u8, sizeof u8},
    };
    uint64_t offs[7];
    uint64_t hl = fx_write_st(dir, "ok.safetensors", ts, 7, offs);
    char path[512];
    snprintf(path, sizeof path, "%s/ok.safetensors", dir);
    st_file f;
    df_error err = {0};
    int rc = st_file_open(&f, path, &err);
    CHECK(rc == 0, "valid file opens (%s)", err.msg);
    if (rc) return;
    CHECK(f.n_tensors == 7 && f.header_len == hl && f.data_start == 8 + hl, "tensor count and header length");
    const st_tensor *t = st_file_find(&f, "b.f32");
    df_tensor v;
    CHECK(t && st_tensor_view(&f, t, &v, &err) == 0 && v.dtype == DF_DT_F32 && v.ndim == 2 && v.shape[0] == 2 &&
              v.shape[1] == 3 && !memcmp(v.data, f32, sizeof f32) && !strcmp(v.name, "b.f32"),
          "F32 view has the right shape and bytes");
    CHECK(t && st_tensor_offset(&f, t) == offs[0], "absolute offset = 8 + header_len + begin");
    t = st_file_find(&f, "a.bf16");
    CHECK(t && st_tensor_view(&f, t, &v, &err) == 0 && v.dtype == DF_DT_BF16 && !memcmp(v.data, bf16, sizeof bf16) &&
              st_tensor_offset(&f, t) == offs[1],
          "BF16 view");
    t = st_file_find(&f, "c.i64");
    CHECK(t && st_tensor_view(&f, t, &v, &err) == 0 && v.dtype == DF_DT_I64 && ((const int64_t *)v.data)[1] == -9,
          "I64 view");
    t = st_file_find(&f, "g.scalar");
    CHECK(t && st_tensor_view(&f, t, &v, &err) == 0 && v.ndim == 0 && *(const int32_t *)v.data == 42, "0-d tensor");
    t = st_file_find(&f, "f.empty");
    CHECK(t && t->begin == t->end && st_tensor_view(&f, t, &v, &err) == 0, "empty tensor");
    t = st_file_find(&f, "e.f64");
    rc = t ? st_tensor_view(&f, t, &v, &err) : 0;
    CHECK(t && rc < 0 && has(err.msg, "unsupported dtype", "e.f64") && has(err.msg, "ok.safetensors", NULL),
          "F64 parses but its view fails as unsupported dtype (%s)", err.msg);
    CHECK(!st_file_find(&f, "__metadata__") && !st_file_find(&f, "zzz"), "metadata is not a tensor");
    CHECK(f.covered == f.size - f.data_start, "data region fully covered");
    st_file_close(&f);
}

static void test_malformed_files(void) {
    uint8_t data[64] = {0};
    fx_write_file(dir, "short.safetensors", "\x10\0\0", 3);
    expect_file_fail("short.safetensors", NULL, "file shorter than 8 bytes");

    /* hlen 0: the header's own length; header NULL: another check of the file before */
    static const char one[] = "{\"w.one\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    static const struct {
        const char *file, *header;
        uint64_t hlen;
        size_t dlen;
        const char *tensor, *what;
    } cases[] = {
        {"trunc.safetensors", one, 0, 10, "w.one", "truncated data region"},
        {"hlen.safetensors", one, 100000, 16, NULL, "header length past EOF"},
        {"hlen2.safetensors", one, UINT64_MAX, 16, NULL, "absurd header length"},
        {"outside.safetensors", "{\"w.out\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[60,68]}}", 0, 64,
         "w.out", "offsets outside the data region"},
        {"overlap.safetensors", "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"w.b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
         "w.a", "overlapping tensors"},
        {"overlap.safetensors", NULL, 0, 0, "w.b", "overlap names the other tensor too"},
        {"dtype.safetensors", "{\"w.q\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 2, "w.q",
         "unknown dtype"},
        {"mismatch.safetensors", "{\"w.m\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
         "w.m", "shape/bytes mismatch"},
        {"neg.safetensors", "{\"w.neg\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8,
         "w.neg", "negative shape"},
        {"rev.safetensors", "{\"w.rev\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8,
         "w.rev", "begin > end"},
        {"big.safetensors", "{\"w.big\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}",
         0, 8, "w.big", "overflowing shape"},
        {"flt.safetensors", "{\"w.flt\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 0, 8,
         "w.flt", "non-integer shape"},
        {"nooff.safetensors", "{\"w.nooff\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8, "w.nooff",
         "missing data_offsets"},
        {"badjson.safetensors", "{\"w.x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 0, 8, NULL,
         "bad JSON header"},
        {"dup.safetensors", "{\"w.d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"w.d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, 16,
         "w.d", "duplicate tensor name"},
        {"array.safetensors", "[]", 0, 0, NULL, "header not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *h = cases[i].header;
        if (h) fx_write_raw(dir, cases[i].file, cases[i].hlen ? cases[i].hlen : strlen(h), h, data, cases[i].dlen);
        expect_file_fail(cases[i].file, cases[i].tensor, cases[i].what);
    }
}

/* A minimal Kimi-Linear folder with one MoE layer of two MXFP4 experts; `broken` selects one defect. */
enum { OK_FOLDER, NAN_SCALE, BAD_PAIR, MISSING_W3, F64_LAYER };

static void write_moe_folder(int broken) {
    /* w1, w3: [I=32, D=64] → packed [32, 32], scale [32, 2]; w2: [D=64, I=32] → packed [64, 16], scale [64, 1] */
    static uint8_t pk[32][32], sc[32][2], pk2[64][16], sc2[64][1], sc_nan[64][1];
    for (int r = 0; r < 32; r++) sc[r][0] = sc[r][1] = (uint8_t)(110 + r);
    for (int r = 0; r < 64; r++) sc2[r][0] = 127;
    fx_fill(pk, sizeof pk, 1);
    fx_fill(pk2, sizeof pk2, 2);
    memcpy(sc_nan, sc2, sizeof sc_nan);
    sc_nan[13][0] = 0xFF;
    fx_tensor ts[32];
    int n = 0;
    char names[32][96];
    for (int e = 0; e < 2; e++)
        for (int m = 1; m <= 3; m++) {
            if (broken == MISSING_W3 && e == 1 && m == 3) continue;
            int down = m == 2;
            snprintf(names[n], 96, "model.layers.1.block_sparse_moe.experts.%d.w%d.weight_packed", e, m);
            ts[n] = (fx_tensor){names[n], "U8", 2, {down ? 64 : 32, down ? 16 : 32}, down ? (void *)pk2 : (void *)pk,
                                down ? sizeof pk2 : sizeof pk};
            n++;
            snprintf(names[n], 96, "model.layers.1.block_sparse_moe.experts.%d.w%d.weight_scale", e, m);
            ts[n] = (fx_tensor){names[n], "U8", 2, {down ? 64 : 32, down ? 1 : 2}, down ? (void *)sc2 : (void *)sc,
                                down ? sizeof sc2 : sizeof sc};
            if (broken == NAN_SCALE && e == 1 && down) ts[n].data = sc_nan;
            if (broken == BAD_PAIR && e == 1 && m == 1) ts[n] = (fx_tensor){names[n], "U8", 2, {32, 1}, sc, 32};
            n++;
        }
    static double a_log[2] = {1, 2};
    ts[n++] = (fx_tensor){"model.layers.0.self_attn.A_log", broken == F64_LAYER ? "F64" : "U8", 1,
                          {broken == F64_LAYER ? 2 : 16}, a_log, sizeof a_log};
    fx_write_st(dir, "model.safetensors", ts, n, NULL);
    fx_write_text(dir, "config.json", "{\"model_type\":\"kimi_linear\",\"num_hidden_layers\":2}");
}

static void test_store_errors(void) {
    char sub[300];
    snprintf(sub, sizeof sub, "%s/f", dir);
    memcpy(dir, sub, sizeof dir);
    if (mkdir(dir, 0700)) perror("mkdir");

    expect_store_fail("config.json", NULL, "missing config.json fails naming it");
    fx_write_text(dir, "config.json", "{\"model_type\": \"kimi_linear\",");
    expect_store_fail("config.json", NULL, "bad JSON config.json fails naming it");
    fx_write_text(dir, "config.json", "{\"model_type\":\"kimi_linear\",\"num_hidden_layers\":1}");
    expect_store_fail("model.safetensors", NULL, "folder without weights fails");

    fx_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"x.safetensors\"");
    expect_store_fail("model.safetensors.index.json", NULL, "bad JSON index fails naming it");

    fx_write_text(dir, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"model-00009-of-00009.safetensors\"}}");
    expect_store_fail("model.safetensors.index.json", "model-00009-of-00009.safetensors",
                      "index naming a missing shard fails naming index and shard");

    float w[4] = {1, 2, 3, 4};
    fx_tensor one = {"model.norm.weight", "F32", 1, {4}, w, sizeof w};
    fx_write_st(dir, "model-00001-of-00001.safetensors", &one, 1, NULL);
    fx_write_text(dir, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00001.safetensors\","
                  "\"lm_head.weight\": \"model-00001-of-00001.safetensors\"}}");
    expect_store_fail("lm_head.weight", "model-00001-of-00001.safetensors",
                      "tensor in the index but absent from its shard fails naming tensor and shard");

    fx_write_text(dir, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"../escape.safetensors\"}}");
    expect_store_fail("model.safetensors.index.json", "model.norm.weight", "index shard outside the folder rejected");

    fx_write_text(dir, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00001.safetensors\"}}");
    df_store *st = NULL;
    df_error err = {0};
    CHECK(store_open(&st, dir, &err) == 0 && store_global(st, "model.norm.weight"),
          "a one-tensor index opens (%s)", err.msg);
    store_free(st);
    fx_write_raw(dir, "model-00001-of-00001.safetensors", 4, "{\"x\"", NULL, 0);
    expect_store_fail("model-00001-of-00001.safetensors", NULL, "bad JSON in a shard header fails naming the shard");
    char path[400];
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    remove(path);

    write_moe_folder(BAD_PAIR);
    expect_store_fail("model.safetensors", "experts.1.w1.weight_scale", "MXFP4 scale/packed shape disagreement");
    write_moe_folder(MISSING_W3);
    expect_store_fail("model.safetensors", "experts.1.w3", "expert without w3 fails naming it");

    write_moe_folder(NAN_SCALE);
    st = NULL;
    int rc = store_open(&st, dir, &err);
    CHECK(rc == 0, "NaN scale is not checked at open (%s)", err.msg);
    if (!rc) {
        df_expert ex;
        CHECK(store_expert_count(st, 1) == 2 && store_expert_acquire(st, 1, 0, &ex, &err) == 0,
              "clean expert 0 acquires");
        rc = store_expert_acquire(st, 1, 1, &ex, &err);
        CHECK(rc < 0 && has(err.msg, "model.safetensors", "model.layers.1.block_sparse_moe.experts.1.w2.weight_scale"),
              "0xFF scale fails at expert acquire naming file and tensor (%s)", err.msg);
        CHECK(strstr(err.msg, "row 13"), "the error locates the bad block");
        CHECK(store_expert_acquire(st, 1, 1, &ex, &err) < 0, "and keeps failing on the next acquire");
        CHECK(store_expert_acquire(st, 1, 2, &ex, &err) == DF_EINVAL, "expert out of range is EINVAL");
        store_free(st);
    }

    write_moe_folder(F64_LAYER);
    st = NULL;
    rc = store_open(&st, dir, &err);
    CHECK(rc == 0, "an F64 tensor does not fail the open (%s)", err.msg);
    if (!rc) {
        const df_store_layer *l;
        rc = store_layer_acquire(st, 0, &l, &err);
        CHECK(rc < 0 && has(err.msg, "unsupported dtype", "model.layers.0.self_attn.A_log") &&
                  strstr(err.msg, "model.safetensors"),
              "acquiring the layer using it fails as unsupported dtype (%s)", err.msg);
        CHECK(store_layer_acquire(st, 1, &l, &err) == 0, "other layers still acquire");
        char desc[4096] = "";
        store_describe(st, desc, sizeof desc);
        CHECK(strstr(desc, "problem:") && strstr(desc, "A_log"), "describe lists the unsupported tensor");
        store_free(st);
    }
}

int main(void) {
    fx_mkdir("st", dir, sizeof dir);
    char root[256];
    memcpy(root, dir, sizeof root);
    test_valid();
    test_malformed_files();
    test_store_errors();
    fx_rmtree(root);
    TEST_EXIT();
}
