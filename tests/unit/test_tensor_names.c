/* test_tensor_names.c — the tensor-name table and classifier (every name the table gives a family, which is
 * every name synth writes, classifies back to its kind, layer and expert; names of real checkpoints as the
 * model docs list them; names outside the table are unknown, never filed as spine or expert), the store and
 * fetch plan using it, and the safetensors writer's files read back by the parser, which refuses overlapping
 * and out-of-range offsets in them. */
#include <sys/stat.h>
#include "test.h"
#include "st_fixture.h"
#include "install/fetch_plan.h"
#include "format/safetensors.h"
#include "format/st_write.h"
#include "residency/store.h"
#include "format/tensor_names.h"

static const char *const family_name[TENSOR_FAMILY_COUNT] = {"Kimi-Linear", "K3"};

static void test_table_round_trip(void) {
    for (int f = 0; f < TENSOR_FAMILY_COUNT; f++) {
        int bad = 0, n = 0, absent = 0;
        for (int k = TN_EMBED; k < TN_KIND_COUNT; k++) {
            char name[256];
            int len = tensor_name_format((tensor_kind)k, (tensor_family)f, 3, 17, name, sizeof name);
            if (!tensor_kind_in_family((tensor_kind)k, (tensor_family)f)) {
                absent++;
                if (len != -1) bad++, printf("# %s: kind %d formatted outside its family: %s\n", family_name[f], k, name);
                continue;
            }
            n++;
            int layer, expert;
            tensor_kind kind;
            tensor_class c = tensor_classify(name, (tensor_family)f, &layer, &expert, &kind);
            tensor_class want = tensor_kind_class((tensor_kind)k);
            int ok = len > 0 && c == want && kind == (tensor_kind)k &&
                     layer == (want == TENSOR_TOP ? -1 : 3) && expert == (want == TENSOR_EXPERT ? 17 : -1);
            if (!ok) bad++, printf("# %s: '%s' classified as class %d kind %d layer %d expert %d\n", family_name[f],
                                   name, c, kind, layer, expert);
        }
        CHECK(!bad && n > 40 && absent > 0, "%s: all %d names of the table classify back to their kind, layer and "
              "expert; %d kinds of the other family are refused", family_name[f], n, absent);
    }
    CHECK(!strcmp(tensor_name_suffix(TN_MLA_Q_A), "self_attn.q_a_proj.weight") &&
          !strcmp(tensor_name_suffix(TN_FFN_GATE), "mlp.gate_proj.weight") &&
          !strcmp(tensor_name_suffix(TN_EMBED), "model.embed_tokens.weight") &&
          !strcmp(tensor_name_suffix(tensor_expert_kind(1, TENSOR_PART_SCALE)), "w2.weight_scale"),
          "suffixes: per-layer names after model.layers.{i}., top-level names under the text root, canonical "
          "spelling for the dense FFN");
    CHECK(tensor_family_of("kimi_k3") == TENSOR_FAMILY_K3 && tensor_family_of("kimi_linear") == TENSOR_FAMILY_KIMI_LINEAR,
          "family of model_type");
}

typedef struct name_case {
    const char *name;
    tensor_family fam;
    tensor_class cls;
    tensor_kind kind;
    int layer, expert;
} name_case;

