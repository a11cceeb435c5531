/* cmd_synth.c — `deltafin synth --family k3|kimi-linear --layers N --experts E -o DIR`: writes a checkpoint
 * with the real tensor names, shapes, dtypes and shard layout of the family but N
 * decoder layers (layer 0 dense, the rest MoE) and E routed experts per layer, filled with random values of
 * sane scale (every byte written: no sparse files), plus config.json and the shard index. K3: one shard for
 * the top-level tensors and layer 0, then one shard per MoE layer holding its experts as contiguous spans
 * (w1, w2, w3 packed + scale, in string order of the expert id, 16 KiB aligned) followed by its spine.
 * Kimi-Linear: the same layout; `--expert-dtype mxfp4` writes its experts as MXFP4 like K3's (3.76 MB per expert
 * at 48B shapes instead of 14.2 MB in BF16). Benchmarks use it to get checkpoints larger than RAM. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#include "common/util.h"
#include "format/st_write.h"
#include "format/tensor_names.h"
#include "synth/synth_skew.h"

#define SYN_ALIGN 16384u
#define SYN_CHUNK (32u << 20)

enum { G_BF16, G_BF16_ONE, G_F32, G_F32_ONE, G_ALOG, G_U8, G_E8M0, G_VALS };

typedef struct syn_tensor {
    char name[192];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    int gen;
    int exp_hi;          /* G_BF16: largest binary exponent of |value| */
    int n_valid;         /* G_ALOG: entries past this are zero padding */
    const float *vals;   /* G_VALS: the F32 values */
    uint64_t bytes;
} syn_tensor;

typedef struct syn_shard {
    syn_tensor *t;
    int n, cap;
} syn_shard;

typedef struct syn_dims {
    int k3;
    int mxfp4;           /* routed experts as MXFP4 packed + E8M0 scales (else BF16) */
    int64_t d, vocab, hk, dk, hm, q_lora, kv_lora, nope, rope, vdim, dense_inter, inter, dz, n_shared;
    int layers, experts, topk;
    const float *bias;   /* --route-skew: [layers][experts] correction biases, NULL = random small ones */
} syn_dims;

/* Largest exponent for a matrix with `in` columns: values up to ~2/sqrt(in). */
static int exp_for(int64_t in) {
    int e = 0;
    while ((1ll << (2 * -(e - 1))) <= in) e--;
    return e;
}

/* Adds tensor `kind` of layer i (expert e) under its name in the tensor-name table for the family. */
static void add(syn_shard *s, const syn_dims *D, tensor_kind kind, int i, int e, const char *dtype, int gen, int ndim,
                int64_t a, int64_t b, int64_t c) {
    if (s->n == s->cap) s->t = xrealloc(s->t, sizeof *s->t * (size_t)(s->cap = s->cap ? 2 * s->cap : 64));
    syn_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    tensor_family fam = D->k3 ? TENSOR_FAMILY_K3 : TENSOR_FAMILY_KIMI_LINEAR;
    DF_ASSERT(tensor_name_format(kind, fam, i, e, t->name, sizeof t->name) > 0);
    t->dtype = dtype;
    t->gen = gen;
    t->ndim = ndim;
    int64_t sh[3] = {a, b, c};
    uint64_t n = 1;
    for (int k = 0; k < ndim; k++) n *= (uint64_t)(t->shape[k] = sh[k]);
    t->bytes = n * (uint64_t)st_dtype_size(dtype);
    t->exp_hi = exp_for(ndim >= 2 ? t->shape[ndim - 1] : 16);
}

static void mat(syn_shard *s, const syn_dims *D, tensor_kind k, int i, int64_t rows, int64_t cols) {
    add(s, D, k, i, -1, "BF16", G_BF16, 2, rows, cols, 0);
}
static void norm(syn_shard *s, const syn_dims *D, tensor_kind k, int i, int64_t len, int f32) {
    add(s, D, k, i, -1, f32 ? "F32" : "BF16", f32 ? G_F32_ONE : G_BF16_ONE, 1, len, 0, 0);
}

