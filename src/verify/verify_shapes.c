/* verify_shapes.c — the config against the published Kimi K3 values, and every tensor of a checkpoint against
 * the shapes its config gives (verify.h). The shapes are written out here from the config's meaning, apart from
 * the model's own binding code (model/weights.c), so that a mistake in one is caught by the other. */
#include "verify.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* ---------------------------------------------------------------------------------------------------- */
/* The published K3 text config (SPEC tables; the values the original Deltafin's config validator pins). */

#define K3_LAYERS 93
#define K3_EXPERTS 896

typedef struct k3_value {
    const char *key;
    double got, want;
} k3_value;

static int k3_mla_layer(int l) { return l % 4 == 3 || l == 91 || l == 92; }   /* 0-based: 3, 7, ..., 87, 91, 92 */

static void k3_list(verify_report *r, const char *check, const k3_value *v, int n, verify_result bad,
                    const char *ok_text) {
    char msg[1024] = "";
    int o = 0, wrong = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].got == v[i].want) continue;
        wrong++;
        if (o < (int)sizeof msg - 120)
            o += snprintf(msg + o, sizeof msg - (size_t)o, "%s%s is %g, K3 has %g", o ? "; " : "", v[i].key, v[i].got,
                          v[i].want);
    }
    if (wrong) verify_say(r, bad, check, "%d value%s differ%s: %s", wrong, wrong > 1 ? "s" : "", wrong > 1 ? "" : "s",
                          msg);
    else verify_say(r, VERIFY_PASS, check, "%s", ok_text);
}

void verify_config_k3(const df_config *c, verify_report *r, int *published) {
    const k3_value shape[] = {
        {"hidden_size", c->d, 7168},
        {"intermediate_size", c->dense_inter, 33792},
        {"moe_intermediate_size", c->moe_inter, 3072},
        {"routed_expert_hidden_size", c->latent_dim, 3584},
        {"latent_moe_use_norm", c->latent_norm, 1},
        {"num_shared_experts", c->n_shared, 2},
        {"first_k_dense_replace", c->first_dense, 1},
        {"moe_layer_freq", c->moe_freq, 1},
        {"linear_attn_config.num_heads", c->kda_heads, 96},
        {"linear_attn_config.head_dim", c->kda_dim, 128},
        {"linear_attn_config.short_conv_kernel_size", c->conv_w, 4},
        {"linear_attn_config.use_full_rank_gate", c->full_rank_gate, 1},
        {"linear_attn_config.gate_lower_bound", c->has_lower_bound ? c->lower_bound : 0, -5.0},
        {"num_attention_heads", c->mla_heads, 96},
        {"q_lora_rank", c->q_lora, 1536},
        {"kv_lora_rank", c->kv_lora, 512},
        {"qk_nope_head_dim", c->nope, 128},
        {"qk_rope_head_dim", c->rope, 64},
        {"v_head_dim", c->vdim, 128},
        {"mla_use_output_gate", c->mla_out_gate, 1},
        {"hidden_act situ", c->use_situ, 1},
        {"activation_situ_beta", c->situ_beta, 4.0},
        {"activation_situ_linear_beta", c->situ_lin_beta, 25.0},
        {"rms_norm_eps", c->eps, (float)1e-5},
        {"routed_scaling_factor", c->routed_scale, 1.0},
        {"moe_renormalize", c->renorm, 1},
        {"num_expert_group", c->n_group, 1},
        {"topk_group", c->topk_group, 1},
        {"attn_res_block_size", c->attn_res_block, 12},
    };
    k3_list(r, "config: Kimi K3 values", shape, (int)(sizeof shape / sizeof *shape), VERIFY_FAIL,
            "every shape and behaviour value is the published K3's (hidden 7168, KDA 96x128, MLA 96 heads, "
            "latent MoE 3584, SiTU)");
    int sched_ok = 1;
    for (int l = 0; l < c->n_layers && sched_ok; l++)
        sched_ok = (c->mixer[l] == MIXER_MLA) == k3_mla_layer(l);
    *published = c->n_layers == K3_LAYERS && c->n_experts == K3_EXPERTS && c->vocab == 163840;
    if (!*published) {
        verify_say(r, VERIFY_SKIP, "config: Kimi K3 sizes",
                   "a K3-shaped checkpoint with %d layers, %d experts per MoE layer and a vocabulary of %d, not the "
                   "published Kimi K3 (93 layers, 896 experts, 163840): its token oracle does not apply",
                   c->n_layers, c->n_experts, c->vocab);
        return;
    }
    const k3_value size[] = {
        {"num_experts_per_token", c->topk, 16},
        {"layer schedule (1 = MLA where K3 has one, 0 = elsewhere)", sched_ok, 1},
        {"model_max_length", (double)c->max_ctx, 1048576},
        /* ids of the published vocabulary: a trimmed one (a K3-shaped synthetic) has none of them */
        {"bos_token_id", c->bos_id, 163584},
        {"eos_token_id", c->eos_id, 163586},
    };
    k3_list(r, "config: Kimi K3 sizes", size, (int)(sizeof size / sizeof *size), VERIFY_FAIL,
            "93 layers (MLA at 4, 8, ..., 88, 92, 93), 896 experts, top-16, vocabulary 163840: the published K3");
}