static void test_known_and_unknown(void) {
    const tensor_family KL = TENSOR_FAMILY_KIMI_LINEAR, K3 = TENSOR_FAMILY_K3;
    const name_case cases[] = {
        /* K3 as its checkpoint names them */
        {"language_model.model.layers.1.block_sparse_moe.experts.895.w2.weight_scale", K3, TENSOR_EXPERT,
         tensor_expert_kind(1, TENSOR_PART_SCALE), 1, 895},
        {"language_model.model.layers.92.block_sparse_moe.experts.0.w1.weight_packed", K3, TENSOR_EXPERT,
         tensor_expert_kind(0, TENSOR_PART_PACKED), 92, 0},
        {"language_model.model.layers.0.mlp.gate_proj.weight", K3, TENSOR_SPINE, TN_FFN_GATE, 0, -1},
        {"language_model.model.layers.3.block_sparse_moe.routed_expert_norm.weight", K3, TENSOR_SPINE,
         TN_LATENT_NORM, 3, -1},
        {"language_model.model.layers.7.self_attn.g_proj.weight", K3, TENSOR_SPINE, TN_ATTN_G, 7, -1},
        {"language_model.model.output_attn_res_proj.weight", K3, TENSOR_TOP, TN_OUT_RES_PROJ, -1, -1},
        {"language_model.lm_head.weight", K3, TENSOR_TOP, TN_LM_HEAD, -1, -1},
        {"vision_tower.encoder.blocks.0.wqkv.weight", K3, TENSOR_NON_TEXT, TN_NONE, -1, -1},
        {"model.norm.weight", K3, TENSOR_NON_TEXT, TN_NONE, -1, -1},
        /* Kimi-Linear, including the dense FFN as transformers saves it */
        {"model.layers.0.block_sparse_moe.gate_proj.weight", KL, TENSOR_SPINE, TN_FFN_GATE, 0, -1},
        {"model.layers.0.block_sparse_moe.down_proj.weight", KL, TENSOR_SPINE, TN_FFN_DOWN, 0, -1},
        {"model.layers.5.block_sparse_moe.gate.e_score_correction_bias", KL, TENSOR_SPINE, TN_MOE_BIAS, 5, -1},
        {"model.layers.5.block_sparse_moe.experts.255.w3.weight", KL, TENSOR_EXPERT,
         tensor_expert_kind(2, TENSOR_PART_WEIGHT), 5, 255},
        {"model.layers.2.self_attn.A_log", KL, TENSOR_SPINE, TN_KDA_A_LOG, 2, -1},
        /* unknown: reported by the caller, never filed as spine or expert */
        {"model.layers.0.block_sparse_moe.gate_proj.weight", K3, TENSOR_NON_TEXT, TN_NONE, -1, -1},
        {"language_model.model.layers.0.block_sparse_moe.gate_proj.weight", K3, TENSOR_UNKNOWN, TN_NONE, 0, -1},
        {"model.layers.1.mlp.experts.3.w1.weight", KL, TENSOR_UNKNOWN, TN_NONE, 1, -1},
        {"model.layers.1.mlp.experts.gate_up_proj", KL, TENSOR_UNKNOWN, TN_NONE, 1, -1},
        {"model.layers.1.self_attn.forget_gate.A_log", KL, TENSOR_UNKNOWN, TN_NONE, 1, -1},
        {"model.layers.1.block_sparse_moe.experts.3.w4.weight", KL, TENSOR_UNKNOWN, TN_NONE, 1, 3},
        {"model.layers.1.block_sparse_moe.experts.03.w1.weight", KL, TENSOR_UNKNOWN, TN_NONE, 1, -1},
        {"model.layers.01.input_layernorm.weight", KL, TENSOR_UNKNOWN, TN_NONE, -1, -1},
        {"model.layers.4096.input_layernorm.weight", KL, TENSOR_UNKNOWN, TN_NONE, -1, -1},
        {"model.layers.1.self_attn.g_proj.weight", KL, TENSOR_UNKNOWN, TN_NONE, 1, -1},
        {"language_model.model.norm.weight", KL, TENSOR_UNKNOWN, TN_NONE, -1, -1},
        {"model.layers.2.input_layernorm.weight.extra", KL, TENSOR_UNKNOWN, TN_NONE, 2, -1},
        {"lm_head", KL, TENSOR_UNKNOWN, TN_NONE, -1, -1},
    };
    int bad = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const name_case *t = &cases[i];
        int layer, expert;
        tensor_kind kind;
        tensor_class c = tensor_classify(t->name, t->fam, &layer, &expert, &kind);
        if (c != t->cls || kind != t->kind || layer != t->layer || expert != t->expert)
            bad++, printf("# %s (%s): class %d kind %d layer %d expert %d\n", t->name, family_name[t->fam], c, kind,
                          layer, expert);
    }
    CHECK(!bad, "%d checkpoint names (real ones and near misses) classify as expected", n);
}

static char dir[256];

