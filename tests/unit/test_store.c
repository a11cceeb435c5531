/* test_store.c — the storage seam over sharded folders: a K3-layout checkpoint (language_model. prefix,
 * MXFP4 experts in string order, vision tensors to ignore) and a Kimi-Linear one (bf16 experts, HF layer-0
 * naming quirk, one non-contiguous expert, one misaligned tensor). Checks name resolution, views against
 * the bytes written, and the expert index against the file. */
#include <fcntl.h>
#include <unistd.h>
#include "test.h"
#include "st_fixture.h"
#include "residency/budget.h"
#include "residency/expert_index.h"
#include "residency/store.h"

#define NE 11         /* experts in the K3 MoE layer: enough for string order 0, 1, 10, 2, ... */
#define I_ 32
#define D_ 64

typedef struct k3_expert {
    uint8_t p1[I_][D_ / 2], s1[I_][D_ / 32], p2[D_][I_ / 2], s2[D_][I_ / 32], p3[I_][D_ / 2], s3[I_][D_ / 32];
} k3_expert;

static k3_expert kx[NE];
static uint64_t kx_off[NE];     /* expected absolute offset of each expert's span */
static uint16_t k_embed[16][D_], k_head[16][D_], k_gate0[I_][D_], k_router[NE][D_], k_q2[D_][D_];
static float k_norm[D_], k_ln0[D_], k_vision[32];

static void print_comment(const char *text) {
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        int n = nl ? (int)(nl - p) : (int)strlen(p);
        printf("# %.*s\n", n, p);
        p += n + (nl != NULL);
    }
}

static int pread_equals(const char *path, uint64_t off, const void *want, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    uint8_t *buf = malloc(n);
    int ok = pread(fd, buf, n, (off_t)off) == (ssize_t)n && !memcmp(buf, want, n);
    free(buf);
    close(fd);
    return ok;
}

