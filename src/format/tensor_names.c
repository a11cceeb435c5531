/* tensor_names.c — the checkpoint tensor-name table and its classifier (tensor_names.h). The table lists each
 * kind's canonical name first; a later row of the same kind is an alternate spelling some writer produces. */
#include "tensor_names.h"

#include <stdio.h>
#include <string.h>

enum { KL = 1 << TENSOR_FAMILY_KIMI_LINEAR, K3 = 1 << TENSOR_FAMILY_K3, BOTH = KL | K3 };

#define TN_LAYER_PREFIX "model.layers."
#define TN_EXPERT_PREFIX "block_sparse_moe.experts."

typedef struct tensor_name_row {
    tensor_kind kind;
    int families;
    const char *name;
} tensor_name_row;

static const tensor_name_row tensor_rows[] = {
    {TN_EMBED, BOTH, "model.embed_tokens.weight"},
    {TN_FINAL_NORM, BOTH, "model.norm.weight"},
    {TN_LM_HEAD, BOTH, "lm_head.weight"},
    {TN_OUT_RES_NORM, K3, "model.output_attn_res_norm.weight"},
    {TN_OUT_RES_PROJ, K3, "model.output_attn_res_proj.weight"},

    {TN_ATTN_NORM, BOTH, "input_layernorm.weight"},
    {TN_FFN_NORM, BOTH, "post_attention_layernorm.weight"},
    {TN_ATTN_RES_NORM, K3, "self_attention_res_norm.weight"},
    {TN_ATTN_RES_PROJ, K3, "self_attention_res_proj.weight"},
    {TN_MLP_RES_NORM, K3, "mlp_res_norm.weight"},
    {TN_MLP_RES_PROJ, K3, "mlp_res_proj.weight"},
    {TN_ATTN_Q, BOTH, "self_attn.q_proj.weight"},
    {TN_ATTN_K, BOTH, "self_attn.k_proj.weight"},
    {TN_ATTN_V, BOTH, "self_attn.v_proj.weight"},
    {TN_ATTN_O, BOTH, "self_attn.o_proj.weight"},
    {TN_ATTN_G, K3, "self_attn.g_proj.weight"},
    {TN_KDA_Q_CONV, BOTH, "self_attn.q_conv1d.weight"},
    {TN_KDA_K_CONV, BOTH, "self_attn.k_conv1d.weight"},
    {TN_KDA_V_CONV, BOTH, "self_attn.v_conv1d.weight"},
    {TN_KDA_F_A, BOTH, "self_attn.f_a_proj.weight"},
    {TN_KDA_F_B, BOTH, "self_attn.f_b_proj.weight"},
    {TN_KDA_DT_BIAS, BOTH, "self_attn.dt_bias"},
    {TN_KDA_A_LOG, BOTH, "self_attn.A_log"},
    {TN_KDA_B, BOTH, "self_attn.b_proj.weight"},
    {TN_KDA_G_A, KL, "self_attn.g_a_proj.weight"},
    {TN_KDA_G_B, KL, "self_attn.g_b_proj.weight"},
    {TN_KDA_O_NORM, BOTH, "self_attn.o_norm.weight"},
    {TN_MLA_Q_A, BOTH, "self_attn.q_a_proj.weight"},
    {TN_MLA_Q_A_NORM, BOTH, "self_attn.q_a_layernorm.weight"},
    {TN_MLA_Q_B, BOTH, "self_attn.q_b_proj.weight"},
    {TN_MLA_KV_A, BOTH, "self_attn.kv_a_proj_with_mqa.weight"},
    {TN_MLA_KV_A_NORM, BOTH, "self_attn.kv_a_layernorm.weight"},
    {TN_MLA_KV_B, BOTH, "self_attn.kv_b_proj.weight"},
    {TN_FFN_GATE, BOTH, "mlp.gate_proj.weight"},
    {TN_FFN_UP, BOTH, "mlp.up_proj.weight"},
    {TN_FFN_DOWN, BOTH, "mlp.down_proj.weight"},
    {TN_MOE_ROUTER, BOTH, "block_sparse_moe.gate.weight"},
    {TN_MOE_BIAS, BOTH, "block_sparse_moe.gate.e_score_correction_bias"},
    {TN_SHARED_GATE, BOTH, "block_sparse_moe.shared_experts.gate_proj.weight"},
    {TN_SHARED_UP, BOTH, "block_sparse_moe.shared_experts.up_proj.weight"},
    {TN_SHARED_DOWN, BOTH, "block_sparse_moe.shared_experts.down_proj.weight"},
    {TN_LATENT_DOWN, K3, "block_sparse_moe.routed_expert_down_proj.weight"},
    {TN_LATENT_NORM, K3, "block_sparse_moe.routed_expert_norm.weight"},
    {TN_LATENT_UP, K3, "block_sparse_moe.routed_expert_up_proj.weight"},

    {TN_EXPERT_FIRST + 0, BOTH, "w1.weight"},
    {TN_EXPERT_FIRST + 1, BOTH, "w1.weight_packed"},
    {TN_EXPERT_FIRST + 2, BOTH, "w1.weight_scale"},
    {TN_EXPERT_FIRST + 3, BOTH, "w1.weight_shape"},
    {TN_EXPERT_FIRST + 4, BOTH, "w2.weight"},
    {TN_EXPERT_FIRST + 5, BOTH, "w2.weight_packed"},
    {TN_EXPERT_FIRST + 6, BOTH, "w2.weight_scale"},
    {TN_EXPERT_FIRST + 7, BOTH, "w2.weight_shape"},
    {TN_EXPERT_FIRST + 8, BOTH, "w3.weight"},
    {TN_EXPERT_FIRST + 9, BOTH, "w3.weight_packed"},
    {TN_EXPERT_FIRST + 10, BOTH, "w3.weight_scale"},
    {TN_EXPERT_FIRST + 11, BOTH, "w3.weight_shape"},

    /* transformers' save_pretrained renames every ".mlp." of Kimi-Linear to ".block_sparse_moe.", the dense
     * FFN of the first layers included */
    {TN_FFN_GATE, KL, "block_sparse_moe.gate_proj.weight"},
    {TN_FFN_UP, KL, "block_sparse_moe.up_proj.weight"},
    {TN_FFN_DOWN, KL, "block_sparse_moe.down_proj.weight"},
};

