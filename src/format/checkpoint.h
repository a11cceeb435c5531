/* checkpoint.h — a model folder's checkpoint as files and names: config.json (its text, model_type, the tensor
 * family and layer count it states), the safetensors shards (one model.safetensors, or those the index names,
 * each tensor checked to be where the index says), and every tensor classified by the tensor-name table
 * (tensor_names.h): top-level, per-layer spine, routed-expert part, non-text or unknown. Only headers are read,
 * never tensor data. The store (residency/) builds its tables from it; `deltafin verify` checks shapes on it. */
#ifndef DF_CHECKPOINT_H
#define DF_CHECKPOINT_H

#include <stdint.h>

#include "deltafin.h"
#include "safetensors.h"
#include "tensor_names.h"

/* One tensor of the checkpoint: its shard, its header entry and what the name table makes of its name. */
typedef struct ckpt_tensor {
    int shard;
    const st_tensor *t;
    tensor_class cls;
    int layer, expert;   /* -1 when the name has none */
    tensor_kind kind;
} ckpt_tensor;

typedef struct checkpoint {
    char *dir;
    char *config_text;               /* config.json as read */
    char *model_type;                /* its model_type, "unknown" when absent */
    tensor_family family;            /* how tensors are named (tensor_family_of the model_type) */
    int config_layers;               /* num_hidden_layers (K3: of text_config); 0 when absent or out of range */
    int n_layers;                    /* config_layers, or one past the highest layer a tensor names if more */
    int indexed;                     /* shards named by model.safetensors.index.json */
    int n_shards;
    st_file *shards;                 /* mapped for their headers; ckpt_add_shard appends (the int8 sidecar) */
    ckpt_tensor *tensors;            /* in the order the index (or the single shard's header) lists them */
    int64_t n_tensors, cap;
    int64_t n_unindexed;             /* tensors a shard holds that the index leaves out (ignored) */
    char **notes;                    /* problems that do not stop loading, one line each, in the order found */
    int n_notes;
} checkpoint;

/* Reads config.json, opens the shards and classifies every tensor. On failure err names the file, shard or
 * tensor at fault; *ck holds what was read so far and is freed with ckpt_free either way. */
int ckpt_open(checkpoint *ck, const char *dir, df_error *err);
/* Opens one more shard of the folder (a file name inside it) after those of the checkpoint. */
int ckpt_add_shard(checkpoint *ck, const char *file, df_error *err);
/* A relative name that stays inside the model folder (no leading '/', no ".." part). */
int ckpt_file_name_ok(const char *name);
/* Frees the tensor list (the shards, and the header entries it pointed at, stay). */
void ckpt_drop_tensors(checkpoint *ck);
void ckpt_free(checkpoint *ck);

#endif
