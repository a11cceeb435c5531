/* weights.c — binding the spine once at open: per layer, every tensor the config's mixer and FFN use is looked
 * up by its name in the checkpoint name table (format/tensor_names.h), checked (shape, dtype) and kept as a
 * pointer to storage's stable view; small 1-D tensors are read from the checkpoint file and kept resident in
 * fp32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"
#include "common/util.h"
#include "format/tensor_names.h"

static int dtype_is_matrix(df_dtype dt) {
    return dt == DF_DT_F32 || dt == DF_DT_BF16 || dt == DF_DT_F16 || dt == DF_DT_MXFP4 || dt == DF_DT_I8;
}

int tensor_check_mat(const df_tensor *t, const char *name, int64_t rows, int64_t cols, const char *dir,
                     df_error *err) {
    if (!t) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s is missing from the checkpoint", dir, name);
        return DF_EFORMAT;
    }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[96] = "";
        for (int i = 0, o = 0; i < t->ndim && o < 80; i++)
            o += snprintf(got + o, sizeof got - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has shape [%s], expected [%lld,%lld]", dir, t->name, got,
                     (long long)rows, (long long)cols);
        return DF_EFORMAT;
    }
    if (!dtype_is_matrix(t->dtype)) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has dtype %s, not usable as a weight matrix", dir, t->name,
                     tensor_dtype_name(t->dtype));
        return DF_EFORMAT;
    }
    if (t->dtype == DF_DT_MXFP4 && cols % 32) {
        df_error_set(err, DF_EFORMAT, "%s: MXFP4 tensor %s has %lld columns, not a multiple of 32", dir, t->name,
                     (long long)cols);
        return DF_EFORMAT;
    }
    return DF_OK;
}

/* A vector of at least n (exact: exactly n) float elements, converted to a new resident fp32 array of all its
 * elements; NULL with err set. The bytes may be unaligned (a file mapping): they are copied before reading. */
static float *weights_vec(model_weights *w, const df_tensor *t, const char *name, int64_t n, int exact,
                          const char *dir, df_error *err) {
    if (!t) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s is missing from the checkpoint", dir, name);
        return NULL;
    }
    int64_t numel = tensor_numel(t);
    if (numel < n || (exact && numel != n) ||
        !(t->dtype == DF_DT_F32 || t->dtype == DF_DT_BF16 || t->dtype == DF_DT_F16)) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has %lld %s elements, expected %s%lld float values", dir,
                     t->name, (long long)numel, tensor_dtype_name(t->dtype), exact ? "" : "at least ",
                     (long long)n);
        return NULL;
    }
    size_t bytes = (size_t)tensor_data_bytes(t);
    df_tensor v = *t;
    void *copy = xmalloc(bytes);
    memcpy(copy, t->data, bytes);
    v.data = copy;
    float *out = xmalloc((size_t)numel * sizeof(float));
    tensor_to_f32(&v, out);
    free(copy);
    if (w->n_owned == w->owned_cap) {
        w->owned_cap = w->owned_cap ? 2 * w->owned_cap : 64;
        w->owned = xrealloc(w->owned, (size_t)w->owned_cap * sizeof *w->owned);
    }
    return w->owned[w->n_owned++] = out;
}

/* One layer being bound: its table (storage's views) and where errors go. */
typedef struct {
    df_model *m;
    const df_store_layer *L;
    int layer;
    df_error *err;
} bind_ctx;

static void bind_name(const bind_ctx *b, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "model.layers.%d.%s", b->layer, suffix);
}

static const df_tensor *bind_mat(bind_ctx *b, tensor_kind kind, int64_t rows, int64_t cols) {
    const char *suffix = tensor_name_suffix(kind);
    const df_tensor *t = store_layer_tensor(b->L, suffix);
    char name[256];
    bind_name(b, suffix, name, sizeof name);
    return tensor_check_mat(t, name, rows, cols, b->m->dir, b->err) ? NULL : t;
}

static float *bind_vec(bind_ctx *b, tensor_kind kind, int64_t n, int exact) {
    const char *suffix = tensor_name_suffix(kind);
    df_tensor t;
    char name[256];
    bind_name(b, suffix, name, sizeof name);
    int have = store_layer_tensor_file(b->m->store, b->L, suffix, &t) == 0;
    return weights_vec(&b->m->w, have ? &t : NULL, name, n, exact, b->m->dir, b->err);
}