/* ---------------------------------------------------------------------------------------------------- */
/* Tensor shapes from the config. */

typedef struct shape {
    int ndim;
    int64_t d[4];
} shape;

#define SH1(a) ((shape){1, {(a)}})
#define SH2(a, b) ((shape){2, {(a), (b)}})
#define SH3(a, b, c) ((shape){3, {(a), (b), (c)}})
#define SH4(a, b, c, e) ((shape){4, {(a), (b), (c), (e)}})

/* The shape of a top-level kind (layer < 0) or of a kind of layer `layer`; ndim 0 when the config has no such
 * tensor there. */
static shape kind_shape(const df_config *c, int k3, tensor_kind k, int layer) {
    int64_t d = c->d, V = c->vocab;
    int ar = c->attn_res_block > 0;
    if (layer < 0) switch (k) {
        case TN_EMBED: case TN_LM_HEAD: return SH2(V, d);
        case TN_FINAL_NORM: return SH1(d);
        case TN_OUT_RES_NORM: return ar ? SH1(d) : (shape){0};
        case TN_OUT_RES_PROJ: return ar ? SH2(1, d) : (shape){0};
        default: return (shape){0};
        }
    if (layer >= c->n_layers) return (shape){0};
    int kda = c->mixer[layer] == MIXER_KDA, moe = c->ffn[layer] == FFN_MOE;
    int64_t pk = (int64_t)c->kda_heads * c->kda_dim, hm = c->mla_heads, nq = c->nope + c->rope;
    int64_t sh = (int64_t)c->moe_inter * c->n_shared, dz = c->latent_dim;
    switch (k) {
    case TN_ATTN_NORM: case TN_FFN_NORM: return SH1(d);
    case TN_ATTN_RES_NORM: case TN_MLP_RES_NORM: return ar ? SH1(d) : (shape){0};
    case TN_ATTN_RES_PROJ: case TN_MLP_RES_PROJ: return ar ? SH2(1, d) : (shape){0};
    case TN_ATTN_Q: return kda ? SH2(pk, d) : c->q_lora ? (shape){0} : SH2(hm * nq, d);
    case TN_ATTN_K: case TN_ATTN_V: return kda ? SH2(pk, d) : (shape){0};
    case TN_ATTN_O: return kda ? SH2(d, pk) : SH2(d, hm * c->vdim);
    case TN_ATTN_G:
        if (kda) return c->full_rank_gate ? SH2(pk, d) : (shape){0};
        return c->mla_out_gate ? SH2(hm * c->vdim, d) : (shape){0};
    case TN_KDA_Q_CONV: case TN_KDA_K_CONV: case TN_KDA_V_CONV: return kda ? SH3(pk, 1, c->conv_w) : (shape){0};
    case TN_KDA_F_A: return kda ? SH2(c->kda_dim, d) : (shape){0};
    case TN_KDA_F_B: return kda ? SH2(pk, c->kda_dim) : (shape){0};
    case TN_KDA_DT_BIAS: return kda ? SH1(pk) : (shape){0};
    /* K3 stores A_log zero-padded from the heads to the head dimension; Kimi-Linear as [1, 1, heads, 1] */
    case TN_KDA_A_LOG: return !kda ? (shape){0} : k3 ? SH1(c->kda_dim) : SH4(1, 1, c->kda_heads, 1);
    case TN_KDA_B: return kda ? SH2(c->kda_heads, d) : (shape){0};
    case TN_KDA_G_A: return kda && !c->full_rank_gate ? SH2(c->kda_dim, d) : (shape){0};
    case TN_KDA_G_B: return kda && !c->full_rank_gate ? SH2(pk, c->kda_dim) : (shape){0};
    case TN_KDA_O_NORM: return kda ? SH1(c->kda_dim) : (shape){0};
    case TN_MLA_Q_A: return !kda && c->q_lora ? SH2(c->q_lora, d) : (shape){0};
    case TN_MLA_Q_A_NORM: return !kda && c->q_lora ? SH1(c->q_lora) : (shape){0};
    case TN_MLA_Q_B: return !kda && c->q_lora ? SH2(hm * nq, c->q_lora) : (shape){0};
    case TN_MLA_KV_A: return kda ? (shape){0} : SH2(c->kv_lora + c->rope, d);
    case TN_MLA_KV_A_NORM: return kda ? (shape){0} : SH1(c->kv_lora);
    case TN_MLA_KV_B: return kda ? (shape){0} : SH2(hm * (c->nope + c->vdim), c->kv_lora);
    case TN_FFN_GATE: case TN_FFN_UP: return moe ? (shape){0} : SH2(c->dense_inter, d);
    case TN_FFN_DOWN: return moe ? (shape){0} : SH2(d, c->dense_inter);
    case TN_MOE_ROUTER: return moe ? SH2(c->n_experts, d) : (shape){0};
    case TN_MOE_BIAS: return moe ? SH1(c->n_experts) : (shape){0};
    case TN_SHARED_GATE: case TN_SHARED_UP: return moe && sh ? SH2(sh, d) : (shape){0};
    case TN_SHARED_DOWN: return moe && sh ? SH2(d, sh) : (shape){0};
    case TN_LATENT_DOWN: return moe && dz ? SH2(dz, d) : (shape){0};
    case TN_LATENT_UP: return moe && dz ? SH2(d, dz) : (shape){0};
    case TN_LATENT_NORM: return moe && dz && c->latent_norm ? SH1(dz) : (shape){0};
    default: return (shape){0};
    }
}