static void add_layer_spine(syn_shard *s, const syn_dims *D, int i) {
    int64_t d = D->d, pk = D->hk * D->dk;
    norm(s, D, TN_ATTN_NORM, i, d, 0);
    norm(s, D, TN_FFN_NORM, i, d, 0);
    if (D->k3) {
        norm(s, D, TN_ATTN_RES_NORM, i, d, 0);
        norm(s, D, TN_MLP_RES_NORM, i, d, 0);
        add(s, D, TN_ATTN_RES_PROJ, i, -1, "BF16", G_BF16, 2, 1, d, 0);
        add(s, D, TN_MLP_RES_PROJ, i, -1, "BF16", G_BF16, 2, 1, d, 0);
    }
    if (i % 4 != 3) {   /* KDA */
        static const tensor_kind proj[3] = {TN_ATTN_Q, TN_ATTN_K, TN_ATTN_V};
        static const tensor_kind conv[3] = {TN_KDA_Q_CONV, TN_KDA_K_CONV, TN_KDA_V_CONV};
        for (int j = 0; j < 3; j++) {
            mat(s, D, proj[j], i, pk, d);
            add(s, D, conv[j], i, -1, "F32", G_F32, 3, pk, 1, 4);
        }
        mat(s, D, TN_KDA_F_A, i, D->dk, d);
        mat(s, D, TN_KDA_F_B, i, pk, D->dk);
        add(s, D, TN_KDA_DT_BIAS, i, -1, "F32", G_F32, 1, pk, 0, 0);
        if (D->k3) add(s, D, TN_KDA_A_LOG, i, -1, "F32", G_ALOG, 1, D->dk, 0, 0);
        else add(s, D, TN_KDA_A_LOG, i, -1, "F32", G_ALOG, 3, 1, 1, D->hk);
        s->t[s->n - 1].n_valid = (int)D->hk;
        if (!D->k3) { s->t[s->n - 1].ndim = 4; s->t[s->n - 1].shape[3] = 1; }
        mat(s, D, TN_KDA_B, i, D->hk, d);
        if (D->k3) {
            mat(s, D, TN_ATTN_G, i, pk, d);
        } else {
            mat(s, D, TN_KDA_G_A, i, D->dk, d);
            mat(s, D, TN_KDA_G_B, i, pk, D->dk);
        }
        norm(s, D, TN_KDA_O_NORM, i, D->dk, D->k3);
        mat(s, D, TN_ATTN_O, i, d, pk);
    } else {            /* MLA */
        int64_t nq = D->nope + D->rope;
        if (D->q_lora) {
            mat(s, D, TN_MLA_Q_A, i, D->q_lora, d);
            norm(s, D, TN_MLA_Q_A_NORM, i, D->q_lora, 0);
            mat(s, D, TN_MLA_Q_B, i, D->hm * nq, D->q_lora);
        } else {
            mat(s, D, TN_ATTN_Q, i, D->hm * nq, d);
        }
        mat(s, D, TN_MLA_KV_A, i, D->kv_lora + D->rope, d);
        norm(s, D, TN_MLA_KV_A_NORM, i, D->kv_lora, 0);
        mat(s, D, TN_MLA_KV_B, i, D->hm * (D->nope + D->vdim), D->kv_lora);
        if (D->k3) mat(s, D, TN_ATTN_G, i, D->hm * D->vdim, d);
        mat(s, D, TN_ATTN_O, i, d, D->hm * D->vdim);
    }
    if (i == 0) {
        mat(s, D, TN_FFN_GATE, i, D->dense_inter, d);
        mat(s, D, TN_FFN_UP, i, D->dense_inter, d);
        mat(s, D, TN_FFN_DOWN, i, d, D->dense_inter);
        return;
    }
    mat(s, D, TN_MOE_ROUTER, i, D->experts, d);
    add(s, D, TN_MOE_BIAS, i, -1, "F32", D->bias ? G_VALS : G_F32, 1, D->experts, 0, 0);
    s->t[s->n - 1].vals = D->bias ? D->bias + (size_t)i * (size_t)D->experts : NULL;
    if (D->k3) {
        mat(s, D, TN_LATENT_DOWN, i, D->dz, d);
        norm(s, D, TN_LATENT_NORM, i, D->dz, 0);
        mat(s, D, TN_LATENT_UP, i, d, D->dz);
    }
    int64_t si = D->inter * D->n_shared;
    mat(s, D, TN_SHARED_GATE, i, si, d);
    mat(s, D, TN_SHARED_UP, i, si, d);
    mat(s, D, TN_SHARED_DOWN, i, d, si);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double synth_median(const double *v, int n) {
    double *c = xmalloc(sizeof *c * (size_t)n);
    memcpy(c, v, sizeof *c * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = c[n / 2];
    free(c);
    return m;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Experts of layer i in string order of their id, each one contiguous span. */
static void add_experts(syn_shard *s, const syn_dims *D, int i) {
    char **ids = xmalloc(sizeof *ids * (size_t)D->experts);
    for (int e = 0; e < D->experts; e++) {
        ids[e] = xmalloc(16);
        snprintf(ids[e], 16, "%d", e);
    }
    qsort(ids, (size_t)D->experts, sizeof *ids, cmp_str);
    int64_t dz = D->k3 ? D->dz : D->d, I = D->inter;
    for (int k = 0; k < D->experts; k++) {
        int e = atoi(ids[k]);
        for (int m = 0; m < 3; m++) {
            int64_t rows = m == 1 ? dz : I, cols = m == 1 ? I : dz;   /* w2 is [dz, I], w1 and w3 [I, dz] */
            if (D->mxfp4) {
                add(s, D, tensor_expert_kind(m, TENSOR_PART_PACKED), i, e, "U8", G_U8, 2, rows, cols / 2, 0);
                add(s, D, tensor_expert_kind(m, TENSOR_PART_SCALE), i, e, "U8", G_E8M0, 2, rows, cols / 32, 0);
            } else {
                add(s, D, tensor_expert_kind(m, TENSOR_PART_WEIGHT), i, e, "BF16", G_BF16, 2, rows, cols, 0);
            }
        }
        free(ids[k]);
    }
    free(ids);
}

static void add_globals(syn_shard *s, const syn_dims *D) {
    mat(s, D, TN_EMBED, -1, D->vocab, D->d);
    s->t[s->n - 1].exp_hi = -2;
    norm(s, D, TN_FINAL_NORM, -1, D->d, 0);
    mat(s, D, TN_LM_HEAD, -1, D->vocab, D->d);
    if (D->k3) {
        norm(s, D, TN_OUT_RES_NORM, -1, D->d, 0);
        add(s, D, TN_OUT_RES_PROJ, -1, -1, "BF16", G_BF16, 2, 1, D->d, 0);
    }
}

/* ---- values ---------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static float rng_unit(uint64_t *s) { return (float)(rng_next(s) >> 40) / (float)(1u << 24); }

/* Fills n bytes of tensor t starting at element byte offset `at` (a multiple of the element size). */
static void fill(const syn_tensor *t, uint64_t at, uint8_t *buf, size_t n, uint64_t *rng) {
    switch (t->gen) {
    case G_U8:
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = rng_next(rng);
            memcpy(buf + i, &r, n - i < 8 ? n - i : 8);
        }
        break;
    case G_E8M0:
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(112 + (rng_next(rng) >> 33) % 11);
        break;
    case G_BF16: {
        /* random sign and 7-bit mantissa, exponent in [exp_hi-3, exp_hi] */
        uint16_t base = (uint16_t)(127 + t->exp_hi - 3);
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = rng_next(rng);
            uint16_t h[4];
            for (int k = 0; k < 4; k++) {
                uint16_t v = (uint16_t)(r >> (16 * k));
                h[k] = (uint16_t)((v & 0x807F) | ((base + ((v >> 7) & 3)) << 7));
            }
            memcpy(buf + i, h, n - i < 8 ? n - i : 8);
        }
        break;
    }
    case G_BF16_ONE:
        for (size_t i = 0; i + 1 < n; i += 2) buf[i] = 0x80, buf[i + 1] = 0x3F;
        break;
    case G_VALS:
        memcpy(buf, (const uint8_t *)t->vals + at, n);
        break;
    case G_F32_ONE:
    case G_F32:
    case G_ALOG:
        for (size_t i = 0; i + 3 < n; i += 4) {
            uint64_t idx = (at + i) / 4;
            float v = t->gen == G_F32_ONE ? 1.0f
                      : t->gen == G_F32   ? (rng_unit(rng) - 0.5f) * 0.5f
                      : idx < (uint64_t)t->n_valid ? rng_unit(rng) * 2.0f : 0.0f;
            memcpy(buf + i, &v, 4);
        }
        break;
    }
}

static int write_all(int fd, const uint8_t *p, size_t n, const char *path) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "deltafin synth: %s: %s\n", path, strerror(errno));
            return -1;
        }
        p += w, n -= (size_t)w;
    }
    return 0;
}

