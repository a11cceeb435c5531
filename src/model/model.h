/* model.h — the forward pass of Kimi-Linear and Kimi K3 over the storage seam, and its per-conversation
 * state. The engine (src/engine) owns a df_model and one df_state per session. */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include <stdint.h>
#include "deltafin.h"
#include "backend.h"
#include "config.h"
#include "kernels/kernels.h"
#include "residency/store.h"
#include "scratch.h"
#include "weights.h"

/* Expert parallelism (src/dist computes the other ranks' share): one MoE layer's routed experts of a pass, as
 * rank 0 hands them out. Every array is the job's; rank[] is filled by model_peers.assign. Groups: consecutive
 * runs of uniq, [group_end[g-1], group_end[g]), whose outputs fit the expert output pool at once (a decode
 * batch is one group, a long prompt several). */
typedef struct moe_job {
    int layer, T, k, Dz;
    const int *ids;            /* [T, k] the routing */
    const float *wts;          /* [T, k] its weights */
    const float *z;            /* [T, Dz] what the experts take (the latent rows, or the normed hidden rows) */
    int n_uniq;
    const int *uniq;           /* experts of the union, ascending */
    const int *rows;           /* [n_uniq] rows routed to each */
    int *rank;                 /* [n_uniq] the rank computing each */
    int n_groups;
    const int *group_end;      /* [n_groups] */
} moe_job;

/* The other ranks, as rank 0's MoE layers see them. assign chooses who computes each expert (deterministic);
 * dispatch sends the job to the ranks that have a share; collect receives group g's outputs computed elsewhere:
 * out[u] (NULL for those rank 0 computes) gets rows[u] x Dz floats, each row its routing weight x the expert's
 * output, exactly what rank 0 would have computed.
 *
 * With the spine split over ranks (spine_rank non-NULL), a layer whose spine_rank is not 0 has its matrices on
 * that rank (all but those the attention reads itself, MLA's kv_b): matmul sends it x [T, cols] once for n
 * (at most MODEL_MATMUL_MAX) matrices w[i] of that width and returns each out[i] [T, rows of w[i]] as it
 * computed it, with the same kernels, so the result is the same bits. */
#define MODEL_MATMUL_MAX 8
typedef struct model_peers {
    void *ctx;
    void (*assign)(void *ctx, moe_job *job);
    int (*dispatch)(void *ctx, const moe_job *job, df_error *err);
    int (*collect)(void *ctx, const moe_job *job, int g, float *const *out, df_error *err);
    /* Look-ahead: the guess of a layer's experts (most confident first, rank[i] ids[i]'s confidence rank), which
     * every other rank reads ahead of its share as its own store decides. */
    void (*hint)(void *ctx, int layer, const int *ids, const int *rank, int n);
    const int16_t *spine_rank;     /* [n_layers]; NULL: every layer's spine is here */
    int (*matmul)(void *ctx, int layer, int n, const char *const *keys, const df_tensor *const *w, const float *x,
                  int T, float *const *out, df_error *err);
} model_peers;

typedef struct df_model {
    df_config cfg;
    df_store *store;           /* borrowed */
    df_kern *kern;             /* borrowed */
    int alog_per_channel;      /* alternative per-channel reading of K3's A_log; off by default */
    const char *dir;           /* for messages */
    df_profile prof;           /* accumulated phase times; spine_compute is derived at read time */
    model_weights w;           /* bound at model_init */
    scratch sc;                /* the working memory of a pass (one pass at a time) */
    const model_peers *peers;  /* NULL: this process computes every expert */
    const model_ops *ops;      /* where the arithmetic runs (backend.h); model_init sets the CPU's if NULL */
    void *be;                  /* that backend's context */
} df_model;

/* After cfg, store, kern, dir and alog_per_channel are set: binds the weights (model_weights_bind) and sizes
 * the scratch arena for passes of up to rows rows (model_scratch_bytes). */
int model_init(df_model *m, int rows, df_error *err);
void model_free(df_model *m);
/* Scratch bytes a pass of T rows takes over any number of sessions, whose contexts before the pass hold up to
 * MODEL_SCORE_POSITIONS tokens (the MLA attention scores grow with the context: a longer one grows the arena). */
size_t model_scratch_bytes(const df_model *m, int T);
#define MODEL_SCORE_POSITIONS 8192

/* Rows the mixers and GLUs take at once (a longer pass runs them block by block, using each matrix once per
 * block): a pass of at most this many rows uses each weight matrix once. */
#define MODEL_BLOCK_ROWS 256

/* Adds the seconds since *t0 to a phase and restarts the clock. */
double model_clock(double *phase, double t0);