/* A routed expert's part: w1 and w3 are [I, Dx], w2 [Dx, I] (Dx the latent width, else d); MXFP4 stores the
 * matrix as packed nibbles [out, in/2] and E8M0 scales [out, in/32]. */
static shape expert_shape(const df_config *c, int mat, int part) {
    int64_t x = config_expert_dim(c), out = mat == 1 ? x : c->moe_inter, in = mat == 1 ? c->moe_inter : x;
    switch (part) {
    case TENSOR_PART_WEIGHT: return SH2(out, in);
    case TENSOR_PART_PACKED: return SH2(out, in / 2);
    case TENSOR_PART_SCALE: return SH2(out, in / 32);
    default: return SH1(2);
    }
}

static int shape_eq(shape s, const st_tensor *t) {
    if (s.ndim != t->ndim) return 0;
    for (int i = 0; i < s.ndim; i++)
        if (s.d[i] != t->shape[i]) return 0;
    return 1;
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *d) {
    int o = snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < (int)cap; i++) o += snprintf(buf + o, cap - (size_t)o, "%s%lld", i ? ", " : "",
                                                                  (long long)d[i]);
    if (o < (int)cap) snprintf(buf + o, cap - (size_t)o, "]");
}

/* Problems, the first few kept as text. */
typedef struct problems {
    int n;
    char text[1536];
    int len;
} problems;