static void write_k3(const char *dir) {
    fx_fill(k_embed, sizeof k_embed, 10);
    fx_fill(k_head, sizeof k_head, 11);
    fx_fill(k_gate0, sizeof k_gate0, 12);
    fx_fill(k_router, sizeof k_router, 13);
    fx_fill(k_q2, sizeof k_q2, 14);
    for (int i = 0; i < D_; i++) k_norm[i] = 1.0f + i, k_ln0[i] = 0.5f * i;
    fx_tensor a[] = {
        {"language_model.model.embed_tokens.weight", "BF16", 2, {16, D_}, k_embed, sizeof k_embed},
        {"language_model.model.norm.weight", "F32", 1, {D_}, k_norm, sizeof k_norm},
        {"vision_tower.encoder.patch_embed.weight", "F32", 5, {2, 2, 2, 2, 2}, k_vision, sizeof k_vision},
        {"language_model.model.layers.0.input_layernorm.weight", "F32", 1, {D_}, k_ln0, sizeof k_ln0},
        {"language_model.model.layers.0.mlp.gate_proj.weight", "BF16", 2, {I_, D_}, k_gate0, sizeof k_gate0},
    };
    fx_write_st(dir, "model-00001-of-00002.safetensors", a, 5, NULL);

    fx_tensor b[8 + NE * 6];
    static char names[NE * 6][96];
    int n = 0;
    b[n++] = (fx_tensor){"language_model.lm_head.weight", "BF16", 2, {16, D_}, k_head, sizeof k_head};
    b[n++] = (fx_tensor){"language_model.model.layers.1.block_sparse_moe.gate.weight", "BF16", 2, {NE, D_}, k_router,
                         sizeof k_router};
    int first[NE];
    /* experts in the string order of their ids, as in the published shards */
    static const int order[NE] = {0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9};
    for (int i = 0; i < NE; i++) {
        int e = order[i];
        k3_expert *x = &kx[e];
        fx_fill(x, sizeof *x, 100u + (uint32_t)e);
        for (int r = 0; r < I_; r++) x->s1[r][0] = x->s1[r][1] = x->s3[r][0] = x->s3[r][1] = (uint8_t)(100 + (e + r) % 20);
        for (int r = 0; r < D_; r++) x->s2[r][0] = (uint8_t)(110 + (e + r) % 15);
        struct { const char *m, *k; int r, c; const void *d; size_t nb; } parts[6] = {
            {"w1", "weight_packed", I_, D_ / 2, x->p1, sizeof x->p1}, {"w1", "weight_scale", I_, D_ / 32, x->s1, sizeof x->s1},
            {"w2", "weight_packed", D_, I_ / 2, x->p2, sizeof x->p2}, {"w2", "weight_scale", D_, I_ / 32, x->s2, sizeof x->s2},
            {"w3", "weight_packed", I_, D_ / 2, x->p3, sizeof x->p3}, {"w3", "weight_scale", I_, D_ / 32, x->s3, sizeof x->s3},
        };
        first[e] = n;
        for (int j = 0; j < 6; j++) {
            int pj = e == 10 ? 5 - j : j;   /* expert 10 stores its tensors in reverse: still one span */
            char *nm = names[e * 6 + j];
            snprintf(nm, 96, "language_model.model.layers.1.block_sparse_moe.experts.%d.%s.%s", e, parts[pj].m,
                     parts[pj].k);
            b[n++] = (fx_tensor){nm, "U8", 2, {parts[pj].r, parts[pj].c}, parts[pj].d, parts[pj].nb};
        }
    }
    b[n++] = (fx_tensor){"language_model.model.layers.2.self_attn.q_proj.weight", "BF16", 2, {D_, D_}, k_q2,
                         sizeof k_q2};
    b[n++] = (fx_tensor){"multi_modal_projector.linear_1.weight", "F32", 1, {4}, k_norm, 16};
    uint64_t offs[8 + NE * 6];
    fx_write_st(dir, "model-00002-of-00002.safetensors", b, n, offs);
    for (int e = 0; e < NE; e++) kx_off[e] = offs[first[e]];

    /* the index */
    size_t cap = 64 * 1024, len = 0;
    char *idx = malloc(cap);
    len += (size_t)snprintf(idx + len, cap - len, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (int i = 0; i < 5; i++)
        len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\":\"model-00001-of-00002.safetensors\"", i ? "," : "",
                                a[i].name);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(idx + len, cap - len, ",\"%s\":\"model-00002-of-00002.safetensors\"", b[i].name);
    snprintf(idx + len, cap - len, "}}");
    fx_write_text(dir, "model.safetensors.index.json", idx);
    free(idx);
    fx_write_text(dir, "config.json",
                  "{\"model_type\":\"kimi_k3\",\"vision_config\":{\"depth\":2},"
                  "\"text_config\":{\"model_type\":\"kimi_k3\",\"num_hidden_layers\":3}}");
}

static int range_is(const warm_range *r, const df_tensor *t, size_t n) { return t && r->p == t->data && r->n == n; }

/* Preloading reads every mapped spine tensor, layer by layer and in file order within one, then the top-level
 * ones (lm_head, the final norm) but the embedding; no expert span (experts are read into cache slots). */
static void check_preload(df_store *st) {
    const df_store_layer *l[3];
    df_error err;
    for (int i = 0; i < 3; i++) store_layer_table(st, i, &l[i], &err);
    warm_range *r;
    int n = store_preload_ranges(st, &r);
    const df_tensor *ln0 = store_layer_tensor(l[0], "input_layernorm.weight"),
                    *g0 = store_layer_tensor(l[0], "mlp.gate_proj.weight"), *head = store_global(st, "lm_head.weight"),
                    *norm = store_global(st, "model.norm.weight");
    int layers = n == 6 && range_is(&r[0], ln0, sizeof k_ln0) && range_is(&r[1], g0, sizeof k_gate0) &&
                 (const void *)r[0].p < (const void *)r[1].p &&
                 range_is(&r[2], store_layer_tensor(l[1], "block_sparse_moe.gate.weight"), sizeof k_router) &&
                 range_is(&r[3], store_layer_tensor(l[2], "self_attn.q_proj.weight"), sizeof k_q2);
    int top = n == 6 && ((range_is(&r[4], head, sizeof k_head) && range_is(&r[5], norm, sizeof k_norm)) ||
                         (range_is(&r[4], norm, sizeof k_norm) && range_is(&r[5], head, sizeof k_head)));
    CHECK(layers && top, "preload: layer 0's two tensors in file order, layer 1's router, layer 2's q_proj, then "
          "lm_head and the final norm; not the embedding nor any expert (%d ranges)", n);
    free(r);
}