/* A gated MLP: kinds[] are its gate, up and down projections. */
static int bind_glu(bind_ctx *b, const tensor_kind kinds[3], int inter, glu_weights *g) {
    int64_t d = b->m->cfg.d;
    g->inter = inter;
    if (!(g->gate = bind_mat(b, kinds[0], inter, d)) || !(g->up = bind_mat(b, kinds[1], inter, d)) ||
        !(g->down = bind_mat(b, kinds[2], d, inter)))
        return b->err->code;
    return DF_OK;
}

static int bind_kda(bind_ctx *b, kda_weights *w) {
    const df_config *c = &b->m->cfg;
    int64_t d = c->d, D = c->kda_dim, H = c->kda_heads, P = H * D;
    static const tensor_kind convs[3] = {TN_KDA_Q_CONV, TN_KDA_K_CONV, TN_KDA_V_CONV};
    int ok = (w->q = bind_mat(b, TN_ATTN_Q, P, d)) &&
             (w->k = bind_mat(b, TN_ATTN_K, P, d)) &&
             (w->v = bind_mat(b, TN_ATTN_V, P, d)) &&
             (w->fa = bind_mat(b, TN_KDA_F_A, D, d)) &&
             (w->fb = bind_mat(b, TN_KDA_F_B, P, D)) &&
             (w->b = bind_mat(b, TN_KDA_B, H, d)) &&
             (w->o = bind_mat(b, TN_ATTN_O, d, P));
    if (ok && c->full_rank_gate) ok = (w->g = bind_mat(b, TN_ATTN_G, P, d)) != NULL;
    else if (ok) ok = (w->ga = bind_mat(b, TN_KDA_G_A, D, d)) &&
                      (w->gb = bind_mat(b, TN_KDA_G_B, P, D));
    for (int i = 0; ok && i < 3; i++) ok = (w->conv[i] = bind_vec(b, convs[i], P * c->conv_w, 1)) != NULL;
    ok = ok && (w->dt_bias = bind_vec(b, TN_KDA_DT_BIAS, P, 1)) &&
         (w->onorm = bind_vec(b, TN_KDA_O_NORM, D, 1)) &&
         (w->alog = bind_vec(b, TN_KDA_A_LOG, b->m->alog_per_channel ? D : H, 0));
    return ok ? DF_OK : b->err->code;
}

static int bind_mla(bind_ctx *b, mla_weights *w) {
    const df_config *c = &b->m->cfg;
    int64_t d = c->d, H = c->mla_heads, Nq = c->nope + c->rope;
    int ok;
    if (c->q_lora)
        ok = (w->qa = bind_mat(b, TN_MLA_Q_A, c->q_lora, d)) &&
             (w->qb = bind_mat(b, TN_MLA_Q_B, H * Nq, c->q_lora)) &&
             (w->qa_norm = bind_vec(b, TN_MLA_Q_A_NORM, c->q_lora, 1));
    else
        ok = (w->q = bind_mat(b, TN_ATTN_Q, H * Nq, d)) != NULL;
    ok = ok && (w->kva = bind_mat(b, TN_MLA_KV_A, c->kv_lora + c->rope, d)) &&
         (w->kvb = bind_mat(b, TN_MLA_KV_B, H * (c->nope + c->vdim), c->kv_lora)) &&
         (w->kv_norm = bind_vec(b, TN_MLA_KV_A_NORM, c->kv_lora, 1)) &&
         (w->o = bind_mat(b, TN_ATTN_O, d, H * c->vdim));
    if (ok && c->mla_out_gate) ok = (w->g = bind_mat(b, TN_ATTN_G, H * c->vdim, d)) != NULL;
    if (ok && w->kvb->dtype == DF_DT_MXFP4) {
        df_error_set(b->err, DF_EUNSUPPORTED, "%s: MXFP4 kv_b_proj in layer %d is not supported", b->m->dir,
                     b->layer);
        ok = 0;
    }
    return ok ? DF_OK : b->err->code;
}