static void problem(problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(problems *p, const char *fmt, ...) {
    if (p->n++ >= 8 || p->len >= (int)sizeof p->text - 200) return;
    va_list ap;
    va_start(ap, fmt);
    p->len += snprintf(p->text + p->len, sizeof p->text - (size_t)p->len, "\n      ");
    p->len += vsnprintf(p->text + p->len, sizeof p->text - (size_t)p->len, fmt, ap);
    va_end(ap);
}

int verify_tensors(const checkpoint *ck, const df_config *c, verify_report *r) {
    int k3 = ck->family == TENSOR_FAMILY_K3, L = c->n_layers, E = c->n_experts;
    problems p = {0};
    uint8_t *seen = xcalloc((size_t)(L + 1) * TN_KIND_COUNT, 1);          /* [layer + 1][kind], row 0: top */
    uint16_t *parts = xcalloc((size_t)L * (size_t)(E > 0 ? E : 1), sizeof *parts);   /* bit mat*4+part */
    int64_t n_spine = 0, n_expert = 0, n_other = 0;
    char want[96], got[96];
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const ckpt_tensor *x = &ck->tensors[i];
        const st_tensor *t = x->t;
        if (x->cls == TENSOR_NON_TEXT) {
            n_other++;
            continue;
        }
        if (x->cls == TENSOR_UNKNOWN) {
            problem(&p, "%s: '%s' is not a %s tensor name", ck->shards[x->shard].path, t->name,
                    k3 ? "Kimi K3" : "Kimi-Linear");
            continue;
        }
        shape s;
        if (x->cls == TENSOR_EXPERT) {
            n_expert++;
            int mat = tensor_expert_mat(x->kind), part = tensor_expert_part(x->kind);
            if (x->layer >= L || c->ffn[x->layer] != FFN_MOE || x->expert >= E) {
                problem(&p, "%s: the config has no routed expert %d in layer %d", t->name, x->expert, x->layer);
                continue;
            }
            parts[(size_t)x->layer * (size_t)E + (size_t)x->expert] |= (uint16_t)(1u << (mat * 4 + part));
            s = expert_shape(c, mat, part);
            if ((part == TENSOR_PART_PACKED || part == TENSOR_PART_SCALE) && strcmp(t->dtype_name, "U8")) {
                problem(&p, "%s has dtype %s, expected U8", t->name, t->dtype_name);
                continue;
            }
        } else {
            n_spine++;
            s = kind_shape(c, k3, x->kind, x->cls == TENSOR_TOP ? -1 : x->layer);
            if (!s.ndim) {
                if (x->cls == TENSOR_TOP) problem(&p, "%s: the config has no such top-level tensor", t->name);
                else if (x->layer >= L) problem(&p, "%s: the config has %d layers", t->name, L);
                else problem(&p, "%s: layer %d is %s with %s, which has no such tensor", t->name, x->layer,
                             c->mixer[x->layer] == MIXER_MLA ? "MLA" : "KDA",
                             c->ffn[x->layer] == FFN_MOE ? "MoE" : "a dense FFN");
                continue;
            }
            seen[(size_t)(x->cls == TENSOR_TOP ? 0 : x->layer + 1) * TN_KIND_COUNT + x->kind] = 1;
        }
        if (!shape_eq(s, t)) {
            shape_text(want, sizeof want, s.ndim, s.d);
            shape_text(got, sizeof got, t->ndim, t->shape);
            problem(&p, "%s is %s, expected %s", t->name, got, want);
        }
    }
    /* what the config needs and the checkpoint lacks */
    char name[256];
    for (int l = -1; l < L; l++)
        for (int k = TN_EMBED; k < TN_EXPERT_FIRST; k++) {
            if (!kind_shape(c, k3, (tensor_kind)k, l).ndim || seen[(size_t)(l + 1) * TN_KIND_COUNT + k]) continue;
            if (tensor_name_format((tensor_kind)k, ck->family, l, -1, name, sizeof name) < 0)
                snprintf(name, sizeof name, "%s (layer %d)", tensor_name_suffix((tensor_kind)k), l);
            problem(&p, "%s is missing", name);
        }
    for (int l = 0; l < L; l++) {
        if (c->ffn[l] != FFN_MOE) continue;
        for (int e = 0; e < E; e++)
            for (int m = 0; m < 3; m++) {
                unsigned b = parts[(size_t)l * (size_t)E + (size_t)e] >> (m * 4);
                int packed = (b >> TENSOR_PART_PACKED & 1) && (b >> TENSOR_PART_SCALE & 1);
                int plain = b >> TENSOR_PART_WEIGHT & 1;
                if (packed || (plain && !k3)) continue;
                tensor_name_format(tensor_expert_kind(m, k3 || !plain ? TENSOR_PART_PACKED : TENSOR_PART_WEIGHT),
                                   ck->family, l, e, name, sizeof name);
                problem(&p, "%s%s", name, plain ? " is missing (K3's experts are MXFP4: packed + scale)"
                                                : (b ? " or its scale is missing" : " is missing"));
            }
    }
    free(seen);
    free(parts);
    if (p.n)
        verify_say(r, VERIFY_FAIL, "tensors", "%d problem%s%s%s", p.n, p.n > 1 ? "s" : "", p.text,
                   p.n > 8 ? "\n      ..." : "");
    else
        verify_say(r, VERIFY_PASS, "tensors",
                   "all %lld present with the shapes the config gives: %lld spine, %lld routed-expert parts%s",
                   (long long)(n_spine + n_expert), (long long)n_spine, (long long)n_expert,
                   n_other ? " (and non-text tensors, not checked)" : "");
    return p.n;
}