static int write_shard(const char *dir, const char *file, const syn_shard *s, uint64_t seed, json_t *wmap,
                       uint64_t *total) {
    st_write_tensor *wt = xcalloc((size_t)s->n + 1, sizeof *wt);
    for (int i = 0; i < s->n; i++) {
        const syn_tensor *t = &s->t[i];
        wt[i] = (st_write_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .bytes = t->bytes};
        memcpy(wt[i].shape, t->shape, sizeof t->shape);
        json_object_set_new(wmap, t->name, json_string(file));
    }
    static const char *const meta[] = {"format", "pt", NULL};
    uint8_t *head = NULL;
    size_t hl = 0;
    uint64_t data = 0;
    df_error err;
    char *path = df_path_join(dir, file);
    int rc = st_write_header(wt, s->n, meta, SYN_ALIGN, &head, &hl, NULL, &data, &err) ? -1 : 0;
    free(wt);
    if (rc) fprintf(stderr, "deltafin synth: %s: %s\n", path, err.msg);
    *total += data;
    int fd = rc ? -1 : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!rc && fd < 0) {
        fprintf(stderr, "deltafin synth: %s: %s\n", path, strerror(errno));
        rc = -1;
    }
    if (!rc) rc = write_all(fd, head, hl, path);
    uint8_t *buf = xmalloc(SYN_CHUNK);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; !rc && i < s->n; i++) {
        const syn_tensor *t = &s->t[i];
        for (uint64_t at = 0; !rc && at < t->bytes; at += SYN_CHUNK) {
            size_t n = (size_t)DF_MIN((uint64_t)SYN_CHUNK, t->bytes - at);
            fill(t, at, buf, n, &rng);
            rc = write_all(fd, buf, n, path);
        }
    }
    if (fd >= 0 && close(fd) && !rc) rc = -1;
    free(buf);
    free(head);
    free(path);
    return rc;
}