static void test_k3(const char *dir) {
    write_k3(dir);
    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open(&st, dir, &err);
    CHECK(rc == 0, "K3 folder opens (%s)", err.msg);
    if (rc) return;
    CHECK(!strcmp(store_family(st), "kimi_k3") && store_layer_count(st) == 3 && store_shard_count(st) == 2,
          "family, layer count from text_config, shard count");
    CHECK(strstr(store_config_text(st), "text_config") != NULL, "config text");
    const df_tensor *t = store_global(st, "model.embed_tokens.weight");
    CHECK(t && t->dtype == DF_DT_BF16 && t->ndim == 2 && t->shape[0] == 16 && t->shape[1] == D_ &&
              !memcmp(t->data, k_embed, sizeof k_embed) && !strcmp(t->name, "language_model.model.embed_tokens.weight"),
          "model.embed_tokens.weight resolves under language_model.");
    t = store_global(st, "lm_head.weight");
    CHECK(t && !memcmp(t->data, k_head, sizeof k_head), "lm_head.weight resolves to language_model.lm_head.weight");
    t = store_global(st, "model.norm.weight");
    CHECK(t && t->dtype == DF_DT_F32 && ((const float *)t->data)[3] == 4.0f, "model.norm.weight");
    CHECK(!store_global(st, "language_model.lm_head.weight") && !store_global(st, "vision_tower.encoder.patch_embed.weight") &&
              !store_global(st, "multi_modal_projector.linear_1.weight"),
          "prefixed and vision names are not visible");
    const df_tensor *g;
    CHECK(store_global_get(st, "model.norm.weight", &g, &err) == 0 && g && store_global_get(st, "nope", &g, &err) == 0 &&
              !g, "store_global_get finds present and reports absent");

    const df_store_layer *l0, *l1, *l2;
    CHECK(store_layer_acquire(st, 0, &l0, &err) == 0 && store_layer_acquire(st, 1, &l1, &err) == 0 &&
              store_layer_acquire(st, 2, &l2, &err) == 0, "layers acquire");
    const df_store_layer *l3 = l0;
    CHECK(store_layer_acquire(st, 3, &l3, &err) == DF_EINVAL && !l3, "layer out of range is EINVAL");
    t = store_layer_tensor(l0, "mlp.gate_proj.weight");
    CHECK(t && t->shape[0] == I_ && !memcmp(t->data, k_gate0, sizeof k_gate0), "layer 0 mlp.gate_proj.weight");
    t = store_layer_tensor(l0, "input_layernorm.weight");
    CHECK(t && ((const float *)t->data)[2] == 1.0f, "layer 0 input_layernorm.weight");
    CHECK(!store_layer_tensor(l0, "self_attn.q_proj.weight") && !store_layer_tensor(l0, "mlp.up_proj.weight"),
          "absent layer tensors are NULL");
    t = store_layer_tensor(l1, "block_sparse_moe.gate.weight");
    CHECK(t && t->shape[0] == NE && !memcmp(t->data, k_router, sizeof k_router), "layer 1 router");
    CHECK(!store_layer_tensor(l1, "block_sparse_moe.experts.0.w1.weight_packed"), "expert tensors are not layer tensors");
    t = store_layer_tensor(l2, "self_attn.q_proj.weight");
    CHECK(t && !memcmp(t->data, k_q2, sizeof k_q2), "layer 2 q_proj");
    store_layer_release(st, l0);
    store_layer_release(st, l1);
    store_layer_release(st, l2);

    check_preload(st);

    CHECK(store_expert_count(st, 1) == NE && store_expert_count(st, 0) == 0 && store_expert_count(st, 2) == 0 &&
              store_expert_count(st, 7) == 0, "expert counts");
    int views_ok = 1, loc_ok = 1, bytes_ok = 1;
    for (int e = 0; e < NE; e++) {
        df_expert ex;
        if (store_expert_acquire(st, 1, e, &ex, &err)) {
            views_ok = 0;
            printf("# %s\n", err.msg);
            continue;
        }
        const k3_expert *x = &kx[e];
        views_ok &= ex.w1.dtype == DF_DT_MXFP4 && ex.w1.ndim == 2 && ex.w1.shape[0] == I_ && ex.w1.shape[1] == D_;
        views_ok &= ex.w2.dtype == DF_DT_MXFP4 && ex.w2.shape[0] == D_ && ex.w2.shape[1] == I_;
        views_ok &= ex.w3.dtype == DF_DT_MXFP4 && ex.w3.shape[0] == I_ && ex.w3.shape[1] == D_;
        views_ok &= !memcmp(ex.w1.data, x->p1, sizeof x->p1) && !memcmp(ex.w1.scale, x->s1, sizeof x->s1);
        views_ok &= !memcmp(ex.w2.data, x->p2, sizeof x->p2) && !memcmp(ex.w2.scale, x->s2, sizeof x->s2);
        views_ok &= !memcmp(ex.w3.data, x->p3, sizeof x->p3) && !memcmp(ex.w3.scale, x->s3, sizeof x->s3);
        store_expert_release(st, 1, e);
        const store_expert_loc *loc = store_expert_locate(st, 1, e);
        loc_ok &= loc && loc->contiguous && loc->n_parts == 6 && loc->offset == kx_off[e] &&
                  loc->length == sizeof *x && strstr(loc->path, "model-00002-of-00002.safetensors") &&
                  !strcmp(store_shard_path(st, loc->shard), loc->path);
        if (!loc) continue;
        /* one read of the span returns the expert's tensors in disk order */
        uint8_t *want = malloc(sizeof *x);
        size_t o = 0;
        for (int p = 0; p < loc->n_parts; p++) {
            df_tensor v = {0};
            const char *nm = loc->parts[p].name;
            int m = strstr(nm, ".w1.") ? 0 : strstr(nm, ".w2.") ? 1 : 2, sc = strstr(nm, "scale") != NULL;
            const df_tensor *w = m == 0 ? &ex.w1 : m == 1 ? &ex.w2 : &ex.w3;
            v.data = sc ? w->scale : w->data;
            memcpy(want + o, v.data, loc->parts[p].length);
            o += loc->parts[p].length;
        }
        bytes_ok &= o == sizeof *x && pread_equals(loc->path, loc->offset, want, o);
        free(want);
    }
    CHECK(views_ok, "MXFP4 expert views: logical shape, dtype, data/scale bytes as written");
    CHECK(loc_ok, "expert index: shard, offset, length, contiguity for every expert (string order on disk)");
    CHECK(bytes_ok, "expert span read from the file equals the expert's tensors");
    CHECK(!store_expert_locate(st, 1, NE) && !store_expert_locate(st, 0, 0), "locate out of range is NULL");
    int ids[2] = {0, 10}, bad[1] = {NE};
    CHECK(store_experts_prefetch(st, 1, ids, 2, &err) == 0 && store_experts_prefetch(st, 1, bad, 1, &err) == DF_EINVAL,
          "prefetch accepts valid ids and rejects bad ones");

    size_t len = 0;
    err.code = -99;
    char *aux = store_read_aux(st, "config.json", &len, &err);
    CHECK(aux && len == strlen(store_config_text(st)), "read_aux reads a folder file");
    free(aux);
    aux = store_read_aux(st, "tokenizer_config.json", &len, &err);
    CHECK(!aux && err.code == DF_OK, "read_aux of an absent file is NULL with DF_OK");
    aux = store_read_aux(st, "../etc/passwd", &len, &err);
    CHECK(!aux && err.code < 0, "read_aux refuses paths outside the folder");

    char desc[4096] = "info: ";
    store_describe(st, desc, sizeof desc);
    print_comment(desc);
    CHECK(!strncmp(desc, "info: checkpoint:", 17), "describe appends");
    CHECK(strstr(desc, "shards: 2") && strstr(desc, "11 in 1 MoE layers") && strstr(desc, "w1 MXFP4 [32, 64]") &&
              strstr(desc, "every expert is one contiguous span") && strstr(desc, "ignored: 2 non-text tensors") &&
              strstr(desc, "3264 bytes") && strstr(desc, "problems: none"),
          "describe: shards, experts, spans, ignored tensors, bytes per expert");
    char small[40] = "";
    store_describe(st, small, sizeof small);
    CHECK(strlen(small) == sizeof small - 1, "describe truncates at cap");
    store_free(st);
}

