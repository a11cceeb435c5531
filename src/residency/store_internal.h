/* store_internal.h — what the storage seam's own files share: the store's state (struct df_store), the
 * per-layer tensor tables and the routed-expert table, and the functions each file gives the others.
 * catalog.c builds these tables from the checkpoint (format/checkpoint.h), experts.c checks and loads routed experts, plan.c splits
 * the memory budget, describe.c writes `info`, store.c holds the entry points of store.h. Nothing outside
 * src/residency includes this header. */
#ifndef DF_STORE_INTERNAL_H
#define DF_STORE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "cache.h"
#include "expert_index.h"
#include "heat.h"
#include "io/io.h"
#include "place.h"
#include "readahead.h"
#include "format/checkpoint.h"
#include "format/safetensors.h"
#include "spine.h"
#include "store.h"
#include "format/tensor_names.h"
#include "tiles.h"
#include "trace.h"

#define STORE_MAX_PROBLEMS 24
#define STORE_IO_THREADS 8
#define STORE_MIN_SLOTS 24
/* Bytes of expert slots kept faulted in beyond those the cache has used (cache.c, ec_populate). */
#define STORE_POPULATE_AHEAD ((size_t)1 << 30)

/* One tensor of the checkpoint as the store sees it: which shard, which header entry. */
typedef struct store_ref {
    int shard;
    const st_tensor *t;
} store_ref;

/* A layer tensor (key = suffix after "model.layers.{i}.") or a global (key = name relative to the text
 * root). The key is the tensor-name table's canonical name of the tensor's kind (tensor_name_suffix). */
typedef struct store_item {
    const char *key;
    store_ref ref;
    int usable;
    int int8;            /* view is an int8 spine span (scales then rows), see int8_spine.h */
    int foreign;         /* a matrix another rank holds (store_opts.spine_keep): never read, placed or budgeted */
    df_tensor view;
} store_item;

struct df_store_layer {
    int index;
    int n;
    store_item *items;   /* sorted by key */
    int bad;             /* index of an item with an unusable dtype/shape, or -1 */
    int *region;         /* streamed/resident spine: item -> region of its spine unit */
    int *part;           /* streamed/resident spine: item -> which of the layer's units (parts) holds it */
    int unit0, n_parts;  /* the layer's spine units: unit0 .. unit0 + n_parts - 1, in the order they are used */
    int held;            /* a layer streamed in parts: the part in memory now (store_layer_need), or -1 */
};

typedef struct store_expert {
    store_ref part[3][TENSOR_PART_COUNT];   /* [w1,w2,w3][TENSOR_PART_*]; t == NULL when absent */
    df_expert ex;
    store_expert_loc loc;
    int one_read;                    /* contiguous and every part aligned to its element size */
} store_expert;

typedef struct store_dtype_stat {
    const char *name;
    int64_t count;
    uint64_t bytes;
} store_dtype_stat;

struct df_store {
    char *dir;
    checkpoint ck;                   /* config.json, the shards (then the int8 sidecar's) and the tensor list */
    int n_layers;
    df_store_layer *layers;
    int n_globals;
    store_item *globals;
    int *n_experts;                  /* per layer */
    int64_t *expert_base;            /* per layer: its first expert in layer-major order (store_expert_index) */
    int *expert_shard;               /* per layer: a shard holding some of its experts */
    store_expert **experts;          /* per layer, n_experts[l] entries */
    /* statistics for store_describe */
    int64_t n_tensors, n_ignored, n_unknown;   /* ignored: non-text; unknown: not in the name table */
    uint64_t total_bytes, spine_bytes, expert_bytes, ignored_bytes, unknown_bytes;
    uint64_t foreign_bytes;      /* spine matrices other ranks hold (store_opts.spine_keep) */
    store_dtype_stat dtypes[16];
    int n_dtypes;
    char *problems;
    int n_problems;
    void **copies;                   /* aligned copies of misaligned tensors */
    int n_copies;
    /* reading and memory */
    store_opts opts;
    io_source *src_expert, *src_spine;
    io_pool *pool;
    ecache *cache;
    readahead *ra;                   /* look-ahead policy */
    spine *spine;                    /* NULL: spine served from the mappings */
    spine_warm *warm;                /* reads a mapped spine in ahead of the model (NULL: none) */
    int *global_region;              /* globals -> region of the top-level unit, -1 for mapped ones */
    int global_unit;                 /* the spine unit of the top-level tensors */
    int streamed_layers, split_layers;   /* layers re-read every pass; of them, those read in parts */
    uint64_t slot_bytes, reserve_bytes;
    int64_t n_experts_total;
    atomic_uint_fast64_t expert_requests;
    /* int8 spine: the sidecar's shards follow the checkpoint's in shards[]; spans are what items point at */
    st_tensor *int8_spans;
    int *int8_shard;                 /* per span: its shard */
    int n_int8, n_int8_files;
    uint64_t int8_bytes, int8_replaced_bytes;
    rtrace_writer *trace;            /* --trace-routing */
    uint64_t min_budget;             /* smallest budget this model opens with: all streamed, lm_head tiled */
    uint64_t min_slots;
    placement place;                 /* experts copied to other folders (n_folders 0: none) */
    heat *heat;                      /* per-expert heat (DF_HEAT_ON / DF_HEAT_READ) */
    int head_tiled;                  /* lm_head streams in row tiles (tiles.h) instead of staying resident */
    int head_resident;               /* of its tiles, those kept resident (beside layers in parts) */
    tiles head;
    char heat_note[512];
};

static inline const char *store_tensor_path(const df_store *st, store_ref r) { return st->ck.shards[r.shard].path; }
static inline uint64_t store_ref_offset(const df_store *st, store_ref r) {
    return st_tensor_offset(&st->ck.shards[r.shard], r.t);
}

/* catalog.c: the per-layer tables built from the checkpoint (st->ck) */
void store_problem(df_store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const store_item *store_find_item(const store_item *items, int n, const char *key);
void store_align_view(df_store *st, df_tensor *v, int elem_size);
/* Points the item's view at p (an int8 span splits into row scales then rows). */
void store_item_place(store_item *it, const uint8_t *p);
int catalog_build_tables(df_store *st, df_error *err);
int catalog_use_int8_spine(df_store *st, df_error *err);
void catalog_mark_foreign(df_store *st);

/* experts.c: pairing and checking routed experts, reading them into cache slots */
const char *experts_mat_name(int m);
int experts_build(df_store *st, df_error *err);
void experts_plan_read(df_store *st, store_expert *x);
uint64_t experts_slot_need(const df_store *st, const store_expert *x);
/* The expert cache's loader (ecache_load_fn of cache.h); ctx is the store. */
int experts_load(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err);

/* plan.c: the memory plan (spine mapped, resident or streamed; lm_head tiles; expert slots) */
int plan_build(df_store *st, df_error *err);
/* Whether the globals' unit leaves top-level item it out: the embedding (rows read from the mapping) and a tiled
 * lm_head. */
int plan_global_skipped(const df_store *st, const store_item *it);

#endif