static json_t *quant_config(void);

static json_t *make_config(const syn_dims *D) {
    json_t *kda = json_array(), *mla = json_array();
    for (int i = 0; i < D->layers; i++) json_array_append_new(i % 4 == 3 ? mla : kda, json_integer(i + 1));
    json_t *lac = json_pack("{s:o,s:o,s:I,s:I,s:I}", "kda_layers", kda, "full_attn_layers", mla, "num_heads",
                            (json_int_t)D->hk, "head_dim", (json_int_t)D->dk, "short_conv_kernel_size", (json_int_t)4);
    json_t *t = json_object();
    json_object_set_new(t, "model_type", json_string("kimi_linear"));
    json_object_set_new(t, "vocab_size", json_integer(D->vocab));
    json_object_set_new(t, "hidden_size", json_integer(D->d));
    json_object_set_new(t, "intermediate_size", json_integer(D->dense_inter));
    json_object_set_new(t, "moe_intermediate_size", json_integer(D->inter));
    json_object_set_new(t, "num_hidden_layers", json_integer(D->layers));
    json_object_set_new(t, "num_attention_heads", json_integer(D->hm));
    json_object_set_new(t, "num_key_value_heads", json_integer(D->hm));
    json_object_set_new(t, "q_lora_rank", D->q_lora ? json_integer(D->q_lora) : json_null());
    json_object_set_new(t, "kv_lora_rank", json_integer(D->kv_lora));
    json_object_set_new(t, "qk_nope_head_dim", json_integer(D->nope));
    json_object_set_new(t, "qk_rope_head_dim", json_integer(D->rope));
    json_object_set_new(t, "v_head_dim", json_integer(D->vdim));
    json_object_set_new(t, "mla_use_nope", json_true());
    json_object_set_new(t, "num_experts", json_integer(D->experts));
    json_object_set_new(t, "num_experts_per_token", json_integer(D->topk));
    json_object_set_new(t, "num_shared_experts", json_integer(D->n_shared));
    json_object_set_new(t, "first_k_dense_replace", json_integer(1));
    json_object_set_new(t, "moe_layer_freq", json_integer(1));
    json_object_set_new(t, "routed_scaling_factor", json_real(D->k3 ? 1.0 : 2.446));
    json_object_set_new(t, "moe_renormalize", json_true());
    json_object_set_new(t, "moe_router_activation_func", json_string("sigmoid"));
    json_object_set_new(t, "use_grouped_topk", json_true());
    json_object_set_new(t, "num_expert_group", json_integer(1));
    json_object_set_new(t, "topk_group", json_integer(1));
    json_object_set_new(t, "topk_method", json_string("noaux_tc"));
    json_object_set_new(t, "rms_norm_eps", json_real(1e-5));
    json_object_set_new(t, "tie_word_embeddings", json_false());
    json_object_set_new(t, "num_nextn_predict_layers", json_integer(0));
    json_object_set_new(t, "model_max_length", json_integer(1048576));
    json_object_set_new(t, "bos_token_id", json_integer(163584));
    json_object_set_new(t, "eos_token_id", json_integer(163586));
    json_object_set_new(t, "pad_token_id", json_integer(163839));
    json_object_set_new(t, "dtype", json_string("bfloat16"));
    if (!D->k3) {
        json_object_set_new(t, "hidden_act", json_string("silu"));
        json_object_set_new(t, "linear_attn_config", lac);
        json_object_set_new(t, "architectures", json_pack("[s]", "KimiLinearForCausalLM"));
        if (D->mxfp4) json_object_set_new(t, "quantization_config", quant_config());
        return t;
    }
    json_object_set_new(lac, "use_full_rank_gate", json_true());
    json_object_set_new(lac, "gate_lower_bound", json_real(-5.0));
    json_object_set_new(t, "linear_attn_config", lac);
    json_object_set_new(t, "hidden_act", json_string("situ"));
    json_object_set_new(t, "activation_situ_beta", json_real(4.0));
    json_object_set_new(t, "activation_situ_linear_beta", json_real(25.0));
    json_object_set_new(t, "mla_use_output_gate", json_true());
    json_object_set_new(t, "routed_expert_hidden_size", json_integer(D->dz));
    json_object_set_new(t, "latent_moe_use_norm", json_true());
    json_object_set_new(t, "attn_res_block_size", json_integer(12));
    json_t *top = json_pack("{s:s,s:[s],s:o,s:s}", "model_type", "kimi_k3", "architectures",
                            "KimiK3ForConditionalGeneration", "text_config", t, "dtype", "bfloat16");
    if (D->mxfp4) json_object_set_new(top, "quantization_config", quant_config());
    return top;
}

