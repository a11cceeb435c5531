/* config.c — reads config.json (both families, with Moonshot's and transformers' key spellings) into a
 * df_config and checks it enough that the forward pass can trust its numbers. */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include "common/util.h"

typedef struct {
    json_t *root;
    const char *path;
    df_error *err;
    int failed;
} cfg_reader;

/* First key present among a NULL-terminated list of spellings. */
static json_t *cfg_find(cfg_reader *r, const char *const *keys) {
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(r->root, keys[i]);
        if (v && !json_is_null(v)) return v;
    }
    return NULL;
}

/* An integer key; values past [lo, hi] (or non-integral reals) are refused naming the key, never truncated
 * by a later cast. */
static int64_t cfg_int_in(cfg_reader *r, const char *const *keys, int64_t dflt, int required, int64_t lo,
                          int64_t hi) {
    json_t *v = cfg_find(r, keys);
    if (!v) {
        if (required && !r->failed) {
            df_error_set(r->err, DF_EFORMAT, "%s: missing required key \"%s\"", r->path, keys[0]);
            r->failed = 1;
        }
        return dflt;
    }
    int ok = 1;
    int64_t x = 0;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        ok = d >= -0x1p53 && d <= 0x1p53 && d == (double)(int64_t)d;
        if (ok) x = (int64_t)d;
    } else if (json_is_boolean(v)) {
        x = json_is_true(v);
    } else {
        ok = 0;
    }
    if (ok && x >= lo && x <= hi) return x;
    if (!r->failed) {
        if (ok)
            df_error_set(r->err, DF_EFORMAT, "%s: key \"%s\" = %lld is out of range %lld..%lld", r->path, keys[0],
                         (long long)x, (long long)lo, (long long)hi);
        else
            df_error_set(r->err, DF_EFORMAT, "%s: key \"%s\" must be an integer", r->path, keys[0]);
        r->failed = 1;
    }
    return dflt;
}

/* Every int field of df_config: any value an int holds passes here; cfg_check judges the meaning. */
static int cfg_int(cfg_reader *r, const char *const *keys, int dflt, int required) {
    return (int)cfg_int_in(r, keys, dflt, required, INT32_MIN, INT32_MAX);
}

static double cfg_num(cfg_reader *r, const char *const *keys, double dflt) {
    json_t *v = cfg_find(r, keys);
    if (!v) return dflt;
    if (json_is_number(v)) return json_number_value(v);
    if (!r->failed) {
        df_error_set(r->err, DF_EFORMAT, "%s: key \"%s\" must be a number", r->path, keys[0]);
        r->failed = 1;
    }
    return dflt;
}

/* A real key that must be finite and inside [lo, hi] (lo excluded when lo_open): values past any released
 * model's range make the numbers meaningless (NaN logits, a NUL-byte answer), so they are refused at open,
 * naming the key, before a float cast can turn them into infinities. */