static void write_kl(const fx_tensor *extra, int n_extra) {
    static float v[4] = {1, 2, 3, 4}, m[16];
    fx_tensor ts[8] = {
        {"model.embed_tokens.weight", "F32", 2, {4, 4}, m, sizeof m},
        {"model.norm.weight", "F32", 1, {4}, v, sizeof v},
        {"model.layers.0.input_layernorm.weight", "F32", 1, {4}, v, sizeof v},
        {"model.layers.0.block_sparse_moe.gate_proj.weight", "F32", 2, {4, 4}, m, sizeof m},
    };
    int n = 4;
    for (int i = 0; i < n_extra; i++) ts[n++] = extra[i];
    fx_write_st(dir, "model.safetensors", ts, n, NULL);
    fx_write_text(dir, "config.json", "{\"model_type\":\"kimi_linear\",\"num_hidden_layers\":1}");
}

static void test_store_names(void) {
    fx_mkdir("tnames", dir, sizeof dir);
    static float v[4];
    fx_tensor unknown = {"model.layers.0.self_attn.forget_gate.A_log", "F32", 1, {4}, v, sizeof v};
    write_kl(&unknown, 1);
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open(&st, dir, &err);
    CHECK(!rc, "a checkpoint with a name outside the table opens (%s)", err.msg);
    if (!rc) {
        char info[8192] = "";
        store_describe(st, info, sizeof info);
        CHECK(strstr(info, "unknown: 1 tensors") && strstr(info, "'model.layers.0.self_attn.forget_gate.A_log' is "
              "not a Kimi-Linear tensor name"), "info reports the unknown name");
        const df_store_layer *l = NULL;
        rc = store_layer_acquire(st, 0, &l, &err);
        CHECK(!rc && l && !store_layer_tensor(l, "self_attn.forget_gate.A_log") &&
              store_layer_tensor(l, "mlp.gate_proj.weight") && !store_layer_tensor(l, "block_sparse_moe.gate_proj.weight"),
              "the unknown tensor is in no table; the dense FFN saved by transformers is served under its canonical "
              "name only");
        if (l) store_layer_release(st, l);
        store_free(st);
    }
    static float m[16];
    fx_tensor both = {"model.layers.0.mlp.gate_proj.weight", "F32", 2, {4, 4}, m, sizeof m};
    write_kl(&both, 1);
    st = NULL;
    rc = store_open(&st, dir, &err);
    CHECK(rc == DF_EFORMAT && !st && strstr(err.msg, "model.layers.0.mlp.gate_proj.weight") &&
          strstr(err.msg, "model.layers.0.block_sparse_moe.gate_proj.weight"),
          "both spellings of one layer tensor are refused naming both (%s)", err.msg);
    store_free(st);
    fx_rmtree(dir);
}

static void test_fetch_plan_names(void) {
    const char *h = "{\"model.layers.1.block_sparse_moe.experts.0.w1.weight\":{\"dtype\":\"U8\",\"shape\":[4],"
                    "\"data_offsets\":[0,4]},\"model.layers.1.mlp.experts.1.w1.weight\":{\"dtype\":\"U8\","
                    "\"shape\":[4],\"data_offsets\":[4,8]}}";
    fplan_layout L;
    df_error err = {0};
    int rc = fplan_layout_parse(&L, "s", h, strlen(h), 8 + strlen(h) + 8, &err);
    uint64_t data = 8 + strlen(h);
    CHECK(!rc && L.n_holes == 1 && L.holes[0].layer == 1 && L.holes[0].expert == 0 && L.holes[0].span.off == data &&
          L.n_runs == 2 && L.runs[0].len == data && L.runs[1].off == data + 4 && L.runs[1].len == 4,
          "fetch plan: a routed expert is a hole; a name outside the table stays with the spine bytes");
    if (!rc) fplan_layout_free(&L);
}

