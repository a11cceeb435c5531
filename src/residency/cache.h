/* cache.h — the expert cache: a fixed bank of equally sized, aligned slots shared by all layers, each holding
 * one routed expert's bytes. Experts are looked up by (layer, expert); a miss takes an empty slot, else the
 * one the replacement policy (policy.h) picks among those neither pinned (acquired and not yet released) nor
 * holding a prefetched expert not yet used.
 * A prefetch list is loaded in order as far as free slots allow and topped up as slots are released, so a
 * layer whose selection exceeds the bank still streams. Concurrent requests for one expert share one read.
 * The bytes are filled by a load callback (storage's reader), run on the I/O pool for prefetches and on the
 * requesting thread for unannounced misses. Look-ahead hints read experts of a coming layer into otherwise idle
 * slots at low priority. */
#ifndef DF_STORE_CACHE_H
#define DF_STORE_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include "io/io.h"
#include "store.h"

typedef struct ecache ecache;

/* Fills slot (slot_bytes, IO_ALIGN-aligned) with expert (layer, e) and sets *view to point into it. */
typedef int (*ecache_load_fn)(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err);

typedef struct ecache_stats {
    uint64_t hits, misses;   /* requests served from a slot vs read (prefetch or acquire) */
    uint64_t loads;          /* load callbacks run */
    uint64_t waits;          /* acquires that found their expert still being read */
    uint64_t evictions;
    uint64_t lookahead_loads;     /* reads started by look-ahead hints */
    uint64_t lookahead_hits;      /* hits on experts those reads brought in (the rest of hits: the cache's own) */
    uint64_t lookahead_requests;  /* experts prefetched for layers that had a hint */
    uint64_t lookahead_recalled;  /* of those, experts the hint had named */
    uint64_t warm_loads;     /* reads started by warming */
    int populated_slots;     /* slots the background thread has faulted in (from slot 0 up) */
    int slots;
    size_t slot_bytes;
} ecache_stats;

/* Look-ahead for one layer: experts it asked for while a guess for it was pending and how many of them the
 * guess named (recall); per confidence rank (as in df_layer_lookahead), how many experts the scored guesses
 * named and how many of those it used (precision); guesses scored, guessed reads started, guesses hinted for
 * reading; and what the guesses are meant to shrink: the layer's prefetches (passes) and the seconds
 * ecache_acquire_next waited for its experts. */
typedef struct ecache_hint_stats {
    uint64_t requests, recalled, loads, read_hints, passes, scored;
    uint64_t guessed_rank[DF_LOOKAHEAD_RANKS], recalled_rank[DF_LOOKAHEAD_RANKS];
    double wait_s;
} ecache_hint_stats;

/* populate_ahead: bytes of slots beyond those used so far whose pages a background thread faults in. */
ecache *ecache_new(int n_layers, const int *n_experts, int n_slots, size_t slot_bytes, size_t populate_ahead,
                   io_pool *pool, ecache_load_fn load, void *ctx);
/* Waits for reads in flight, then frees the bank. */
void ecache_free(ecache *c);
/* Replaces the prefetch list with these experts of this layer (in this order). */
void ecache_prefetch(ecache *c, int layer, const int *ids, int n);
/* A guess (look-ahead) of n experts of a layer, most confident first: rank[i] (ascending) is ids[i]'s confidence
 * rank (0 = a top choice). Reads those ranked below read_ranks that are not cached into slots that hold nothing
 * wanted or pinned, at the lowest I/O priority; they stay ordinary cache entries. Leaves the prefetch list
 * alone. Read or not, the layer's next prefetch scores the guess: recall, and precision per rank. */
void ecache_hint(ecache *c, int layer, const int *ids, const int *rank, int n, int read_ranks);
void ecache_hint_layer(ecache *c, int layer, ecache_hint_stats *out);
int ecache_acquire(ecache *c, int layer, int e, df_expert *out, df_error *err);
/* Acquires whichever of these experts of this layer not yet marked in done[] is ready first (waiting while any
 * is being read; reading one here when none is on its way), marks it and sets *which to its index in ids. On
 * an error *which names the expert that failed. */
int ecache_acquire_next(ecache *c, int layer, const int *ids, int n, uint8_t *done, int *which, df_expert *out,
                        df_error *err);
void ecache_release(ecache *c, int layer, int e);
void ecache_get_stats(ecache *c, ecache_stats *out);
/* Warming: tells the policy these experts' heat and reads them, hottest first and one at a time at low
 * priority, into empty slots only, until the bank is full; never evicts and never delays a request beyond
 * one read in flight. Call before the first request. */
void ecache_warm(ecache *c, int n, const int *layers, const int *ids, const float *heat);
/* Waits until warming has read all it will. */
void ecache_warm_wait(ecache *c);
/* Faults the whole bank in now (it is otherwise done in the background: ahead of use while the model is busy,
 * all of it while idle) and waits for it, so that later reads never zero fresh pages. */
void ecache_populate_wait(ecache *c);
/* Replaces the replacement policy (a policy_kind; POLICY_DEFAULT until called). */
void ecache_set_policy(ecache *c, int kind);

#endif