/* compressed-tensors' description of MXFP4 routed experts (everything else stays BF16). */
static json_t *quant_config(void) {
    return json_pack("{s:s,s:s,s:s,s:{s:{s:[s],s:s,s:{s:i,s:s,s:b,s:s,s:i,s:b,s:s,s:s}}},s:[s,s,s,s,s,s]}",
                          "quant_method", "compressed-tensors", "format", "mxfp4-pack-quantized",
                          "quantization_status", "compressed", "config_groups", "group_0", "targets", "Linear",
                          "format", "mxfp4-pack-quantized", "weights", "num_bits", 4, "type", "float", "symmetric", 1,
                          "strategy", "group", "group_size", 32, "dynamic", 0, "observer", "minmax", "scale_dtype",
                          "torch.uint8", "ignore", "lm_head", "re:.*self_attn.*", "re:.*mlp\\..*",
                          "re:.*shared_experts.*", "re:.*block_sparse_moe\\.gate$",
                          "re:.*routed_expert_(down|up)_proj$");
}

/* Correction biases for every MoE layer (each with its own ranking of the experts) so that popularity follows
 * a Zipf law of exponent skew. The gate rows are random bf16 of the magnitudes fill() writes and the router's
 * input is RMS-normalised with unit weights, so its logits have variance d E[w^2]. */
