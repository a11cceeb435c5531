/* engine_internal.h — the engine and session structs, shared by the files of src/engine (the public API in
 * engine.c, session files in session_file.c). */
#ifndef DF_ENGINE_INTERNAL_H
#define DF_ENGINE_INTERNAL_H

#include "deltafin.h"
#include "dist/comm.h"
#include "dist/ep.h"
#include "dist/rank_plan.h"
#include "model/model.h"

struct df_engine {
    df_store *store;
    uint64_t tokens_evaluated;
    uint64_t rollback_replays, rollback_reevals;   /* truncations from the record / by evaluating again */
    df_kern kern;
    df_model model;
    df_model_info info;
    int pass_rows;             /* the most rows whose working memory fits the budget's working reserve */
    /* A pass over several sessions: their tokens concatenated and their segments, grown to the largest batch */
    int32_t *pass_tokens;
    model_seg *pass_seg;
    int pass_tokens_cap, pass_seg_cap;
    /* expert parallelism (opts.ranks): the job, the plan, this rank's experts, rank 0's side of the exchange */
    dist_comm *comm;
    rank_plan plan;
    uint8_t *mask;
    dist_ep *ep;
    char gpu_note[600];        /* why no GPU is used, when one was asked for ("auto") and none is */
};

struct df_session {
    df_engine *eng;
    df_state *state;
    int32_t *hist;             /* the tokens the state has consumed, [pos] */
    int64_t hist_cap;
    int64_t last_start;        /* position where the last evaluation began */
    float *last_logits;        /* [vocab]: logits after the last token, when last_valid */
    int last_valid;
    df_session *snap_into;     /* df_session_snapshot_at: gets this session at snap_pos in the pass that reaches it */
    int64_t snap_pos;
};

/* Makes room for n tokens of history. */
void session_hist_reserve(df_session *s, int64_t n);

#endif
