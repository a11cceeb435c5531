/* deltafin.h — the public interface of libdeltafin.
 *
 * An engine is a loaded model (weights behind the storage layer, kernels, thread pool). A session is one
 * conversation's state (KDA recurrent + conv state, MLA latent cache, position). Sessions feed token ids and
 * get logits back; everything above that (tokenizer, chat formats, sampling, server) is built on this.
 *
 * Errors: every call that can fail returns DF_OK (0) or a negative df_status and fills a df_error with a
 * message naming the file/tensor/field at fault. Only programming errors and out-of-memory abort.
 *
 * Threading: an engine runs one evaluation at a time. The calls that evaluate (df_session_eval, _sync,
 * _truncate, df_batch_eval) must not overlap each other on one engine, nor overlap df_engine_check, _describe,
 * _stats, _pass_rows, _profile, _profile_reset or _lookahead_layer, which read what an evaluation changes
 * without locks; the caller serialises them (the server makes all of them on its one worker thread). Each
 * evaluation is spread over the engine's own threads, and several sessions advance in one pass through a
 * df_batch, not from several threads. A session belongs to one caller at a time: nothing else may touch it
 * while it is evaluated or changed. Beyond that, sessions are independent: copy, reset, save, load and the
 * queries of sessions that are not being evaluated may run beside another session's evaluation.
 * df_engine_info and df_session_state_bytes depend only on the model's shape and may be called at any time.
 * Different engines share nothing and may be used from different threads. */
#ifndef DELTAFIN_H
#define DELTAFIN_H

#include <stddef.h>
#include <stdint.h>

/* The release this header belongs to (`deltafin --version`). */
#define DF_VERSION "0.1.0"

/* DF_API marks what the library exports: it is built with -fvisibility=hidden, so every other function in it
 * is internal (the installed archive and its consumers see only these). */
#if defined(__GNUC__)
#define DF_API __attribute__((visibility("default")))
#else
#define DF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DF_OK = 0,
    DF_EINVAL = -1,      /* bad argument or request */
    DF_EIO = -2,         /* read/write/network failure */
    DF_EFORMAT = -3,     /* malformed file: safetensors, JSON, tokenizer */
    DF_ENOMEM = -4,      /* a budget could not be met */
    DF_EUNSUPPORTED = -5,
    DF_ECANCELLED = -6,
} df_status;

typedef struct df_error {
    int code;
    char msg[1024];
} df_error;

typedef struct df_engine df_engine;
typedef struct df_session df_session;

/* Which spine weights an engine uses: the checkpoint's own (BF16 in the released models; lossless), or the
 * per-row int8 copies `deltafin quantize --spine int8` writes beside it (lossy; opening fails if absent). */
enum { DF_SPINE_BF16 = 0, DF_SPINE_INT8 = 1 };
enum { DF_SPINE_SPLIT_AUTO = 0, DF_SPINE_SPLIT_ON = 1, DF_SPINE_SPLIT_OFF = 2 };