static float *synth_skew_biases(const syn_dims *D, double skew, uint64_t seed) {
    int hi = exp_for(D->d);
    double w2 = 0;
    for (int e = hi - 3; e <= hi; e++) w2 += ldexp(1.0, 2 * e) / 4;
    double sigma = sqrt((double)D->d * w2 * 7.0 / 3.0);   /* E[(1 + u)^2] = 7/3 for the mantissa u */
    float *bias = xcalloc((size_t)D->layers * (size_t)D->experts, sizeof *bias);
    double *target = xmalloc(sizeof *target * (size_t)D->experts);
    for (int l = 1; l < D->layers; l++) {
        synth_zipf_targets(D->experts, D->topk, skew, seed + (uint64_t)l, target);
        synth_route_bias(D->experts, D->topk, target, sigma, seed + (uint64_t)l, bias + (size_t)l * (size_t)D->experts);
    }
    double top = 0;
    for (int e = 0; e < D->experts; e++) top = DF_MAX(top, target[e]);
    fprintf(stderr, "deltafin synth: route skew %.2f: router logits sd %.2f; the most popular expert is meant for "
            "%.1f%% of tokens, the median for %.2f%%\n", skew, sigma, 100 * top,
            100 * synth_median(target, D->experts));
    free(target);
    return bias;
}

