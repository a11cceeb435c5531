/* policy.h — replacement policies for the expert slot bank, shared by the cache (cache.c) and the offline
 * simulator (`deltafin bench cache`), so the policy that is measured is the policy that runs.
 *
 * A policy sees requests for keys (one per use of an expert, hit or miss), which slot holds which key, and
 * picks a victim among the slots the caller allows. It never decides what is loaded; the cache does. Keys are
 * dense integers (the cache's per-layer expert numbering). Belady's offline optimum needs the future and so
 * exists only as a simulation over a recorded trace. */
#ifndef DF_STORE_POLICY_H
#define DF_STORE_POLICY_H

#include <stdint.h>

typedef enum {
    POLICY_LRU,      /* least recently used */
    POLICY_LFU,      /* least frequently used, counts decaying with a half-life (frequency and recency in one) */
    POLICY_ARC,      /* adaptive replacement cache: recency and frequency lists sized by ghost hits */
    POLICY_REUSE,    /* soonest expected reuse: decayed frequency of the expert per pass of its layer, plus how
                        far its layer is from the one being computed (layers are visited in order) */
    POLICY_COUNT
} policy_kind;

/* Simulation only: Belady's optimum; LFU knowing each expert's count over the whole trace in advance (the best
 * any popularity-based policy can do when routing is independent from token to token); and LFU told the next
 * token's selections (the records of the next pass over the layers), which it keeps while anything else may
 * go (more than any look-ahead guess can tell, so a bound on what guesses could add). */
#define POLICY_BELADY POLICY_COUNT
#define POLICY_ORACLE_FREQ (POLICY_COUNT + 1)
#define POLICY_ORACLE_NEXT (POLICY_COUNT + 2)

/* The policy an expert cache uses unless told otherwise. */
#define POLICY_DEFAULT POLICY_LFU

typedef struct policy policy;

/* Name ("lru", "lfu", "arc", "reuse", "belady", "oracle-lfu", "lfu+next") of a kind, and the kind of a name
 * (-1 if unknown; only the first four name policies a cache can run). */
const char *policy_name(int kind);
int policy_parse(const char *name);

/* Keys are grouped by layer: group g holds keys base[g] .. base[g+1]-1 (base has n_groups + 1 entries). */
policy *policy_new(int kind, int n_slots, int n_groups, const int64_t *base);
void policy_free(policy *p);
/* One use of key (before the caller looks it up): frequency and history bookkeeping. */
void policy_request(policy *p, int64_t key);
/* Prior knowledge: key was asked for about `weight` times in earlier runs (warming from saved heat). */
void policy_seed(policy *p, int64_t key, double weight);
/* The key of this slot was used now (recency). */
void policy_touch(policy *p, int slot);
/* Slot now holds key / slot is empty again. */
void policy_fill(policy *p, int slot, int64_t key);
void policy_clear(policy *p, int slot);
/* The occupied slot to evict among those ok(ctx, slot) allows; -1 if none. */
int policy_victim(policy *p, int (*ok)(const void *ctx, int slot), const void *ctx);

/* A recorded access sequence: keys[0..n) in order, cut into records (one prefetch each: the experts one layer
 * asks for at once) at rec[0] = 0 < rec[1] < ... < rec[n_rec] = n; keys grouped by layer as in policy_new. */
typedef struct policy_trace {
    const int64_t *keys, *rec;
    int64_t n, n_rec;
    int n_groups;
    const int64_t *base;
    int64_t count_from;      /* hits of accesses before this index are not counted (a warm-up prefix) */
} policy_trace;

/* Simulates a cache of n_slots over the trace, starting empty; returns the hits. As in the cache, a record's
 * experts are not evicted while the record is served (its prefetch list is known). kind is a policy_kind,
 * POLICY_BELADY, POLICY_ORACLE_FREQ or POLICY_ORACLE_NEXT. */
uint64_t policy_simulate(int kind, const policy_trace *t, int n_slots);

#endif
