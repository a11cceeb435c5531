/* deltafin.h — the public interface of libdeltafin.
 *
 * An engine is a loaded model (weights behind the storage layer, kernels, thread pool). A session is one
 * conversation's state (KDA recurrent + conv state, MLA latent cache, position). Sessions feed token ids and
 * get logits back; everything above that (tokenizer, chat formats, sampling, server) is built on this.
 *
 * Errors: every call that can fail returns DF_OK (0) or a negative df_status and fills a df_error with a
 * message naming the file/tensor/field at fault. Only programming errors and out-of-memory abort. */
#ifndef DELTAFIN_H
#define DELTAFIN_H

#include <stddef.h>
#include <stdint.h>

/* The release this header belongs to (`deltafin --version`). */
#define DF_VERSION "0.1.0"

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

typedef struct df_engine_opts {
    const char *model_dir;
    int n_threads;            /* 0 = all online cores */
    int alog_per_channel;     /* K3 A_log read per key channel instead of per head (SPEC §8.1); off by default */
    const char *isa;          /* kernel ISA ("scalar", "avx2", "avx512", "neon"); NULL = best, or $DELTAFIN_ISA */
    /* storage (issue 5): one memory budget for the resident spine, the expert cache and working buffers */
    uint64_t mem_budget;      /* bytes; 0 = 3/4 of physical RAM or of the memory-cgroup limit if lower */
    int expert_cache_slots;   /* > 0: exactly this many expert slots (tests, experiments); 0 = from the budget */
    int spine_stream;         /* 1: stream every layer's spine through two buffers even when it would fit */
    int buffered_io;          /* 1: buffered reads + POSIX_FADV_DONTNEED instead of O_DIRECT */
    int io_threads;           /* I/O threads; 0 = 8 */
    const char *remote_url;   /* issue 6: a partial install streams missing experts from this repository URL */
    int spine;                /* issue 4: DF_SPINE_BF16 (default) or DF_SPINE_INT8 */
    int io_mode;              /* O_DIRECT reader: 0 = the faster one measured here (io_uring), 1 = pread thread
                                 pool, 2 = io_uring (falls back to pread where io_uring cannot be set up) */
    int lookahead;            /* 1: predict layer i+1's experts with its router on layer i's MoE input and read
                                 them early (never changes results); 0 = off (the default: it did not pay) */
} df_engine_opts;

typedef struct df_model_info {
    const char *family;       /* "kimi_linear" or "kimi_k3" */
    int vocab_size;
    int hidden_size;
    int n_layers;
    int bos_id, eos_id;
    int64_t max_context;
} df_model_info;

void df_engine_opts_default(df_engine_opts *opts);
int df_engine_open(df_engine **out, const df_engine_opts *opts, df_error *err);
void df_engine_free(df_engine *eng);
const df_model_info *df_engine_info(const df_engine *eng);
/* Checks every tensor the forward pass will use against the config (names, shapes, dtypes). */
int df_engine_check(df_engine *eng, df_error *err);
/* Writes a human-readable description (family, schedule, byte counts, dtypes, problems) to buf. */
int df_engine_describe(const df_engine *eng, char *buf, size_t cap);

int df_session_init(df_session **out, df_engine *eng, df_error *err);
void df_session_free(df_session *s);
/* Consumes n tokens as one batch. logits: [n, vocab] when all_rows, else [vocab] for the last token;
 * may be NULL. */
int df_session_eval(df_session *s, const int32_t *tokens, int n, float *logits, int all_rows, df_error *err);
int64_t df_session_pos(const df_session *s);
/* Copies the whole state of src into dst (same engine): rollback, prefix reuse. */
int df_session_copy(df_session *dst, const df_session *src, df_error *err);
void df_session_reset(df_session *s);
/* Called after each layer of every evaluation with (ctx, layer, n_layers): progress for long prefills,
 * and the way to stop one — a non-zero return aborts the evaluation with DF_ECANCELLED (the session is
 * then reset). NULL removes it. */
typedef int (*df_step_fn)(void *ctx, int layer, int n_layers);
void df_session_set_step_callback(df_session *s, df_step_fn fn, void *ctx);

/* The session owns the tokens it has consumed: *n gets their count (= df_session_pos). Valid until the next
 * call that changes the session. */
const int32_t *df_session_tokens(const df_session *s, int64_t *n);
/* Brings the session to hold exactly ids[0..n) (n > 0): keeps the longest prefix it already holds as far as
 * its state can go back (to the start of its last evaluation; otherwise it restarts), evaluates the rest
 * (in chunks that fit the memory budget) and writes the logits after ids[n-1] into logits [vocab] (NULL
 * skips). *reused (may be NULL) gets how many leading tokens were not evaluated again. */
int df_session_sync(df_session *s, const int32_t *ids, int64_t n, float *logits, int64_t *reused, df_error *err);
/* Returns the session to position pos, which lies between the start of its last evaluation and now, as if
 * the tokens after pos had never been evaluated (speculation rollback). */
int df_session_truncate(df_session *s, int64_t pos, df_error *err);

/* Several sessions in one forward pass: each row belongs to a session (a decode token, verify tokens, a
 * prompt slice); every layer's spine is acquired once and every expert of the union read once per pass.
 * A session appears at most once per batch. logits: [n, vocab] when all_rows, else [vocab] (may be NULL).
 * On failure every session of the batch is left as it was before df_batch_eval or reset (see its status). */
typedef struct df_batch df_batch;
int df_batch_init(df_batch **out, df_engine *eng, df_error *err);
void df_batch_free(df_batch *b);
void df_batch_clear(df_batch *b);
int df_batch_add(df_batch *b, df_session *s, const int32_t *tokens, int n, float *logits, int all_rows,
                 df_error *err);
int df_batch_eval(df_batch *b, df_error *err);

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
} df_stats;
void df_engine_stats(const df_engine *eng, df_stats *out);

/* Where evaluation time went, in seconds, accumulated since the engine opened (or the last reset):
 * waiting for spine and expert bytes, attention cores (KDA recurrence, MLA over the cache), routed-expert
 * matrix work, and the rest of the forward pass (projections, norms, router, embedding, head). */
typedef struct df_profile {
    double spine_read, expert_read, attention, expert_compute, spine_compute, total;
} df_profile;
void df_engine_profile(const df_engine *eng, df_profile *out);
void df_engine_profile_reset(df_engine *eng);

void df_error_set(df_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