int cmd_synth(int argc, char **argv) {
    static const struct option lo[] = {{"family", 1, 0, 'f'}, {"layers", 1, 0, 'l'}, {"experts", 1, 0, 'e'},
                                       {"out", 1, 0, 'o'},    {"vocab", 1, 0, 'v'},  {"experts-per-token", 1, 0, 'k'},
                                       {"seed", 1, 0, 's'},   {"help", 0, 0, 'h'},   {"expert-dtype", 1, 0, 'd'},
                                       {"route-skew", 1, 0, 'z'}, {0, 0, 0, 0}};
    const char *family = NULL, *out = NULL, *edt = NULL;
    int layers = 0, experts = 0, topk = 0, c;
    long long vocab = 163840;
    uint64_t seed = 1;
    double skew = 0;
    char *end = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "f:l:e:o:v:k:s:d:hz:", lo, NULL)) != -1) {
        switch (c) {
        case 'f': family = optarg; break;
        case 'l': layers = atoi(optarg); break;
        case 'e': experts = atoi(optarg); break;
        case 'o': out = optarg; break;
        case 'v': vocab = atoll(optarg); break;
        case 'k': topk = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'd': edt = optarg; break;
        case 'z':
            skew = strtod(optarg, &end);
            if (end == optarg || *end || !(skew >= 0 && skew <= 8)) {
                fprintf(stderr, "deltafin synth: --route-skew: expected a Zipf exponent in [0, 8], got '%s'\n", optarg);
                return 2;
            }
            break;
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: deltafin synth --family k3|kimi-linear --layers N --experts E -o DIR [--vocab V] "
                    "[--experts-per-token K] [--seed S] [--expert-dtype bf16|mxfp4] [--route-skew Z]\n  N decoder layers: layer 0 "
                    "dense, layers 1..N-1 MoE with E experts each; real hidden sizes and dtypes of the family; routed\n"
                    "  experts MXFP4 (K3's default) or BF16 (Kimi-Linear's default)\n  --route-skew Z: router biases "
                    "make expert popularity a Zipf law with exponent Z (0 = balanced)\n");
            return c == 'h' ? 0 : 2;
        }
    }
    int k3 = family && !strcmp(family, "k3");
    if (!family || (!k3 && strcmp(family, "kimi-linear")) || layers < 1 || experts < 1 || !out || vocab < 16) {
        fprintf(stderr, "deltafin synth: need --family k3|kimi-linear, --layers N >= 1, --experts E >= 1, -o DIR\n");
        return 2;
    }
    syn_dims D = k3 ? (syn_dims){1, 1, 7168, vocab, 96, 128, 96, 1536, 512, 128, 64, 128, 33792, 3072, 3584, 2, 0, 0, 0, NULL}
                    : (syn_dims){0, 0, 2304, vocab, 32, 128, 32, 0, 512, 128, 64, 128, 9216, 1024, 0, 1, 0, 0, 0, NULL};
    D.mxfp4 = edt ? !strcmp(edt, "mxfp4") : k3;
    if (edt && strcmp(edt, "mxfp4") && strcmp(edt, "bf16")) {
        fprintf(stderr, "deltafin synth: --expert-dtype: expected bf16 or mxfp4, got '%s'\n", edt);
        return 2;
    }
    D.layers = layers;
    D.experts = experts;
    D.topk = topk > 0 ? topk : DF_MIN(experts, k3 ? 16 : 8);
    if (D.topk > experts) {
        fprintf(stderr, "deltafin synth: --experts-per-token %d exceeds --experts %d\n", D.topk, experts);
        return 2;
    }
    float *bias = skew > 0 ? synth_skew_biases(&D, skew, seed) : NULL;
    D.bias = bias;
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "deltafin synth: %s: %s\n", out, strerror(errno));
        return 1;
    }
    int n_shards = layers;   /* shard 1: globals + layer 0; shard i+1: MoE layer i */
    json_t *wmap = json_object();
    uint64_t total = 0;
    int rc = 0;
    double t0 = df_now();
    for (int sh = 0; !rc && sh < n_shards; sh++) {
        syn_shard s = {0};
        if (sh == 0) {
            add_globals(&s, &D);
            add_layer_spine(&s, &D, 0);
        } else {
            add_experts(&s, &D, sh);
            add_layer_spine(&s, &D, sh);
        }
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%06d.safetensors", sh + 1, n_shards);
        rc = write_shard(out, file, &s, seed + (uint64_t)sh, wmap, &total);
        free(s.t);
        fprintf(stderr, "\rdeltafin synth: %d/%d shards, %.1f GB, %.0f s", sh + 1, n_shards, total / 1e9,
                df_now() - t0);
    }
    fprintf(stderr, "\n");
    if (!rc) {
        json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        char *p = df_path_join(out, "model.safetensors.index.json");
        rc = json_dump_file(idx, p, JSON_INDENT(1) | JSON_SORT_KEYS);
        free(p);
        json_decref(idx);
        json_t *cfg = make_config(&D);
        p = df_path_join(out, "config.json");
        if (!rc) rc = json_dump_file(cfg, p, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        free(p);
        json_decref(cfg);
    } else {
        json_decref(wmap);
    }
    free(bias);
    if (rc) {
        fprintf(stderr, "deltafin synth: failed writing %s\n", out);
        return 1;
    }
    printf("%s: %s, %d layers, %d %s experts per MoE layer, top-%d, %.2f GB in %d shards\n", out,
           k3 ? "kimi_k3" : "kimi_linear", layers, experts, D.mxfp4 ? "MXFP4" : "BF16", D.topk, total / 1e9, n_shards);
    return 0;
}