typedef struct df_engine_opts {
    const char *model_dir;
    int n_threads;            /* 0 = all online cores */
    int alog_per_channel;     /* K3 A_log read per key channel instead of per head; off by default */
    const char *isa;          /* kernel ISA ("scalar", "avx2", "avx512", "neon"); NULL = best, or $DELTAFIN_ISA */
    /* storage: one memory budget for the resident spine, the expert cache and working buffers */
    uint64_t mem_budget;      /* bytes; 0 = 3/4 of physical RAM or of the memory-cgroup limit if lower */
    int cache_slots;          /* > 0: exactly this many expert slots (tests, experiments); 0 = from the budget */
    int spine_stream;         /* 1: stream every layer's spine through two buffers even when it would fit */
    int buffered_io;          /* 1: buffered reads + POSIX_FADV_DONTNEED instead of O_DIRECT */
    int io_threads;           /* I/O threads; 0 = 8 */
    const char *remote_url;   /* a partial install streams missing experts from this repository URL */
    int spine;                /* DF_SPINE_BF16 (default) or DF_SPINE_INT8 */
    int io_kind;              /* O_DIRECT reader (--io): 0 = the faster one measured here (io_uring), 1 = pread thread
                                 pool, 2 = io_uring (falls back to pread where io_uring cannot be set up) */
    int lookahead;            /* DF_LOOKAHEAD_*: predict a layer's experts with its router on its input before its
                                 attention runs, and read them meanwhile (never changes results); auto (0, the
                                 default) reads the surest part of a layer's guesses while their measured
                                 precision and the disk's idle time say it pays */
    int cache_policy;         /* expert replacement: DF_CACHE_DEFAULT (frequency with decay), _LRU, _LFU, _ARC */
    const char *trace_routing;   /* append every layer's expert selection to this file (`deltafin bench cache`) */
    int heat;                 /* DF_HEAT_ON: count expert use into DIR/.deltafin/heat (saved at close) and warm the
                                 cache from it in the background on open; DF_HEAT_READ: show it only; 0 = off */
    int64_t head_tile_rows;   /* > 0: stream the spine with lm_head read in tiles of this many rows even when it would
                                 fit (tests; a tight budget tiles lm_head by itself) */
    int64_t spine_part_bytes; /* > 0: stream every layer's spine in parts of about this many bytes (whole tensors)
                                 even when it would fit (tests; a budget too small for two whole layers streams them
                                 in parts by itself) */
    const char *expert_dirs;  /* "A,B": where `deltafin place` put the experts, when the folders moved; the
                                 placement in DIR/.deltafin is used without it */
    int preload;              /* DF_PRELOAD_ON (0, the default): a spine served from the checkpoint's file mappings
                                 (when it fits the budget) is read in from open on, in the background, in the order
                                 the model uses it; DF_PRELOAD_OFF: by page faults on first use (`deltafin info`) */
    int64_t ctx_tokens;       /* > 0: the budget holds one session's state (recurrent states, attention cache,
                                 history, rollback record) for this many tokens, and sessions stop there (the
                                 model's context if smaller); 0: sessions are not counted and may reach the
                                 model's context */
    int ranks;                /* DF_RANKS_LAUNCHER: join the job an MPI launcher (mpirun) started this process in, as
                                 rank 0 of an expert-parallel engine (README "Several machines"); the other ranks
                                 call df_engine_serve. DF_RANKS_ONE (0, the default): this process alone */
    int spine_split;          /* with several ranks: DF_SPINE_SPLIT_AUTO (0) splits the spine by layers over the ranks
                                 when one process would have to stream part of it under the budget (each rank then
                                 holds about 1/N of it and computes its layers' projections for rank 0), else rank
                                 0 holds all of it; _ON and _OFF force either (give every rank the same) */
    /* GPU (CUDA, found at run time; the binary needs no CUDA toolkit): "auto" uses GPU 0 when a driver, NVRTC and
     * a device are present and the model fits its budget, else the CPU (df_engine_describe says why); "off" the
     * CPU; "N" GPU N, failing the open with the reason when it cannot be used. NULL = $DELTAFIN_GPU, else auto. */
    const char *gpu;
    uint64_t gpu_mem;         /* bytes of GPU memory for weights, states and working memory; 0 = the device's free
                                 memory less a reserve; a model that does not fit is refused naming both sizes */
} df_engine_opts;

enum { DF_RANKS_ONE = 0, DF_RANKS_LAUNCHER = 1 };

enum { DF_LOOKAHEAD_AUTO = 0, DF_LOOKAHEAD_ON = 1, DF_LOOKAHEAD_OFF = 2 };

enum { DF_HEAT_OFF = 0, DF_HEAT_ON = 1, DF_HEAT_READ = 2 };

enum { DF_PRELOAD_ON = 0, DF_PRELOAD_OFF = 1 };

enum { DF_CACHE_DEFAULT = 0, DF_CACHE_LRU = 1, DF_CACHE_LFU = 2, DF_CACHE_ARC = 3 };

typedef struct df_model_info {
    const char *family;       /* "kimi_linear" or "kimi_k3" */
    int vocab_size;
    int hidden_size;
    int n_layers;
    int bos_id, eos_id;
    int64_t max_context;
} df_model_info;

DF_API void df_engine_opts_default(df_engine_opts *opts);
/* This process's rank in the job an MPI launcher started it in (from the launcher's environment, without
 * starting MPI), 0 without one. */
DF_API int df_launcher_rank(void);
/* A rank other than 0 of an expert-parallel job (opts->ranks = DF_RANKS_LAUNCHER): opens this rank's share of the
 * model (its experts, from its own folder in the rank plan, into its own cache; the spine is not read) and computes
 * it for rank 0 until rank 0 closes its engine. Fails, naming the rank, when this rank cannot open its share (rank 0
 * then fails to open too) or when rank 0 is lost. */
DF_API int df_engine_serve(const df_engine_opts *opts, df_error *err);
/* Checks every tensor the forward pass will use against the config (names, shapes, dtypes) without reading a
 * streamed spine: a missing or misshapen one fails the open, naming it. */