static double cfg_real_in(cfg_reader *r, const char *const *keys, double dflt, double lo, int lo_open, double hi) {
    json_t *v = cfg_find(r, keys);
    double x = cfg_num(r, keys, dflt);
    if (!v || r->failed) return x;
    if (isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi) return x;
    df_error_set(r->err, DF_EFORMAT, "%s: key \"%s\" = %g is outside %c%g, %g] (no released model is there; the "
                 "forward pass would give meaningless numbers)", r->path, keys[0], x, lo_open ? '(' : '[', lo, hi);
    r->failed = 1;
    return dflt;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Marks layers listed (1-based) in linear_attn_config[key] as kind. */
static int cfg_layer_list(cfg_reader *r, json_t *lac, const char *key, df_config *c, uint8_t kind,
                          uint8_t *seen) {
    json_t *list = json_object_get(lac, key);
    if (!json_is_array(list)) {
        df_error_set(r->err, DF_EFORMAT, "%s: linear_attn_config.%s must be a list of 1-based layer numbers",
                     r->path, key);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;
        if (n < 1 || n > c->n_layers || seen[n - 1]) {
            df_error_set(r->err, DF_EFORMAT, "%s: linear_attn_config.%s[%zu] = %lld is out of range 1..%d or "
                         "listed twice", r->path, key, i, (long long)n, c->n_layers);
            return -1;
        }
        seen[n - 1] = 1;
        c->mixer[n - 1] = kind;
    }
    return 0;
}

static int cfg_read_text(cfg_reader *r, df_config *c) {
    c->vocab = cfg_int(r, KEYS("vocab_size"), 0, 1);
    c->d = cfg_int(r, KEYS("hidden_size"), 0, 1);
    c->n_layers = cfg_int(r, KEYS("num_hidden_layers"), 0, 1);
    c->eps = (float)cfg_real_in(r, KEYS("rms_norm_eps"), 1e-5, 1e-12, 0, 0.1);
    c->max_ctx = cfg_int_in(r, KEYS("model_max_length", "max_position_embeddings"), 1 << 20, 0, 1, INT64_MAX);
    c->bos_id = cfg_int(r, KEYS("bos_token_id"), -1, 0);
    c->eos_id = cfg_int(r, KEYS("eos_token_id"), -1, 0);
    c->dense_inter = cfg_int(r, KEYS("intermediate_size"), 0, 1);

    json_t *act = json_object_get(r->root, "hidden_act");
    const char *a = json_is_string(act) ? json_string_value(act) : "silu";
    if (!strcmp(a, "situ")) {
        c->use_situ = 1;
    } else if (strcmp(a, "silu") && strcmp(a, "swish")) {
        df_error_set(r->err, DF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu or situ)", r->path, a);
        return -1;
    }
    c->situ_beta = (float)cfg_real_in(r, KEYS("activation_situ_beta"), 4.0, 1e-3, 0, 1e4);
    c->situ_lin_beta = (float)cfg_real_in(r, KEYS("activation_situ_linear_beta"), 0.0, -1e4, 0, 1e4);
    if (c->situ_lin_beta > 0 && c->situ_lin_beta < 1e-3f && !r->failed) {
        df_error_set(r->err, DF_EFORMAT, "%s: key \"activation_situ_linear_beta\" = %g: 0 (off) or at least 0.001",
                     r->path, (double)c->situ_lin_beta);
        r->failed = 1;
    }

    c->n_experts = cfg_int(r, KEYS("num_experts", "num_local_experts", "n_routed_experts"), 0, 0);
    c->topk = cfg_int(r, KEYS("num_experts_per_token", "num_experts_per_tok"), 0, 0);
    c->n_shared = cfg_int(r, KEYS("num_shared_experts", "n_shared_experts"), 0, 0);
    c->moe_inter = cfg_int(r, KEYS("moe_intermediate_size"), 0, 0);
    c->n_group = cfg_int(r, KEYS("num_expert_group", "n_group"), 1, 0);
    c->topk_group = cfg_int(r, KEYS("topk_group"), 1, 0);
    json_t *ug = json_object_get(r->root, "use_grouped_topk");
    if (ug && json_is_false(ug)) c->n_group = c->topk_group = 1;
    c->renorm = cfg_int(r, KEYS("moe_renormalize", "norm_topk_prob"), 1, 0);
    c->routed_scale = (float)cfg_real_in(r, KEYS("routed_scaling_factor"), 1.0, 1e-3, 0, 100.0);
    c->first_dense = cfg_int(r, KEYS("first_k_dense_replace"), 0, 0);
    c->moe_freq = cfg_int(r, KEYS("moe_layer_freq"), 1, 0);
    c->latent_dim = cfg_int(r, KEYS("routed_expert_hidden_size"), 0, 0);
    c->latent_norm = cfg_int(r, KEYS("latent_moe_use_norm"), 0, 0);
    json_t *func = json_object_get(r->root, "moe_router_activation_func");
    if (func && json_is_string(func) && strcmp(json_string_value(func), "sigmoid")) {
        df_error_set(r->err, DF_EUNSUPPORTED, "%s: moe_router_activation_func \"%s\" is not supported (sigmoid)",
                     r->path, json_string_value(func));
        return -1;
    }

    c->mla_heads = cfg_int(r, KEYS("num_attention_heads"), 0, 1);
    c->q_lora = cfg_int(r, KEYS("q_lora_rank"), 0, 0);
    c->kv_lora = cfg_int(r, KEYS("kv_lora_rank"), 0, 1);
    c->nope = cfg_int(r, KEYS("qk_nope_head_dim"), 0, 1);
    c->rope = cfg_int(r, KEYS("qk_rope_head_dim"), 0, 1);
    c->vdim = cfg_int(r, KEYS("v_head_dim"), 0, 1);
    c->mla_out_gate = cfg_int(r, KEYS("mla_use_output_gate"), 0, 0);
    c->attn_res_block = cfg_int(r, KEYS("attn_res_block_size"), 0, 0);
    return r->failed ? -1 : 0;
}

static int cfg_read_linear_attn(cfg_reader *r, df_config *c) {
    json_t *lac = json_object_get(r->root, "linear_attn_config");
    if (!json_is_object(lac)) {
        df_error_set(r->err, DF_EFORMAT, "%s: missing linear_attn_config (the layer schedule)", r->path);
        return -1;
    }
    cfg_reader sub = {lac, r->path, r->err, 0};
    c->kda_heads = cfg_int(&sub, KEYS("num_heads"), 0, 1);
    c->kda_dim = cfg_int(&sub, KEYS("head_dim"), 0, 1);
    c->conv_w = cfg_int(&sub, KEYS("short_conv_kernel_size"), 4, 0);
    c->full_rank_gate = cfg_int(&sub, KEYS("use_full_rank_gate"), 0, 0);
    json_t *lb = json_object_get(lac, "gate_lower_bound");
    if (lb && !json_is_null(lb)) {   /* the log-decay's floor: negative, or the state grows without bound */
        c->has_lower_bound = 1;
        c->lower_bound = (float)cfg_real_in(&sub, KEYS("gate_lower_bound"), -5.0, -1e3, 0, -1e-6);
    }
    if (sub.failed) return -1;
    if (c->n_layers <= 0 || c->n_layers > CONFIG_MAX_LAYERS) {   /* before sizing anything by it */
        df_error_set(r->err, DF_EFORMAT, "%s: num_hidden_layers %d is out of range 1..%d", r->path, c->n_layers,
                     CONFIG_MAX_LAYERS);
        return -1;
    }
    c->mixer = xcalloc(c->n_layers, 1);
    c->ffn = xcalloc(c->n_layers, 1);
    uint8_t *seen = xcalloc(c->n_layers, 1);
    int rc = cfg_layer_list(r, lac, "kda_layers", c, MIXER_KDA, seen);
    if (!rc) rc = cfg_layer_list(r, lac, "full_attn_layers", c, MIXER_MLA, seen);
    for (int i = 0; !rc && i < c->n_layers; i++)
        if (!seen[i]) {
            df_error_set(r->err, DF_EFORMAT, "%s: layer %d (1-based) is in neither kda_layers nor "
                         "full_attn_layers", r->path, i + 1);
            rc = -1;
        }
    free(seen);
    return rc;
}

/* An upper bound (in floating point, so it cannot overflow) on every product config_param_counts forms: no
 * term of its formulas multiplies more than one count (heads, experts, layers) by two widths, and a layer
 * has fewer than 64 such terms. Below 2^62 its int64 arithmetic is exact. */
static double cfg_size_bound(const df_config *c) {
    const double widths[] = {c->d, c->dense_inter, c->moe_inter, c->latent_dim, c->kda_dim, c->conv_w, c->q_lora,
                             c->kv_lora, (double)c->nope + c->rope, c->vdim};
    const double counts[] = {c->kda_heads, c->mla_heads, c->n_experts, c->n_shared, 1};
    double w = 0, h = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) w = DF_MAX(w, fabs(widths[i]));
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) h = DF_MAX(h, fabs(counts[i]));
    return 2.0 * fabs((double)c->vocab) * fabs((double)c->d) + ((double)c->n_layers + 1) * 64.0 * h * w * w;
}

