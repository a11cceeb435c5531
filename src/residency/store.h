/* store.h — the storage seam: the only way model code reaches weights.
 *
 * The model asks for "the spine tensors of layer i" (acquire/release around their use) and for "the packed
 * bytes of expert (layer, e)" (prefetch the layer's selection, then acquire each and release it). Behind
 * this interface storage decides what is resident and where bytes come from (mmap of local shards today;
 * direct-I/O expert reads, an expert cache, spine streaming and remote fetch later) without the model
 * noticing. Views stay valid until released. Names passed in are checkpoint names relative to the text
 * model root: "model.embed_tokens.weight", "lm_head.weight", "model.output_attn_res_norm.weight"; layer
 * tensors relative to "model.layers.{i}.": "self_attn.q_proj.weight". The K3 "language_model." prefix is
 * resolved by storage. */
#ifndef DF_STORE_H
#define DF_STORE_H

#include <stdint.h>
#include "deltafin.h"
#include "common/tensor.h"
#include "spine_warm.h"

typedef struct df_store df_store;
typedef struct df_store_layer df_store_layer;

/* One routed expert: gate (w1) [I, D], down (w2) [D, I], up (w3) [I, D]. */
typedef struct df_expert {
    df_tensor w1, w2, w3;
} df_expert;

/* How storage may use memory and the disk. Zeroed = defaults. */
typedef struct store_opts {
    uint64_t mem_budget;     /* bytes for spine + expert cache + working buffers; 0 = budget_default_bytes() */
    int cache_slots;         /* > 0: exactly this many expert slots; 0 = as many as the budget allows */
    int spine_stream;        /* 1: stream every layer's spine through two buffers even if it would fit */
    int buffered_io;         /* 1: buffered pread + POSIX_FADV_DONTNEED instead of O_DIRECT */
    int io_threads;          /* I/O pool size; 0 = 8 */
    const char *remote_url;  /* partial install: fetch missing experts from here (remote.h); NULL = none */
    int io_kind;             /* IO_KIND_* of io.h: 0 = the faster one here, 1 = pread pool, 2 = io_uring */
    int spine;               /* DF_SPINE_*: INT8 reads spine matrices from the int8 sidecar (int8_spine.h), an
                                error if it is absent */
    int lookahead;           /* DF_LOOKAHEAD_*: when guesses of a coming layer's experts are read (readahead.h) */
    /* Tests only: called on the reading thread before each expert read (e.g. to sleep so that experts arrive in
     * an order of the test's choosing); NULL in normal use. */
    void (*test_before_read)(void *ctx, int layer, int e);
    void *test_ctx;
    int cache_policy;        /* DF_CACHE_* of deltafin.h: expert replacement policy; 0 = the default */
    const char *trace_routing;  /* append each prefetch's experts to this routing trace (trace.h); NULL = none */
    int heat;                /* DF_HEAT_*: keep per-expert heat in DIR/.deltafin/heat and warm from it (heat.h) */
    int64_t head_tile_rows;  /* > 0: stream the spine with lm_head in tiles of this many rows (tests) */
    uint64_t spine_part_bytes;  /* > 0: stream every layer in parts of about this many bytes (tests; a budget too
                                   small for two whole layers cuts them by itself) */
    const char *expert_dirs; /* comma-separated folders replacing those of DIR/.deltafin/placement (place.h) */
    uint64_t state_bytes;    /* the budget's share kept for session state (df_engine_opts.ctx_tokens) */
    int64_t state_tokens;    /* the tokens it holds (for info) */
    int preload;             /* DF_PRELOAD_*: read a spine served from the mappings in from open (spine_warm.h) */
    /* Expert parallelism: */
    const uint8_t *expert_mask;  /* per expert, layer-major (store_expert_index): 1 = this rank may read it; NULL =
                                    every expert. Others are never read, warmed or read ahead. Borrowed. */
    const char *placement_dir;   /* read the placement from this folder's .deltafin/placement instead of the
                                    model folder's (a rank's own expert folder) */
    int experts_only;            /* the budget goes to the reserve and the expert cache: this process never uses
                                    the spine (a rank computing experts for rank 0) */
    /* The spine split over ranks: whether this process uses the matrix key of layer (layer == the layer count:
     * a top-level tensor); those it does not are never read, warmed or budgeted, and their views have no data.
     * Vectors are always kept (the model copies them at open). NULL: every matrix. */
    int (*spine_keep)(void *ctx, int layer, const char *key);
    void *spine_keep_ctx;
    int catalog_only;            /* open the tables and sizes only, for planning (store_spine_fits,
                                    store_spine_bytes_of): nothing can be acquired or read */
} store_opts;