static int bind_moe(bind_ctx *b, moe_weights *w) {
    const df_config *c = &b->m->cfg;
    if (c->latent_dim) {
        if (!(w->latent_down = bind_mat(b, TN_LATENT_DOWN, c->latent_dim, c->d)) ||
            !(w->latent_up = bind_mat(b, TN_LATENT_UP, c->d, c->latent_dim)))
            return b->err->code;
        if (c->latent_norm &&
            !(w->latent_norm = bind_vec(b, TN_LATENT_NORM, c->latent_dim, 1)))
            return b->err->code;
    }
    if (!(w->gate = bind_mat(b, TN_MOE_ROUTER, c->n_experts, c->d)) ||
        !(w->bias = bind_vec(b, TN_MOE_BIAS, c->n_experts, 1)))
        return b->err->code;
    int have = store_expert_count(b->m->store, b->layer);
    if (have != c->n_experts) {
        df_error_set(b->err, DF_EFORMAT, "%s: layer %d has %d routed experts in the checkpoint, config says %d",
                     b->m->dir, b->layer, have, c->n_experts);
        return DF_EFORMAT;
    }
    static const tensor_kind shared[3] = {TN_SHARED_GATE, TN_SHARED_UP, TN_SHARED_DOWN};
    if (c->n_shared > 0) return bind_glu(b, shared, c->moe_inter * c->n_shared, &w->shared);
    return DF_OK;
}

static int bind_layer(bind_ctx *b, layer_weights *w) {
    const df_config *c = &b->m->cfg;
    int d = c->d;
    if (!(w->attn_norm = bind_vec(b, TN_ATTN_NORM, d, 1)) ||
        !(w->ffn_norm = bind_vec(b, TN_FFN_NORM, d, 1)))
        return b->err->code;
    if (c->attn_res_block &&
        (!(w->attn_res_norm = bind_vec(b, TN_ATTN_RES_NORM, d, 1)) ||
         !(w->attn_res_proj = bind_vec(b, TN_ATTN_RES_PROJ, d, 1)) ||
         !(w->mlp_res_norm = bind_vec(b, TN_MLP_RES_NORM, d, 1)) ||
         !(w->mlp_res_proj = bind_vec(b, TN_MLP_RES_PROJ, d, 1))))
        return b->err->code;
    int rc = c->mixer[b->layer] == MIXER_KDA ? bind_kda(b, &w->kda) : bind_mla(b, &w->mla);
    if (rc) return rc;
    if (c->ffn[b->layer] == FFN_MOE) return bind_moe(b, &w->moe);
    static const tensor_kind dense[3] = {TN_FFN_GATE, TN_FFN_UP, TN_FFN_DOWN};
    return bind_glu(b, dense, c->dense_inter, &w->ffn);
}

static int bind_global_mat(df_model *m, tensor_kind kind, const df_tensor **out, df_error *err) {
    const char *name = tensor_name_suffix(kind);
    const df_tensor *t = store_global(m->store, name);
    *out = t;
    return tensor_check_mat(t, name, m->cfg.vocab, m->cfg.d, m->dir, err);
}

static float *bind_global_vec(df_model *m, tensor_kind kind, df_error *err) {
    const char *name = tensor_name_suffix(kind);
    return weights_vec(&m->w, store_global(m->store, name), name, m->cfg.d, 1, m->dir, err);
}

int model_weights_bind(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    model_weights *w = &m->w;
    memset(w, 0, sizeof *w);
    if (bind_global_mat(m, TN_EMBED, &w->embed, err) ||
        bind_global_mat(m, TN_LM_HEAD, &w->head, err) ||
        !(w->norm = bind_global_vec(m, TN_FINAL_NORM, err)))
        return err->code;
    if (c->attn_res_block && (!(w->out_res_norm = bind_global_vec(m, TN_OUT_RES_NORM, err)) ||
                              !(w->out_res_proj = bind_global_vec(m, TN_OUT_RES_PROJ, err))))
        return err->code;
    w->layers = xcalloc((size_t)c->n_layers, sizeof *w->layers);
    for (int i = 0; i < c->n_layers; i++) {
        bind_ctx b = {m, NULL, i, err};
        int rc = store_layer_table(m->store, i, &b.L, err);
        if (!rc) rc = bind_layer(&b, &w->layers[i]);
        if (rc) return rc;
    }
    return DF_OK;
}

void model_weights_free(model_weights *w) {
    for (int i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    free(w->layers);
    memset(w, 0, sizeof *w);
}
