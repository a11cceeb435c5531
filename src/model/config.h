/* config.h — the model configuration read from config.json, and the layer schedule derived from it.
 *
 * Both families share one struct: Kimi-Linear (model_type "kimi_linear") and Kimi K3 (top-level
 * "kimi_k3" whose text model is under "text_config"). K3-only features are off (0) for Kimi-Linear.
 * Layer kinds come from the 1-based lists in linear_attn_config, never from a hard-coded pattern. */
#ifndef DF_CONFIG_H
#define DF_CONFIG_H

#include <stdint.h>
#include "deltafin.h"

/* Bounds that keep per-token scratch on the stack; configs past them are refused, not truncated. */
#define CONFIG_MAX_EXPERT_GROUPS 1024
#define CONFIG_MAX_ATTN_RES_BLOCKS 256
#define CONFIG_MAX_LAYERS 65536

typedef enum { MIXER_KDA = 0, MIXER_MLA = 1 } df_mixer_kind;
typedef enum { FFN_DENSE = 0, FFN_MOE = 1 } df_ffn_kind;

typedef struct df_config {
    int is_k3;
    int vocab, d, n_layers;
    float eps;
    int64_t max_ctx;
    int bos_id, eos_id;

    /* FFN */
    int dense_inter;           /* intermediate_size */
    int use_situ;              /* hidden_act "situ" (else SiLU) */
    float situ_beta, situ_lin_beta;   /* situ_lin_beta <= 0: the up projection is used raw */

    /* MoE */
    int n_experts, topk, n_shared, moe_inter;
    int n_group, topk_group;
    int renorm;
    float routed_scale;
    int first_dense, moe_freq;
    int latent_dim;            /* routed_expert_hidden_size; 0 = experts run at width d */
    int latent_norm;

    /* KDA */
    int kda_heads, kda_dim, conv_w;
    int full_rank_gate;
    int has_lower_bound;
    float lower_bound;

    /* MLA */
    int mla_heads, q_lora, kv_lora, nope, rope, vdim;
    int mla_out_gate;

    int attn_res_block;        /* 0 = ordinary residuals */

    uint8_t *mixer;            /* [n_layers] df_mixer_kind */
    uint8_t *ffn;              /* [n_layers] df_ffn_kind */
} df_config;

/* Parses config.json text; path is only used in messages. */
int config_parse(df_config *cfg, const char *json_text, const char *path, df_error *err);
void config_free(df_config *cfg);
/* Parameter counts implied by the config: spine (everything but routed experts), one routed expert, and
 * all routed experts. */
typedef struct {
    int64_t spine, per_expert, experts, n_moe_layers;
} df_param_counts;
void config_param_counts(const df_config *c, df_param_counts *out);
/* The spine parameters of layer i (its mixer, norms, router and shared or dense FFN: what counts in .spine). */
int64_t config_layer_params(const df_config *c, int i);

/* Width of the routed experts' input/output (latent width for K3, d otherwise). */
static inline int config_expert_dim(const df_config *c) { return c->latent_dim ? c->latent_dim : c->d; }

#endif
