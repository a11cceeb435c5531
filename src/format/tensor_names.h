/* tensor_names.h — the one table of checkpoint tensor names, per model family, and the classifier every reader
 * and writer of checkpoints uses (storage's catalog, the int8 spine, fetch planning, synth, benchmarks).
 *
 * Names are relative to the text root: Kimi-Linear writes them as they are ("model.embed_tokens.weight",
 * "lm_head.weight", "model.layers.{i}.self_attn.q_proj.weight"); Kimi K3 puts every text tensor under
 * "language_model." (its vision tensors lie outside it). Per-layer tensors are "model.layers.{i}." + a suffix
 * of the table; routed experts are "model.layers.{i}.block_sparse_moe.experts.{e}." + w1/w2/w3 (gate, down,
 * up) + ".weight" (BF16/F32/F16) or ".weight_packed" + ".weight_scale" (MXFP4, with an optional
 * ".weight_shape"). One alternate spelling is accepted, and only where a real checkpoint writer produces it:
 * transformers' save_pretrained of Kimi-Linear names the dense FFN "block_sparse_moe.{gate,up,down}_proj". */
#ifndef DF_TENSOR_NAMES_H
#define DF_TENSOR_NAMES_H

#include <stddef.h>

#define TENSOR_K3_PREFIX "language_model."
/* Layer and expert numbers at or past these are not a model's (and are refused rather than allocated for). */
#define TENSOR_MAX_LAYERS 4096
#define TENSOR_MAX_EXPERTS 65536

typedef enum tensor_family { TENSOR_FAMILY_KIMI_LINEAR, TENSOR_FAMILY_K3, TENSOR_FAMILY_COUNT } tensor_family;

typedef enum tensor_class {
    TENSOR_UNKNOWN = 0,  /* under the text root but not a name of the family's table */
    TENSOR_TOP,          /* a top-level text tensor (embedding, final norm, lm_head, ...) */
    TENSOR_SPINE,        /* a per-layer tensor other than a routed expert's */
    TENSOR_EXPERT,       /* a part of a routed expert */
    TENSOR_NON_TEXT,     /* outside the text root (K3's vision tower and projector) */
} tensor_class;

typedef enum tensor_kind {
    TN_NONE = 0,
    /* top level */
    TN_EMBED, TN_FINAL_NORM, TN_LM_HEAD, TN_OUT_RES_NORM, TN_OUT_RES_PROJ,
    /* per layer: norms and (K3) attention residuals */
    TN_ATTN_NORM, TN_FFN_NORM, TN_ATTN_RES_NORM, TN_ATTN_RES_PROJ, TN_MLP_RES_NORM, TN_MLP_RES_PROJ,
    /* attention projections shared by name between KDA and MLA layers (q_proj: KDA, or MLA without q LoRA;
     * g_proj: K3's full-rank KDA output gate or MLA output gate) */
    TN_ATTN_Q, TN_ATTN_K, TN_ATTN_V, TN_ATTN_O, TN_ATTN_G,
    /* KDA */
    TN_KDA_Q_CONV, TN_KDA_K_CONV, TN_KDA_V_CONV, TN_KDA_F_A, TN_KDA_F_B, TN_KDA_DT_BIAS, TN_KDA_A_LOG, TN_KDA_B,
    TN_KDA_G_A, TN_KDA_G_B, TN_KDA_O_NORM,
    /* MLA */
    TN_MLA_Q_A, TN_MLA_Q_A_NORM, TN_MLA_Q_B, TN_MLA_KV_A, TN_MLA_KV_A_NORM, TN_MLA_KV_B,
    /* dense FFN (the first layers) */
    TN_FFN_GATE, TN_FFN_UP, TN_FFN_DOWN,
    /* MoE: router, its correction bias, shared experts, (K3) latent projections */
    TN_MOE_ROUTER, TN_MOE_BIAS, TN_SHARED_GATE, TN_SHARED_UP, TN_SHARED_DOWN, TN_LATENT_DOWN, TN_LATENT_NORM,
    TN_LATENT_UP,
    /* routed experts: matrix w1, w2, w3, each as weight, weight_packed, weight_scale, weight_shape */
    TN_EXPERT_FIRST,
    TN_KIND_COUNT = TN_EXPERT_FIRST + 12
} tensor_kind;

/* The parts of one routed-expert matrix. */
enum { TENSOR_PART_WEIGHT, TENSOR_PART_PACKED, TENSOR_PART_SCALE, TENSOR_PART_SHAPE, TENSOR_PART_COUNT };

static inline tensor_kind tensor_expert_kind(int mat, int part) {
    return (tensor_kind)(TN_EXPERT_FIRST + mat * TENSOR_PART_COUNT + part);
}
static inline int tensor_expert_mat(tensor_kind k) { return (k - TN_EXPERT_FIRST) / TENSOR_PART_COUNT; }
static inline int tensor_expert_part(tensor_kind k) { return (k - TN_EXPERT_FIRST) % TENSOR_PART_COUNT; }

/* The family of a config.json model_type: "kimi_k3" is K3, everything else is read as Kimi-Linear. */
tensor_family tensor_family_of(const char *model_type);
/* For callers that see names only (a remote shard header, the int8 sidecar writer): K3 when the name has the
 * K3 text prefix. */
tensor_family tensor_family_guess(const char *full_name);

/* Classifies a full checkpoint name of a family. For TOP and SPINE, *kind is set; for SPINE, *layer too; for
 * EXPERT, *layer, *expert and *kind (tensor_expert_mat/part). Any of the out pointers may be NULL. A name under
 * a layer's routed-expert prefix whose rest is not a known part is UNKNOWN with *layer and *expert set, so a
 * caller can name the malformed expert. *layer and *expert are -1 when not set. */
tensor_class tensor_classify(const char *name, tensor_family family, int *layer, int *expert, tensor_kind *kind);
/* The class of a kind (TENSOR_UNKNOWN for TN_NONE or out of range). */
tensor_class tensor_kind_class(tensor_kind kind);
/* Whether checkpoints of the family have tensors of this kind. */
int tensor_kind_in_family(tensor_kind kind, tensor_family family);
/* The canonical name of a kind relative to what precedes it: the name under the text root for top-level
 * kinds ("model.norm.weight"), the suffix after "model.layers.{i}." for per-layer ones
 * ("self_attn.q_a_proj.weight"), and after "...experts.{e}." for expert parts ("w1.weight_packed"). */
const char *tensor_name_suffix(tensor_kind kind);
/* The full checkpoint name of a kind in a family (layer and expert used where the kind has them) into buf;
 * returns its length, or -1 when the family has no such kind or it does not fit. */
int tensor_name_format(tensor_kind kind, tensor_family family, int layer, int expert, char *buf, size_t cap);

#endif
