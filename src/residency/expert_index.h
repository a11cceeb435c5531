/* expert_index.h — where each routed expert's bytes live on disk, for readers that bypass the mapping
 * (O_DIRECT streaming, remote range requests) and for `deltafin info`.
 *
 * Built once at store_open from the shard headers. An expert is "contiguous" when all its tensors lie in one
 * shard back to back (any order, no gap, nothing foreign in between): then one read of [offset,
 * offset+length) fetches the whole expert. Otherwise readers fall back to the per-tensor parts. */
#ifndef DF_EXPERT_INDEX_H
#define DF_EXPERT_INDEX_H

#include <stdint.h>
#include "store.h"

/* w{1,2,3} × (packed, scale), plus room for per-matrix side tensors (weight_shape). */
#define STORE_EXPERT_MAX_PARTS 9

typedef struct store_expert_part {
    const char *name;        /* full checkpoint name */
    int shard;               /* index into the store's shard list */
    uint64_t offset, length; /* absolute file offset and byte count */
} store_expert_part;

typedef struct store_expert_loc {
    int contiguous;
    int shard;               /* shard of the first part */
    const char *path;        /* that shard's path */
    uint64_t offset, length; /* the whole span when contiguous; else first part's offset, 0 */
    int n_parts;
    store_expert_part parts[STORE_EXPERT_MAX_PARTS];   /* sorted by (shard, offset) */
} store_expert_loc;

/* The location of expert (layer, e), or NULL when there is no such expert. */
const store_expert_loc *store_expert_locate(const df_store *st, int layer, int e);
int store_shard_count(const df_store *st);
const char *store_shard_path(const df_store *st, int shard);
/* Number of decoder layers (config num_hidden_layers, or more if tensors name higher layers). */
int store_layer_count(const df_store *st);
/* "kimi_k3" or "kimi_linear" (config model_type). */
const char *store_family(const df_store *st);

#endif