static void test_kimi_linear(const char *dir) {
    static uint16_t embed[16][32], gate[8][32], up[8][32], down[32][8], head[16][32], router[2][32];
    static uint16_t w[2][3][8 * 32];
    static uint8_t odd[3] = {1, 2, 3};
    fx_fill(embed, sizeof embed, 1);
    fx_fill(gate, sizeof gate, 2);
    fx_fill(w, sizeof w, 3);
    fx_tensor a[] = {
        {"model.embed_tokens.weight", "BF16", 2, {16, 32}, embed, sizeof embed},
        {"model.layers.0.self_attn.odd", "U8", 1, {3}, odd, 3},
        {"model.layers.0.block_sparse_moe.gate_proj.weight", "BF16", 2, {8, 32}, gate, sizeof gate},
        {"model.layers.0.block_sparse_moe.up_proj.weight", "BF16", 2, {8, 32}, up, sizeof up},
        {"model.layers.0.block_sparse_moe.down_proj.weight", "BF16", 2, {32, 8}, down, sizeof down},
    };
    fx_write_st(dir, "model-00001-of-00002.safetensors", a, 5, NULL);
    const char *pre = "model.layers.1.block_sparse_moe.experts.";
    char nm[6][96];
    for (int e = 0; e < 2; e++)
        for (int m = 0; m < 3; m++) snprintf(nm[e * 3 + m], 96, "%s%d.w%d.weight", pre, e, m + 1);
    fx_tensor b[] = {
        {"lm_head.weight", "BF16", 2, {16, 32}, head, sizeof head},
        {nm[0], "BF16", 2, {8, 32}, w[0][0], sizeof w[0][0]},
        {nm[1], "BF16", 2, {32, 8}, w[0][1], sizeof w[0][1]},
        {nm[2], "BF16", 2, {8, 32}, w[0][2], sizeof w[0][2]},
        {nm[3], "BF16", 2, {8, 32}, w[1][0], sizeof w[1][0]},
        {"model.layers.1.block_sparse_moe.gate.weight", "BF16", 2, {2, 32}, router, sizeof router},
        {nm[4], "BF16", 2, {32, 8}, w[1][1], sizeof w[1][1]},
        {nm[5], "BF16", 2, {8, 32}, w[1][2], sizeof w[1][2]},
    };
    uint64_t offs[8];
    fx_write_st(dir, "model-00002-of-00002.safetensors", b, 8, offs);
    char idx[4096];
    size_t len = (size_t)snprintf(idx, sizeof idx, "{\"weight_map\":{");
    for (int i = 0; i < 5; i++)
        len += (size_t)snprintf(idx + len, sizeof idx - len, "\"%s\":\"model-00001-of-00002.safetensors\",", a[i].name);
    for (int i = 0; i < 8; i++)
        len += (size_t)snprintf(idx + len, sizeof idx - len, "\"%s\":\"model-00002-of-00002.safetensors\"%s", b[i].name,
                                i < 7 ? "," : "}}");
    fx_write_text(dir, "model.safetensors.index.json", idx);
    fx_write_text(dir, "config.json", "{\"model_type\":\"kimi_linear\",\"num_hidden_layers\":2}");

    df_store *st = NULL;
    df_error err = {0};
    int rc = store_open(&st, dir, &err);
    CHECK(rc == 0, "Kimi-Linear folder opens (%s)", err.msg);
    if (rc) return;
    CHECK(!strcmp(store_family(st), "kimi_linear") && store_layer_count(st) == 2, "family and layers");
    const df_tensor *t = store_global(st, "model.embed_tokens.weight");
    CHECK(t && !strcmp(t->name, "model.embed_tokens.weight") && !memcmp(t->data, embed, sizeof embed),
          "unprefixed names resolve directly");
    const df_store_layer *l0;
    CHECK(store_layer_acquire(st, 0, &l0, &err) == 0, "layer 0 acquires");
    t = store_layer_tensor(l0, "mlp.gate_proj.weight");
    CHECK(t && !strcmp(t->name, "model.layers.0.block_sparse_moe.gate_proj.weight") &&
              !memcmp(t->data, gate, sizeof gate),
          "HF-saved dense FFN (block_sparse_moe.gate_proj) answers to mlp.gate_proj.weight");
    CHECK(t && (uintptr_t)t->data % 2 == 0, "a misaligned BF16 tensor is served aligned");
    CHECK(store_layer_tensor(l0, "mlp.down_proj.weight") && store_layer_tensor(l0, "mlp.up_proj.weight") &&
              !store_layer_tensor(l0, "block_sparse_moe.up_proj.weight"),
          "the dense FFN is served under the table's canonical names only");
    CHECK(store_expert_count(st, 1) == 2, "two bf16 experts");
    df_expert ex;
    rc = store_expert_acquire(st, 1, 1, &ex, &err);
    CHECK(rc == 0 && ex.w1.dtype == DF_DT_BF16 && ex.w2.shape[0] == 32 && ex.w2.shape[1] == 8 && !ex.w1.scale &&
              !memcmp(ex.w1.data, w[1][0], sizeof w[1][0]) && !memcmp(ex.w2.data, w[1][1], sizeof w[1][1]) &&
              !memcmp(ex.w3.data, w[1][2], sizeof w[1][2]),
          "bf16 expert views");
    const store_expert_loc *l_0 = store_expert_locate(st, 1, 0), *l_1 = store_expert_locate(st, 1, 1);
    CHECK(l_0 && l_0->contiguous && l_0->n_parts == 3 && l_0->offset == offs[1] && l_0->length == 3 * 512,
          "bf16 expert 0 is one contiguous span");
    CHECK(l_1 && !l_1->contiguous && l_1->n_parts == 3 && l_1->parts[0].offset == offs[4] &&
              l_1->parts[1].offset == offs[6] && l_1->parts[2].length == 512 &&
              pread_equals(store_shard_path(st, l_1->parts[1].shard), l_1->parts[1].offset, w[1][1], 512),
          "expert 1 with a foreign tensor inside is non-contiguous, with per-tensor parts");
    char desc[4096] = "";
    store_describe(st, desc, sizeof desc);
    print_comment(desc);
    CHECK(strstr(desc, "1 of 2 experts are not one contiguous span") && strstr(desc, "per-tensor reads") &&
              strstr(desc, "misaligned tensors copied"),
          "describe reports the non-contiguous expert");
    store_free(st);
}