static void test_writer(void) {
    fx_mkdir("stwrite", dir, sizeof dir);
    float a[3] = {1, 2, 3};
    uint16_t b[5] = {1, 2, 3, 4, 5};
    uint8_t c[7] = {9, 8, 7, 6, 5, 4, 3};
    st_write_tensor ts[] = {
        {"w.a", "F32", 1, {3}, sizeof a},
        {"w.b", "BF16", 2, {1, 5}, sizeof b},
        {"w.empty", "F16", 2, {0, 4}, 0},
        {"w.c", "U8", 1, {7}, sizeof c},
    };
    const void *data[] = {a, b, NULL, c};
    const char *meta[] = {"format", "pt", "by", "test", NULL};
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    df_error err = {0};
    int rc = st_write_file(path, ts, data, 4, meta, 64, &err);
    st_file f;
    if (!rc) rc = st_file_open(&f, path, &err);
    CHECK(!rc, "writer's file opens in the parser (%s)", err.msg);
    if (!rc) {
        int ok = f.n_tensors == 4 && f.data_start % 64 == 0 && f.covered == sizeof a + sizeof b + sizeof c;
        for (int i = 0; ok && i < 4; i++) {
            const st_tensor *t = st_file_find(&f, ts[i].name);
            ok = t && !strcmp(t->dtype_name, ts[i].dtype) && t->ndim == ts[i].ndim && t->end - t->begin == ts[i].bytes &&
                 (!ts[i].bytes || !memcmp(t->data, data[i], ts[i].bytes));
            for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == ts[i].shape[d];
        }
        const st_tensor *ta = st_file_find(&f, "w.a"), *tc = st_file_find(&f, "w.c");
        ok = ok && ta && tc && ta->begin == 0 && tc->begin == sizeof a + sizeof b;
        CHECK(ok, "round trip: names, dtypes, shapes, bytes, back-to-back offsets, data region 64-aligned");
        st_file_close(&f);
    }
    st_write_tensor bad_bytes = {"x", "F32", 1, {3}, 8}, bad_dtype = {"x", "Q7", 1, {3}, 3};
    st_write_tensor twice[2] = {{"x", "U8", 1, {1}, 1}, {"x", "U8", 1, {1}, 1}};
    uint8_t *head;
    size_t hl;
    CHECK(st_write_header(&bad_bytes, 1, NULL, 8, &head, &hl, NULL, NULL, &err) == DF_EINVAL &&
          st_write_header(&bad_dtype, 1, NULL, 8, &head, &hl, NULL, NULL, &err) == DF_EINVAL &&
          st_write_header(twice, 2, NULL, 8, &head, &hl, NULL, NULL, &err) == DF_EINVAL &&
          st_write_header(ts, 1, NULL, 12, &head, &hl, NULL, NULL, &err) == DF_EINVAL,
          "writer refuses bytes not matching the shape, an unknown dtype, a name given twice, a bad alignment");

    /* the writer's header with one tensor's offsets moved: the parser must refuse the file */
    st_write_tensor two[2] = {{"p", "F32", 1, {2}, 8}, {"q", "F32", 1, {2}, 8}};
    uint64_t offs[2];
    rc = st_write_header(two, 2, NULL, 8, &head, &hl, offs, NULL, &err);
    CHECK(!rc && offs[0] == 0 && offs[1] == 8, "offsets of the writer's header");
    if (rc) return;
    static const struct { const char *to, *needle, *what; } moves[] = {
        {"[4,12]", "overlaps", "overlapping offsets"},
        {"[9,17]", "outside", "offsets past the data region"},
    };
    uint8_t body[16] = {0};
    for (int i = 0; i < 2; i++) {
        char *json = malloc(hl - 8 + 1);
        memcpy(json, head + 8, hl - 8);
        json[hl - 8] = 0;
        char *at = strstr(json, "[8,16]");
        if (at) memcpy(at, moves[i].to, 6);
        fx_write_raw(dir, "moved.safetensors", hl - 8, json, body, sizeof body);
        snprintf(path, sizeof path, "%s/moved.safetensors", dir);
        memset(&err, 0, sizeof err);
        rc = st_file_open(&f, path, &err);
        CHECK(at && rc == DF_EFORMAT && strstr(err.msg, moves[i].needle) && strstr(err.msg, "moved.safetensors"),
              "parser refuses the writer's file with %s (%s)", moves[i].what, err.msg);
        if (!rc) st_file_close(&f);
        free(json);
    }
    free(head);
    fx_rmtree(dir);
}

int main(void) {
    test_table_round_trip();
    test_known_and_unknown();
    test_store_names();
    test_fetch_plan_names();
    test_writer();
    TEST_EXIT();
}