DF_API int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err);
DF_API void df_engine_free(df_engine *eng);
DF_API const df_model_info *df_engine_info(const df_engine *eng);
/* Reads every layer's spine once (df_engine_open has checked the tensors' names, shapes and dtypes). */
DF_API int df_engine_check(df_engine *eng, df_error *err);
/* Writes a human-readable description (family, schedule, byte counts, dtypes, problems) to buf. */
DF_API int df_engine_describe(const df_engine *eng, char *buf, size_t cap);

DF_API int df_session_init(df_session **out, df_engine *eng, df_error *err);
DF_API void df_session_free(df_session *s);
/* Consumes n tokens as one batch. logits: [n, vocab] when all_rows, else [vocab] for the last token;
 * may be NULL. */
DF_API int df_session_eval(df_session *s, const int32_t *tokens, int n, float *logits, int all_rows, df_error *err);
DF_API int64_t df_session_pos(const df_session *s);
/* Copies the whole state of src into dst (same engine): rollback, prefix reuse. */
DF_API int df_session_copy(df_session *dst, const df_session *src, df_error *err);
DF_API void df_session_reset(df_session *s);
/* Called after each layer of every evaluation with (ctx, layer, n_layers): progress for long prefills,
 * and the way to stop one — a non-zero return aborts the evaluation with DF_ECANCELLED (the session is
 * then reset). NULL removes it. */
typedef int (*df_step_fn)(void *ctx, int layer, int n_layers);
DF_API void df_session_set_step_callback(df_session *s, df_step_fn fn, void *ctx);

/* The session owns the tokens it has consumed: *n gets their count (= df_session_pos). Valid until the next
 * call that changes the session. */
DF_API const int32_t *df_session_tokens(const df_session *s, int64_t *n);
/* Brings the session to hold exactly ids[0..n) (n > 0): keeps the longest prefix it already holds as far as
 * its state can go back (to the start of its last evaluation; otherwise it restarts), evaluates the rest
 * (in chunks that fit the memory budget) and writes the logits after ids[n-1] into logits [vocab] (NULL
 * skips). *reused (may be NULL) gets how many leading tokens were not evaluated again. */
DF_API int df_session_sync(df_session *s, const int32_t *ids, int64_t n, float *logits, int64_t *reused, df_error *err);
/* Arms a snapshot: the next evaluation whose rows reach position pos (> the session's position) leaves in
 * into (another session of the same engine) this session as it was at pos (its first pos tokens), taken in
 * that same pass, so a prompt and a prefix of it worth keeping (a prompt cache's) cost one pass, not two.
 * Used up by that evaluation (a failed one resets into); pos 0 or df_session_reset disarms it; into must
 * outlive it. */
DF_API int df_session_snapshot_at(df_session *s, int64_t pos, df_session *into, df_error *err);
/* Returns the session to position pos, which lies between the start of its last evaluation and now, as if
 * the tokens after pos had never been evaluated (speculation rollback). Without weight reads when the last
 * evaluation had at most the session's rollback rows (see below): the KDA state is rebuilt from what that
 * evaluation kept; otherwise the kept history is evaluated again (df_stats counts both). */
DF_API int df_session_truncate(df_session *s, int64_t pos, df_error *err);
/* Bytes a session of this engine holds once it has consumed n_tokens (recurrent state, convolution tails,
 * the attention cache as it grows, its token history and last logits) with the rollback record of
 * rollback_rows (see df_session_set_rollback_rows; 0 = none): what a server reserves per conversation so
 * that sessions count in the memory budget. */
DF_API uint64_t df_session_state_bytes(const df_engine *eng, int64_t n_tokens, int rollback_rows);
/* Rows one forward pass should take at most (prompt slices and decode rows together, and the chunks
 * df_session_sync evaluates a long prompt in): the most whose working memory (activations, attention
 * scores, expert outputs) fits the memory budget's working reserve, within 16..4096 and at most a context. */
DF_API int df_engine_pass_rows(const df_engine *eng);
#define DF_ROLLBACK_ROWS_DEFAULT 32
/* Evaluations of 2 to rows tokens keep what a weight-free truncate needs (default 32; 0 = never, and the
 * memory it held is freed); one-token evaluations keep nothing. Per KDA layer that is a copy of the
 * recurrent and conv state (made at the start of each such evaluation) plus 6 * heads * head_dim + heads
 * floats per row, held at the size of the largest such evaluation. A failed evaluation that kept it leaves
 * the session as it was instead of resetting it. */