/* What storage did since open: cache behaviour, bytes read, and how memory was split. */
typedef struct store_stats {
    uint64_t expert_hits, expert_misses;  /* expert requests served from the cache vs read */
    uint64_t expert_loads, expert_waits;  /* reads run; acquires that waited for a read in flight */
    uint64_t expert_requests;             /* experts named by prefetches (per layer, per batch) */
    uint64_t expert_disk_bytes, spine_disk_bytes;
    uint64_t net_bytes;                   /* expert bytes fetched over HTTP (partial install + --remote) */
    uint64_t mem_budget, resident_spine_bytes, stream_buffer_bytes, cache_bytes, reserve_bytes;
    uint64_t expert_bytes;
    int cache_slots;
    int streamed_layers;                  /* layers whose spine is re-read every pass (0: all resident) */
    int split_layers;                     /* of them, layers read in parts, a few tensors at a time */
    int spine_mapped;                     /* spine served from the file mapping (it fits the budget) */
    int direct_fallbacks;                 /* files read buffered because O_DIRECT was refused */
    int io_uring;                         /* expert reads go through io_uring (else the pread pool) */
    uint64_t lookahead_loads, lookahead_requests, lookahead_recalled;   /* look-ahead: reads, experts asked, of them hinted */
    uint64_t warm_loads;                  /* reads started by warming from saved heat */
    double io_busy_s;                     /* seconds with reads in flight on the I/O pool */
    int head_tiles;                       /* lm_head streamed in this many row tiles (0: in memory whole) */
    uint64_t spine_bytes, foreign_spine_bytes;   /* the spine this process uses; the matrices other ranks hold */
} store_stats;

int store_open(df_store **out, const char *dir, df_error *err);
int store_open_ex(df_store **out, const char *dir, const store_opts *opts, df_error *err);
void store_get_stats(df_store *st, store_stats *out);
void store_free(df_store *st);

const char *store_dir(const df_store *st);
/* config.json of the checkpoint, as text (owned by the store). */
const char *store_config_text(const df_store *st);
/* The identity of the weights the store reads (every shard it opened, the int8 sidecar's too: file name, size,
 * modification time and a hash of its safetensors header), and the spine kind: cheap to compute, and changed by
 * any new or rewritten weights file. What a cache of computed states is keyed by. */
uint64_t store_weights_id(const df_store *st);
/* A file in the model folder (tokenizer, generation config), read whole; caller frees. NULL if absent
 * (err->code == DF_OK) or unreadable (err->code < 0). */
char *store_read_aux(const df_store *st, const char *name, size_t *len, df_error *err);

/* A top-level tensor, or NULL when the checkpoint has none of that name. */
const df_tensor *store_global(df_store *st, const char *name);
/* Like store_global, but a tensor that exists with an unusable dtype/rank is an error naming it;
 * DF_OK with *out = NULL when absent. */
int store_global_get(df_store *st, const char *name, const df_tensor **out, df_error *err);

int store_layer_acquire(df_store *st, int layer, const df_store_layer **out, df_error *err);
/* A tensor of an acquired layer, or NULL when absent (optional tensors are probed this way). */
const df_tensor *store_layer_tensor(const df_store_layer *l, const char *suffix);
void store_layer_release(df_store *st, const df_store_layer *l);
/* A layer streamed in parts (when two buffers of a whole layer do not fit the budget) has one part in memory
 * at a time, the next one being read meanwhile: before using a matrix of an acquired layer, the model asks for
 * it here, which swaps in the part holding it. Asking in the order the parts were cut (plan.c: the order the
 * mixers and FFNs use their matrices) reads each part once per pass. A no-op for a layer held whole. */
int store_layer_need(df_store *st, const df_store_layer *l, const df_tensor *t, df_error *err);
/* Whether t (a tensor of layer) is usable now without waiting for a read: always, unless the layer is streamed
 * in parts and t is in a part not in memory, or t is a matrix another rank holds (store_opts.spine_keep). */
int store_layer_ready(const df_store *st, const df_store_layer *layer, const df_tensor *t);
/* Acquires a layer and reads all its parts in turn, then releases it: checks its spine can be read. */
int store_layer_check(df_store *st, int layer, df_error *err);
/* A layer's tensor table without reading its bytes, for binding weights at open: store_layer_tensor on it gives
 * the same df_tensor structs acquire fills (stable for the store's lifetime; name, dtype and shape valid at once,
 * data only while the layer is acquired). Fails like store_layer_acquire on a layer with an unusable tensor. */
int store_layer_table(df_store *st, int layer, const df_store_layer **out, df_error *err);
/* A tensor of that table with its data on the checkpoint file's mapping instead of wherever the layer was last
 * placed, whatever the streaming state: for reading small tensors once at open without loading their layer. The
 * data may be unaligned (copy it before typed reads). -1 when absent or unusable. */
int store_layer_tensor_file(const df_store *st, const df_store_layer *l, const char *suffix, df_tensor *out);

/* The spine bytes of a layer (layer == the layer count: the top-level tensors) this process holds. */
uint64_t store_spine_bytes_of(const df_store *st, int layer);
/* Whether the spine this process holds would stay in memory whole under the options' budget, beside the working
 * reserve, the session state and the smallest expert cache (no layer streamed, lm_head not tiled). */