/* The default budget: a cgroup limit is the process's own (a margin left), RAM is shared (a quarter left). */
static void test_default_budget(void) {
    const uint64_t G = 1ull << 30, M = 1ull << 20;
    CHECK(budget_default_for(24 * G, 0) == 18 * G, "budget: 3/4 of RAM without a cgroup");
    CHECK(budget_default_for(24 * G, 8 * G) == 7 * G, "budget: an 8 GiB cgroup less 1/8 = 7 GiB");
    CHECK(budget_default_for(24 * G, 4 * G) == 4 * G - 768 * M, "budget: a 4 GiB cgroup less 768 MiB");
    CHECK(budget_default_for(24 * G, 2 * G) == 2 * G / 4 * 3 && budget_default_for(24 * G, 512 * M) == 384 * M,
          "budget: never below 3/4 of a small cgroup limit (no underflow)");
    CHECK(budget_default_for(4 * G, 8 * G) == 3 * G && budget_default_for(0, 8 * G) == 7 * G,
          "budget: a cgroup above RAM does not count; unknown RAM takes the cgroup's");
}

int main(void) {
    test_default_budget();
    char d1[256], d2[256];
    fx_mkdir("k3", d1, sizeof d1);
    fx_mkdir("kl", d2, sizeof d2);
    test_k3(d1);
    test_kimi_linear(d2);
    fx_rmtree(d1);
    fx_rmtree(d2);
    TEST_EXIT();
}