DF_API void df_session_set_rollback_rows(df_session *s, int rows);
/* Bytes the session holds (states, caches, rollback record, history): for memory budgets. */
DF_API uint64_t df_session_memory(const df_session *s);
/* Saves the session's state (token history, KDA recurrent/conv states, MLA caches, last logits) to path,
 * atomically (an exclusive temporary file, fsync, rename). The file is tied to what computed it: its header
 * carries df_engine_fingerprint and a checksum. */
DF_API int df_session_save(const df_session *s, const char *path, df_error *err);
/* Replaces the session's state with the one saved at path, after checking all of it (format, version,
 * model fingerprint, sizes, checksum); on any error the session is unchanged. */
DF_API int df_session_load(df_session *s, const char *path, df_error *err);
/* What a saved state depends on: the configuration and shapes, the weights' identity (every weights file's
 * name, size, modification time and header), the spine kind, the kernel ISA and the options that change
 * the numbers. States saved under another fingerprint are refused. */
DF_API uint64_t df_engine_fingerprint(const df_engine *eng);

/* Several sessions in one forward pass: each row belongs to a session (a decode token, verify tokens, a
 * prompt slice); every layer's spine is acquired once and every expert of the union read once per pass.
 * A session appears at most once per batch. logits: [n, vocab] when all_rows, else [vocab] (may be NULL).
 * Each session's logits equal its logits evaluated alone up to float rounding: the AMX MXFP4 kernel, used
 * for products of 4 rows or more, sums in another order than the AVX-512 one used below that, giving
 * differences below 1e-6 of the logits' scale; every other kernel (isa "avx512", "avx2", "scalar") is
 * bit-identical whatever the row count. On failure every session of the batch is left as it was before
 * df_batch_eval or, where it cannot be put back (a row count outside its rollback record's range, see
 * df_session_set_rollback_rows), reset. tokens and logits must stay valid until df_batch_eval. */
typedef struct df_batch df_batch;
DF_API int df_batch_init(df_batch **out, df_engine *eng, df_error *err);
DF_API void df_batch_free(df_batch *b);
DF_API void df_batch_clear(df_batch *b);
DF_API int df_batch_add(df_batch *b, df_session *s, const int32_t *tokens, int n, float *logits, int all_rows,
                        df_error *err);
DF_API int df_batch_eval(df_batch *b, df_error *err);

typedef struct df_stats {
    uint64_t tokens_evaluated;
    uint64_t expert_hits, expert_misses;   /* expert cache */
    uint64_t disk_bytes, net_bytes;        /* bytes read for weights */
    uint64_t expert_disk_bytes, spine_disk_bytes;   /* disk_bytes split by kind */
    uint64_t expert_loads;                 /* expert reads issued */
    uint64_t expert_requests;              /* experts asked for, per layer per batch (the union of a chunk) */
    uint64_t mem_budget;                   /* the budget in force */
    uint64_t cache_bytes, resident_spine_bytes, stream_buffer_bytes;   /* how it was split */
    uint64_t expert_bytes;                 /* bytes of one routed expert (largest) */
    int cache_slots, streamed_layers;      /* streamed_layers: spine re-read every pass (0: all resident) */
    int direct_fallbacks;                  /* files read buffered because O_DIRECT was refused */
    int io_uring;                          /* expert reads go through io_uring (else the pread pool) */
    uint64_t lookahead_loads;              /* expert reads started by look-ahead guesses */
    uint64_t lookahead_requests, lookahead_recalled;   /* experts asked for by layers that had a guess, and
                                                          how many of them the guess named (recall) */
    uint64_t warm_loads;                   /* expert reads started by warming from saved heat */
    double io_busy_s;                      /* seconds with reads in flight (the disk busy on our behalf) */
    int head_tiles;                        /* lm_head streamed in this many row tiles (0: in memory whole) */
    int split_layers;                      /* streamed layers read in parts, a few tensors at a time */
    uint64_t rollback_replays, rollback_reevals;       /* df_session_truncate calls served from the rollback
                                                          record / by evaluating the history again */
} df_stats;
DF_API void df_engine_stats(const df_engine *eng, df_stats *out);