#define TN_N_ROWS ((int)(sizeof tensor_rows / sizeof tensor_rows[0]))

tensor_class tensor_kind_class(tensor_kind kind) {
    if (kind >= TN_EMBED && kind <= TN_OUT_RES_PROJ) return TENSOR_TOP;
    if (kind >= TN_ATTN_NORM && kind <= TN_LATENT_UP) return TENSOR_SPINE;
    if (kind >= TN_EXPERT_FIRST && kind < TN_KIND_COUNT) return TENSOR_EXPERT;
    return TENSOR_UNKNOWN;
}

tensor_family tensor_family_of(const char *model_type) {
    return model_type && !strcmp(model_type, "kimi_k3") ? TENSOR_FAMILY_K3 : TENSOR_FAMILY_KIMI_LINEAR;
}

tensor_family tensor_family_guess(const char *full_name) {
    return strncmp(full_name, TENSOR_K3_PREFIX, strlen(TENSOR_K3_PREFIX)) ? TENSOR_FAMILY_KIMI_LINEAR
                                                                           : TENSOR_FAMILY_K3;
}

int tensor_kind_in_family(tensor_kind kind, tensor_family family) {
    for (int i = 0; i < TN_N_ROWS; i++)
        if (tensor_rows[i].kind == kind) return (tensor_rows[i].families >> family) & 1;
    return 0;
}

const char *tensor_name_suffix(tensor_kind kind) {
    for (int i = 0; i < TN_N_ROWS; i++)
        if (tensor_rows[i].kind == kind) return tensor_rows[i].name;
    return NULL;
}

/* The kind of class cls the family spells `name`, or TN_NONE. */
static tensor_kind tensor_lookup(const char *name, tensor_family family, tensor_class cls) {
    for (int i = 0; i < TN_N_ROWS; i++)
        if ((tensor_rows[i].families >> family & 1) && tensor_kind_class(tensor_rows[i].kind) == cls &&
            !strcmp(tensor_rows[i].name, name))
            return tensor_rows[i].kind;
    return TN_NONE;
}

/* Parses a canonical decimal (no sign, no leading zero) below max at *s, advancing past it; -1 if none. */
static long tensor_parse_index(const char **s, long max) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v >= max) return -1;
    }
    *s = p;
    return v;
}

tensor_class tensor_classify(const char *name, tensor_family family, int *layer, int *expert, tensor_kind *kind) {
    int l_ = -1, e_ = -1;
    tensor_kind k_ = TN_NONE;
    tensor_class c = TENSOR_UNKNOWN;
    const char *p = name;
    size_t pl = strlen(TENSOR_K3_PREFIX), ll = strlen(TN_LAYER_PREFIX), el = strlen(TN_EXPERT_PREFIX);
    if (family == TENSOR_FAMILY_K3 && strncmp(p, TENSOR_K3_PREFIX, pl)) {
        c = TENSOR_NON_TEXT;
    } else if (family == TENSOR_FAMILY_K3) {
        p += pl;
    }
    if (c == TENSOR_UNKNOWN && !strncmp(p, TN_LAYER_PREFIX, ll)) {
        const char *q = p + ll;
        long l = tensor_parse_index(&q, TENSOR_MAX_LAYERS);
        if (l >= 0 && *q == '.') {
            l_ = (int)l;
            q++;
            if (!strncmp(q, TN_EXPERT_PREFIX, el)) {
                const char *r = q + el;
                long e = tensor_parse_index(&r, TENSOR_MAX_EXPERTS);
                if (e >= 0 && *r == '.') {
                    e_ = (int)e;
                    if ((k_ = tensor_lookup(r + 1, family, TENSOR_EXPERT))) c = TENSOR_EXPERT;
                }
            } else if ((k_ = tensor_lookup(q, family, TENSOR_SPINE))) {
                c = TENSOR_SPINE;
            }
        }
    } else if (c == TENSOR_UNKNOWN && (k_ = tensor_lookup(p, family, TENSOR_TOP))) {
        c = TENSOR_TOP;
    }
    if (layer) *layer = l_;
    if (expert) *expert = e_;
    if (kind) *kind = k_;
    return c;
}

int tensor_name_format(tensor_kind kind, tensor_family family, int layer, int expert, char *buf, size_t cap) {
    if (!tensor_kind_in_family(kind, family)) return -1;
    const char *pre = family == TENSOR_FAMILY_K3 ? TENSOR_K3_PREFIX : "", *suffix = tensor_name_suffix(kind);
    int n;
    switch (tensor_kind_class(kind)) {
    case TENSOR_TOP: n = snprintf(buf, cap, "%s%s", pre, suffix); break;
    case TENSOR_SPINE: n = snprintf(buf, cap, "%s" TN_LAYER_PREFIX "%d.%s", pre, layer, suffix); break;
    default: n = snprintf(buf, cap, "%s" TN_LAYER_PREFIX "%d." TN_EXPERT_PREFIX "%d.%s", pre, layer, expert, suffix);
    }
    return n >= 0 && (size_t)n < cap ? n : -1;
}