static int cfg_check(cfg_reader *r, df_config *c) {
    /* every size the forward pass divides by, loops over or allocates by, with the least it may be */
    const struct {
        int64_t v, lo, hi;
        const char *key;
    } sizes[] = {{c->vocab, 1, INT32_MAX, "vocab_size"}, {c->d, 1, INT32_MAX, "hidden_size"},
                 {c->n_layers, 1, CONFIG_MAX_LAYERS, "num_hidden_layers"},
                 {c->kda_heads, 1, INT32_MAX, "linear_attn_config.num_heads"},
                 {c->kda_dim, 1, INT32_MAX, "linear_attn_config.head_dim"},
                 {c->conv_w, 1, 1024, "linear_attn_config.short_conv_kernel_size"},
                 {c->mla_heads, 1, INT32_MAX, "num_attention_heads"}, {c->kv_lora, 1, INT32_MAX, "kv_lora_rank"},
                 {c->nope, 1, INT32_MAX, "qk_nope_head_dim"}, {c->rope, 0, INT32_MAX, "qk_rope_head_dim"},
                 {c->vdim, 1, INT32_MAX, "v_head_dim"}, {c->q_lora, 0, INT32_MAX, "q_lora_rank"},
                 {c->moe_freq, 1, INT32_MAX, "moe_layer_freq"}, {c->first_dense, 0, INT32_MAX, "first_k_dense_replace"},
                 {c->n_shared, 0, 1024, "num_shared_experts"}, {c->latent_dim, 0, INT32_MAX, "routed_expert_hidden_size"},
                 {c->n_experts, 0, INT32_MAX, "num_experts"}, {c->topk, 0, INT32_MAX, "num_experts_per_token"},
                 {c->moe_inter, 0, INT32_MAX, "moe_intermediate_size"},
                 {c->dense_inter, 0, INT32_MAX, "intermediate_size"}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (sizes[i].v < sizes[i].lo || sizes[i].v > sizes[i].hi) {
            df_error_set(r->err, DF_EFORMAT, "%s: invalid %s %lld (must be %lld..%lld)", r->path, sizes[i].key,
                         (long long)sizes[i].v, (long long)sizes[i].lo, (long long)sizes[i].hi);
            return -1;
        }
    /* an id no token can have (a trimmed vocabulary keeps the full one's ids) is no such token: never prepended,
     * never matched */
    if (c->bos_id >= c->vocab) c->bos_id = -1;
    if (c->eos_id >= c->vocab) c->eos_id = -1;
    int any_moe = 0;
    for (int i = 0; i < c->n_layers; i++) {
        c->ffn[i] = (i >= c->first_dense && i % c->moe_freq == 0) ? FFN_MOE : FFN_DENSE;
        any_moe |= c->ffn[i] == FFN_MOE;
    }
    int any_dense = 0;
    for (int i = 0; i < c->n_layers; i++) any_dense |= c->ffn[i] == FFN_DENSE;
    if (any_dense && c->dense_inter <= 0) {
        df_error_set(r->err, DF_EFORMAT, "%s: invalid intermediate_size %d for the dense layers", r->path,
                     c->dense_inter);
        return -1;
    }
    if (any_moe && (c->n_experts <= 0 || c->topk <= 0 || c->topk > c->n_experts || c->moe_inter <= 0)) {
        df_error_set(r->err, DF_EFORMAT, "%s: invalid MoE sizes (num_experts %d, num_experts_per_token %d, "
                     "moe_intermediate_size %d)", r->path, c->n_experts, c->topk, c->moe_inter);
        return -1;
    }
    if (c->n_group < 1 || c->n_experts % c->n_group || c->topk_group < 1 || c->topk_group > c->n_group) {
        df_error_set(r->err, DF_EFORMAT, "%s: invalid grouped routing (num_expert_group %d, topk_group %d, "
                     "num_experts %d)", r->path, c->n_group, c->topk_group, c->n_experts);
        return -1;
    }
    if (c->n_group > CONFIG_MAX_EXPERT_GROUPS) {
        df_error_set(r->err, DF_EUNSUPPORTED, "%s: num_expert_group %d exceeds %d", r->path, c->n_group,
                     CONFIG_MAX_EXPERT_GROUPS);
        return -1;
    }
    if (c->attn_res_block < 0 || (c->attn_res_block && c->n_layers / c->attn_res_block + 2 > CONFIG_MAX_ATTN_RES_BLOCKS)) {
        df_error_set(r->err, DF_EUNSUPPORTED, "%s: attn_res_block_size %d gives more than %d blocks", r->path,
                     c->attn_res_block, CONFIG_MAX_ATTN_RES_BLOCKS);
        return -1;
    }
    if (cfg_size_bound(c) > 0x1p62) {
        df_error_set(r->err, DF_EUNSUPPORTED, "%s: the sizes imply more than 2^62 parameters (width, heads or "
                     "expert counts far past any model)", r->path);
        return -1;
    }
    if (c->n_group > 1 && c->n_experts / c->n_group < 2) {
        df_error_set(r->err, DF_EFORMAT, "%s: grouped routing needs at least 2 experts per group", r->path);
        return -1;
    }
    return 0;
}

int config_parse(df_config *c, const char *text, const char *path, df_error *err) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *top = json_loads(text, 0, &jerr);
    if (!top || !json_is_object(top)) {
        df_error_set(err, DF_EFORMAT, "%s: bad JSON at line %d: %s", path, jerr.line, top ? "not an object" : jerr.text);
        json_decref(top);
        return DF_EFORMAT;
    }
    json_t *root = top;
    json_t *mt = json_object_get(top, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    if (!strcmp(type, "kimi_k3")) {
        c->is_k3 = 1;
        root = json_object_get(top, "text_config");
        if (!json_is_object(root)) {
            df_error_set(err, DF_EFORMAT, "%s: model_type kimi_k3 needs a text_config object", path);
            json_decref(top);
            return DF_EFORMAT;
        }
    } else if (strcmp(type, "kimi_linear")) {
        df_error_set(err, DF_EUNSUPPORTED, "%s: model_type \"%s\" is not supported (kimi_linear or kimi_k3)",
                     path, type);
        json_decref(top);
        return DF_EUNSUPPORTED;
    }
    cfg_reader r = {root, path, err, 0};
    int rc = cfg_read_text(&r, c);
    if (!rc) rc = cfg_read_linear_attn(&r, c);
    if (!rc) rc = cfg_check(&r, c);
    json_decref(top);
    if (rc) {
        if (!err || !err->code) df_error_set(err, DF_EFORMAT, "%s: invalid config", path);
        config_free(c);
        return err ? err->code : DF_EFORMAT;
    }
    return DF_OK;
}

void config_free(df_config *c) {
    free(c->mixer);
    free(c->ffn);
    c->mixer = c->ffn = NULL;
}

static int64_t params_kda(const df_config *c) {
    int64_t d = c->d, H = c->kda_heads, D = c->kda_dim, P = H * D;
    int64_t gate = c->full_rank_gate ? P * d : D * d + P * D;
    return 3 * P * d + 3 * P * c->conv_w + D * d + P * D + P + H + H * d + gate + D + d * P;
}

static int64_t params_mla(const df_config *c) {
    int64_t d = c->d, H = c->mla_heads, Nq = c->nope + c->rope, Lc = c->kv_lora;
    int64_t q = c->q_lora ? (int64_t)c->q_lora * d + c->q_lora + H * Nq * c->q_lora : H * Nq * d;
    int64_t gate = c->mla_out_gate ? H * c->vdim * d : 0;
    return q + (Lc + c->rope) * d + Lc + H * (c->nope + c->vdim) * Lc + d * H * c->vdim + gate;
}

int64_t config_layer_params(const df_config *c, int i) {
    int64_t d = c->d, Dz = config_expert_dim(c);
    int64_t n = 2 * d + (c->attn_res_block ? 4 * d : 0);
    n += c->mixer[i] == MIXER_KDA ? params_kda(c) : params_mla(c);
    if (c->ffn[i] == FFN_DENSE) return n + 3 * (int64_t)c->dense_inter * d;
    n += (int64_t)c->n_experts * (d + 1) + 3 * (int64_t)c->moe_inter * c->n_shared * d;
    if (c->latent_dim) n += 2 * Dz * d + (c->latent_norm ? Dz : 0);
    return n;
}

void config_param_counts(const df_config *c, df_param_counts *out) {
    int64_t d = c->d, Dz = config_expert_dim(c);
    memset(out, 0, sizeof *out);
    out->spine = 2 * (int64_t)c->vocab * d + d + (c->attn_res_block ? 2 * d : 0);
    out->per_expert = 3 * (int64_t)c->moe_inter * Dz;
    for (int i = 0; i < c->n_layers; i++) {
        out->spine += config_layer_params(c, i);
        out->n_moe_layers += c->ffn[i] != FFN_DENSE;
    }
    out->experts = out->per_expert * c->n_experts * out->n_moe_layers;
}
