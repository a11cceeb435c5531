/* weights.h — every spine tensor the forward pass uses, resolved and checked once when the model opens.
 *
 * Matrices are the df_tensor structs storage fills when it acquires a layer (store_layer_table): their name,
 * dtype and shape are checked here once, and a streamed spine only swaps the bytes behind them, so a matrix may
 * be used only while its layer is acquired. Small 1-D tensors (norms, biases, A_log, dt_bias, short-conv
 * weights, the router's correction bias) are converted to fp32 here and stay resident. Internal to src/model. */
#ifndef DF_WEIGHTS_H
#define DF_WEIGHTS_H

#include "common/tensor.h"
#include "deltafin.h"

/* Gate, up and down projections of a GLU FFN (dense, shared experts): [inter, d], [inter, d], [d, inter]. */
typedef struct glu_weights {
    const df_tensor *gate, *up, *down;
    int inter;
} glu_weights;

typedef struct kda_weights {
    const df_tensor *q, *k, *v, *fa, *fb, *b, *ga, *gb, *g, *o;   /* g: full-rank gate, else ga/gb */
    float *conv[3];            /* q, k, v short-conv weights [P, W] */
    float *dt_bias, *alog, *onorm;
} kda_weights;

typedef struct mla_weights {
    const df_tensor *q, *qa, *qb, *kva, *kvb, *g, *o;   /* q without query LoRA, else qa/qb; g: output gate */
    float *qa_norm, *kv_norm;
} mla_weights;

typedef struct moe_weights {
    const df_tensor *gate;     /* router [E, d] */
    float *bias;               /* correction bias [E], for selection only */
    glu_weights shared;        /* gate NULL without shared experts */
    const df_tensor *latent_down, *latent_up;   /* K3's latent projections, NULL without */
    float *latent_norm;
} moe_weights;

typedef struct layer_weights {
    float *attn_norm, *ffn_norm;                 /* input_layernorm, post_attention_layernorm */
    float *attn_res_norm, *attn_res_proj;        /* block attention residuals (NULL without) */
    float *mlp_res_norm, *mlp_res_proj;
    kda_weights kda;                             /* the mixer the config names for this layer */
    mla_weights mla;
    moe_weights moe;                             /* the FFN the config names for this layer */
    glu_weights ffn;
} layer_weights;

typedef struct model_weights {
    const df_tensor *embed, *head;
    float *norm, *out_res_norm, *out_res_proj;
    layer_weights *layers;     /* [n_layers] */
    float **owned;             /* the resident fp32 vectors, freed with the weights */
    int n_owned, owned_cap;
} model_weights;

struct df_model;
/* Resolves and checks every tensor of the config's layers (names, shapes, dtypes, expert counts) without
 * reading a streamed layer; an error names the tensor and the model folder. */
int model_weights_bind(struct df_model *m, df_error *err);
void model_weights_free(model_weights *w);

/* NULL t: missing. Checks a matrix's shape and dtype; name and dir are for the message. */
int tensor_check_mat(const df_tensor *t, const char *name, int64_t rows, int64_t cols, const char *dir,
                     df_error *err);

#endif
