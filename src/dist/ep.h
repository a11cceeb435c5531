/* ep.h — expert parallelism over the ranks of a job (comm.h): rank 0 runs the whole engine and, at every MoE
 * layer, hands each other rank the routed experts it computes (one job message: the layer's expert inputs, the
 * routing and who computes what); the others serve those jobs from their own store and send back, group by
 * group, the weighted outputs of their experts, which rank 0 adds in the order the single-process engine does.
 * With the spine split over the ranks (rank_plan.spine_rank), rank 0 also sends the rank holding a layer each
 * projection's input, and that rank answers with the projection, computed by the same kernels.
 *
 * Messages are little-endian structs of 32-bit words; everything received is checked (magic, sequence, sizes,
 * layer, ids, assignment) before it is used, and a rank that breaks the protocol is named in the error. */
#ifndef DF_DIST_EP_H
#define DF_DIST_EP_H

#include "comm.h"
#include "model/model.h"
#include "rank_plan.h"

typedef struct dist_ep dist_ep;

/* What each rank reported when the job started (for info, /props and bench). */
typedef struct ep_rank_info {
    char host[64];
    char folder[512];          /* its expert folder, or "" for the model folder's shards */
    int64_t held, computed;    /* experts it holds; experts it computes (held and not by a lower rank alone) */
    int cache_slots;
    uint64_t cache_bytes;
    uint64_t expert_disk_bytes, expert_hits, expert_misses;   /* at the last ep_refresh_stats */
    uint64_t lookahead_loads;  /* its reads started by look-ahead guesses */
    uint64_t spine_bytes;      /* the spine it holds */
} ep_rank_info;

/* Rank 0: greets every other rank (checking they run the same model, plan and kernels, and that each opened its
 * share), and fills peers for the model. On a rank's failure to open the error is that rank's own message. */
int ep_leader_open(dist_ep **out, dist_comm *c, df_model *m, const rank_plan *plan, const char *isa, df_error *err);
const model_peers *ep_peers(const dist_ep *ep);
/* Tells the other ranks to stop serving (when none was lost). */
void ep_leader_close(dist_ep *ep);
int ep_ranks(const dist_ep *ep);
const ep_rank_info *ep_rank(const dist_ep *ep, int r);
/* The storage counters of an ep_rank_info (cache, reads, look-ahead, spine held) from this process's store. */
void ep_rank_info_counters(ep_rank_info *in, df_store *st);
/* Asks every rank for its storage counters now (between passes). */
int ep_refresh_stats(dist_ep *ep, df_error *err);
/* Of rank 0's time blocked on the others' replies (comm_counters' wait_s), the part the messages' travel accounts
 * for: each reply's round trip less the time the answering rank says it spent on the request. */
double ep_link_wait(const dist_ep *ep);
/* DF_OK while every rank answers; after a loss, the error that named the lost rank (thread-safe). */
int ep_health(const dist_ep *ep, char *why, size_t cap);

/* Another rank: answers rank 0's greeting (with open_err's message when this rank's store could not open: then
 * m is NULL and it returns that error after telling rank 0), then serves jobs until rank 0 closes or is lost. */
int ep_serve(dist_comm *c, df_model *m, const rank_plan *plan, const char *isa, const char *folder,
             const df_error *open_err, df_error *err);

#endif