int store_spine_fits(df_store *st);

/* The checkpoint key (relative to the layer, "self_attn.q_proj.weight") of a tensor of l's table. */
const char *store_layer_tensor_key(const df_store_layer *l, const df_tensor *t);
/* Whether this process holds t's bytes (not a matrix another rank holds: store_opts.spine_keep). */
int store_layer_holds(const df_store_layer *l, const df_tensor *t);

/* Number of routed experts stored for a layer (0 for dense layers). */
int store_expert_count(const df_store *st, int layer);
/* Hint: the model will need these experts of this layer soon; storage may start reading them. Both halves of
 * it: note counts the selection (heat, routing trace), read starts the reads (an expert outside the mask is an
 * error). A rank that hands experts to others notes the whole union but reads only its share. */
int store_experts_prefetch(df_store *st, int layer, const int *ids, int n, df_error *err);
int store_experts_note(df_store *st, int layer, const int *ids, int n, df_error *err);
int store_experts_read(df_store *st, int layer, const int *ids, int n, df_error *err);
/* Index of expert (layer, e) in the layer-major order of store_opts.expert_mask; the total count with layer ==
 * the layer count and e == 0. */
int64_t store_expert_index(const df_store *st, int layer, int e);
/* Whether the placement (store_opts.placement_dir or the model folder's) holds expert (layer, e) in a folder of
 * its own; 1 also for an expert that cannot be placed (not contiguous: read from the shards). */
int store_expert_placed(const df_store *st, int layer, int e);
/* Blocks until the expert's bytes are in memory; checks them (an MXFP4 scale of 0xFF is an error naming
 * the file and tensor). */
/* Look-ahead: what the model should do now about guessing this coming layer's experts (readahead.h decides):
 * nothing, guess and hint without reading (storage measures the guesses' precision), or guess and hint to
 * read the *read_ranks most confident ranks of the guess. */
enum { STORE_LOOKAHEAD_SKIP = 0, STORE_LOOKAHEAD_SCORE = 1, STORE_LOOKAHEAD_READ = 2 };
int store_lookahead_plan(df_store *st, int layer, int *read_ranks);
/* Guess (look-ahead): these experts of a layer about to run may be needed, most confident first, rank[i]
 * (ascending) being ids[i]'s confidence rank; storage reads those ranked below read_ranks that are not cached
 * into idle slots at the lowest I/O priority, leaving the current prefetch alone. Either way the layer's next
 * prefetch scores the guess. Out-of-range ids are ignored. */
void store_experts_hint(df_store *st, int layer, const int *ids, const int *rank, int n, int read_ranks);
/* Per-layer look-ahead counters (df_layer_lookahead of deltafin.h). */
void store_lookahead_layer(df_store *st, int layer, df_layer_lookahead *out);
int store_expert_acquire(df_store *st, int layer, int e, df_expert *out, df_error *err);
/* Arrival order: acquires whichever of ids[0..n) (this layer's prefetched selection) not yet marked in done[]
 * is in memory first, waiting only while none is; marks it and sets *which to its index in ids. Call n times
 * (releasing each as usual) to consume the selection in the order its bytes arrive. On an error *which names
 * the expert at fault. */
int store_expert_acquire_next(df_store *st, int layer, const int *ids, int n, uint8_t *done, int *which,
                              df_expert *out, df_error *err);
/* How lm_head is served: 1 tile when it is in memory whole, else n tiles of *rows_per_tile rows (the last may
 * be shorter) to take one at a time, in order; the next is read while one is used. */
int store_head_tiles(const df_store *st, int64_t *rows_per_tile);
/* Tile j of lm_head as a [rows, d] view, valid until store_head_tile_release. */
int store_head_tile_acquire(df_store *st, int j, df_tensor *out, df_error *err);
void store_head_tile_release(df_store *st, int j);
/* Waits until warming from saved heat has read what it will (nothing to wait for without heat). */
void store_warm_wait(df_store *st);
/* What preloading reads of a spine served from the mappings (spine_warm.h), in that order: each
 * layer's mapped tensors, then the top-level ones but the embedding (read a row at a time, on demand); a layer's
 * in file order, since the model's order of use is not the file's and a disk reads fastest in its own. Returns
 * the count; *out is the caller's to free. */
int store_preload_ranges(const df_store *st, warm_range **out);
/* Waits until a spine served from the mappings is read in (spine_warm.h), then faults the whole expert cache
 * in now and waits for it (ecache_populate_wait). */
void store_populate_wait(df_store *st);
/* Why a saved heat file was ignored, or "" (heat off, absent or valid). */
const char *store_heat_note(const df_store *st);
void store_expert_release(df_store *st, int layer, int e);

/* Describes the checkpoint for `deltafin info`: tensors, bytes of spine vs experts, dtypes, expert spans,
 * problems found. Appends to buf (NUL-terminated, truncated at cap). */
void store_describe(const df_store *st, char *buf, size_t cap);

#endif