/* Expert parallelism: the ranks serving this engine (1 without), and what rank r holds and has read. */
typedef struct df_rank_info {
    char host[64];
    char folder[512];                      /* its expert folder ("" = the model folder's shards) */
    int64_t experts_held, experts_shared;  /* experts it holds; of them, held by other ranks too (replicas) */
    int cache_slots;
    uint64_t cache_bytes;
    uint64_t expert_disk_bytes, expert_hits, expert_misses;
    uint64_t lookahead_loads;              /* its reads started by look-ahead guesses */
    uint64_t spine_bytes;                  /* the spine matrices and vectors it holds */
    int spine_first, spine_layers;         /* the layers whose projections it computes (spine split), or 0, 0 */
} df_rank_info;
typedef struct df_net_stats {
    uint64_t bytes_sent, bytes_recv, messages;   /* rank 0's, to and from the other ranks */
    double wait_s;                               /* rank 0's time waiting for the other ranks' answers */
    double link_wait_s;                          /* of it, what the messages' travel (latency and bytes, both
                                                    ways) accounts for; the rest is the others still working */
} df_net_stats;
DF_API int df_engine_ranks(const df_engine *eng);
/* Rank r's counters, asked of it now (an evaluation call: not beside another). */
DF_API int df_engine_rank_info(df_engine *eng, int r, df_rank_info *out, df_error *err);
DF_API void df_engine_net_stats(const df_engine *eng, df_net_stats *out);
/* DF_OK while every rank answers; after one is lost, DF_EIO with the message naming it in why. Callable from
 * any thread at any time. */
DF_API int df_engine_health(const df_engine *eng, char *why, size_t cap);
/* Look-ahead of one layer (the guess made before its attention): experts it asked for while a guess
 * was pending, how many of them the guess named (recall = recalled / requests), guessed reads, and how many
 * of its guess's most confident ranks are being read now (auto's current decision; 0: none). A guess ranks
 * its experts by the router's confidence (0 = a token's top choice); per rank, how many experts the scored
 * guesses named and how many of those the layer used (precision); ranks from DF_LOOKAHEAD_RANKS - 1 on are
 * counted together. Zeros for layers without routed experts. */
#define DF_LOOKAHEAD_RANKS 32
typedef struct df_layer_lookahead {
    uint64_t requests, recalled, loads;
    uint64_t guessed_rank[DF_LOOKAHEAD_RANKS], recalled_rank[DF_LOOKAHEAD_RANKS];
    int read_ranks;
} df_layer_lookahead;
DF_API void df_engine_lookahead_layer(const df_engine *eng, int layer, df_layer_lookahead *out);
/* With DF_HEAT_ON: waits until background warming has read what it will (`deltafin warm`). */
DF_API void df_engine_warm_wait(df_engine *eng);
/* Waits until the spine is in memory and faults the expert cache's memory in now. The engine otherwise does
 * both in the background: a spine read from the checkpoint's file mappings from open on, in the order the model
 * uses it; the cache a bounded distance ahead of use while it computes, all of it while idle. Benchmarks call it
 * so that their times leave out the one-time loading of the spine and zeroing of fresh pages. */
DF_API void df_engine_populate_wait(df_engine *eng);
/* Why a saved heat file was ignored (corrupt, other model), or "" when it was not. */
DF_API const char *df_engine_heat_note(const df_engine *eng);

/* Where evaluation time went, in seconds, accumulated since the engine opened (or the last reset):
 * waiting for spine and expert bytes, attention cores (KDA recurrence, MLA over the cache), routed-expert
 * matrix work, the output head (final norm and lm_head; waits for a streamed lm_head's tiles count as spine
 * reads), and the rest of the forward pass (projections, norms, router, embedding). With the spine split over
 * ranks, spine_remote is the time the other ranks took for the projections of the layers they hold (the link's
 * latency included). */
typedef struct df_profile {
    double spine_read, expert_read, attention, expert_compute, spine_compute, total;
    double lm_head, spine_remote;
} df_profile;
DF_API void df_engine_profile(const df_engine *eng, df_profile *out);

/* Where the engine's forward pass runs: "cpu" or "cuda" (df_engine_opts.gpu). */
DF_API const char *df_engine_backend(const df_engine *eng);
/* On a GPU engine: the device's memory read rate in GB/s, measured now over a buffer many times its cache, and
 * the weight bytes one decode token reads there (spine matrices but the embedding table, and the top-k routed
 * experts of every MoE layer): a benchmark's byte roofline is their quotient. 0 on the CPU. */
DF_API double df_engine_gpu_read_gbps(df_engine *eng);
DF_API uint64_t df_engine_decode_weight_bytes(const df_engine *eng);
DF_API void df_engine_profile_reset(df_engine *eng);

#ifdef __cplusplus
}
#endif
#endif