/* KDA layer: recurrent state S[h][j][v] (key channel j, value channel v) and the last W-1 pre-conv
 * inputs per channel of [q|k|v], oldest first. MLA layer: the post-norm latent c and raw rope key r of
 * every position so far. All in the backend's memory (model_ops.mem_*). */
typedef struct df_layer_state {
    float *S;                  /* [Hk, Dk, Dk] */
    float *conv;               /* [W-1, 3Pk] */
    float *c, *r;              /* [cap, Lc], [cap, Nr] */
    int64_t cap;
    /* KDA rollback record of the last evaluation (see df_state.rec_*): S and conv at its start, then per
     * token the pre-conv [q|k|v] inputs and the k, v, g, beta the recurrence consumed. */
    float *rec;
    int64_t rec_cap;           /* floats allocated in rec */
} df_layer_state;

typedef struct df_state {
    df_model *m;               /* the model whose backend holds the layers' memory */
    int64_t pos;               /* tokens consumed */
    df_step_fn step;           /* optional per-layer callback; non-zero aborts */
    void *step_ctx;
    int n_layers;
    df_layer_state *layers;
    /* Rollback: an evaluation of 2 to rec_max rows (state_records) keeps what state_rewind needs to return
     * to any position in [rec_pos0, pos] without the weights. rec_valid: the record covers the last
     * evaluation. One-row passes keep none: plain decoding never goes back and should not pay for the copy
     * of the KDA state a record starts with. */
    int rec_max;
    int rec_valid;
    int rec_T;                 /* rows of the recorded evaluation */
    int64_t rec_pos0;
} df_state;

static inline int state_records(const df_state *s, int T) { return T >= 2 && T <= s->rec_max; }

/* One session's rows in a forward pass: the next T rows of the batch belong to state s. logits: [T, vocab]
 * if all_rows, else the last row only; NULL skips. restored (out): after a failed pass, 1 if the state was
 * put back as it was before the pass, 0 if it must be reset. */
typedef struct model_seg {
    df_state *s;
    int T;
    float *logits;
    int all_rows;
    int restored;
    df_state *snap;     /* if not NULL: gets s as it was at position snap_at, within this pass's rows */
    int64_t snap_at;
} model_seg;

df_state *state_new(df_model *m);
void state_free(df_state *s);
void state_reset(df_model *m, df_state *s);
void state_copy(df_model *m, df_state *dst, const df_state *src);
/* Returns the state to pos in [rec_pos0, s->pos] by replaying the KDA recurrence from the record (no weight
 * reads; the MLA caches are cut back by position). Fails (-1) without a valid record covering pos. */
int state_rewind(df_model *m, df_state *s, int64_t pos);
/* After a pass whose segment asked for a snapshot of s at pos (model_seg.snap): completes it. */
void state_snapshot_finish(df_model *m, df_state *snap, const df_state *s, int64_t pos);
/* Rows up to which an evaluation keeps the rollback record (0: none, and the record's memory is freed). */
void state_set_record_rows(df_state *s, int rows);
/* Bytes s holds: KDA states, MLA caches (allocated), rollback record. */
uint64_t state_bytes(const df_model *m, const df_state *s);
/* Bytes a session holds once it has consumed n_tokens, with a rollback record of rollback_rows
 * (df_session_state_bytes). */
uint64_t state_bytes_for(const df_config *c, int64_t n_tokens, int rollback_rows);
/* The whole state as bytes: state_blob_size(m, pos) bytes for a state at pos; state_blob_put writes them,
 * state_blob_get reads them into s (which must be reset; sets s->pos). */
uint64_t state_blob_size(const df_model *m, int64_t pos);
void state_blob_put(const df_model *m, const df_state *s, uint8_t *out);
void state_blob_get(df_model *m, df_state *s, int64_t pos, const uint8_t *in);

/* One forward pass over the rows of n_seg sessions (tokens: their rows concatenated, in seg order; each
 * state appears once): projections, norms, routing and experts run over all rows together, the KDA
 * recurrence and MLA attention per session on its own state. Appends to every state. A single session's
 * evaluation is the one-segment case. */
int model_forward_batch(df_model *m, model_seg *seg, int n_seg, const int32_t *tokens, df_error *err);
/* Another rank's side of expert parallelism: computes the experts of group g of job that rank me is assigned
 * (the job checked by the caller), writing their outputs one after another in ascending order of uniq into out
 * (rows[u] x Dz floats each). With g == 0 it first asks storage for all of this rank's experts of the job. */
int moe_job_serve(df_model *m, const moe_job *job, int me, int g, float *out, df_error *err);
/* The groups the expert output pool cuts a union into (see moe_job); returns their count. */
int moe_job_groups(const df_config *c, int T, const int *rows, int n_uniq, int *group_end);

/* Reads every layer's spine once (the tensors' names, shapes and dtypes were checked at model_init). */
int model_check(df_model *m, df_error *err);

#endif
