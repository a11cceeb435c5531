/* readahead.h — whether a guess of a layer's experts, made before its attention runs, is worth reading
 * (look-ahead `auto`).
 *
 * Reading a guess early pays when the disk has idle time while the engine computes (then the right guesses
 * arrive for free and the wrong ones cost nothing but cache slots) and stops paying when the disk is already
 * busy (every wrong guess delays a needed read) or when the cache holds what will be needed (a wrong guess
 * evicts it). The policy measures, per layer, the guess's precision (share of its names the layer used) per
 * confidence rank, since the router's surest choices are right more often than its last; and globally the
 * disk's utilisation u by sure reads (time with reads other than guesses in flight on the I/O pool, so that
 * guesses do not count as taking the idle time they fill) and the cache's own hit rate h (a hit on an expert
 * a guess brought in counts as a miss). The layer's own reads (n per pass) keep the disk busy a share u of
 * the time, so a guess of g experts fits the idle time for a share fit = min(1, (1 - u) / u x n / g); the
 * right guesses read there are the gain, the wrong ones that spill into busy time (or evict cached experts)
 * the cost. Reading the w most confident ranks (g experts, precision p_r each) is worth
 *     sum p_r x fit x (1 - h)  -  sum (1 - p_r) x ((1 - fit) + h)
 * and auto reads the width w that is worth most, if any is worth anything (with hysteresis), and only while
 * reading is measured to cut the layer's wait for its experts (against passes without). So a busy disk
 * still gets the guesses the router is surest of. While it does not read, it still scores a guess every few
 * tokens (without reading) to keep the precisions current. The spine needs no such model: the next streamed
 * layer's bytes are always needed, so spine.c always reads them ahead, after the experts in priority and
 * before guesses. */
#ifndef DF_STORE_READAHEAD_H
#define DF_STORE_READAHEAD_H

#include "cache.h"
#include "io/io.h"

/* What auto decides from (fractions in [0, 1]). A guess ranks its experts by the router's confidence; per rank,
 * most confident first, the share of its experts the layer used (precision; < 0: not measured yet) and how
 * many experts it names per guess (size: 1 for one token, more for a batch). */
typedef struct ra_inputs {
    const double *precision, *size;
    int n_ranks;
    double per_pass;            /* experts the layer asks for per pass, i.e. its own reads before the cache */
    double util;                /* disk utilisation by sure reads, recent */
    double hit_rate;            /* the cache's own hits per request, recent */
} ra_inputs;

/* The decision rule alone: how many of the guess's most confident ranks to read (0: none), given how many are
 * being read now. */
int ra_read_ranks(const ra_inputs *in, int reading);

typedef struct readahead readahead;
/* mode: DF_LOOKAHEAD_*; cache and pool are borrowed (cache may be NULL: nothing to guess). */
readahead *readahead_new(int n_layers, int mode, ecache *cache, io_pool *pool);
void readahead_free(readahead *ra);
/* What to do with a guess of layer's experts now (STORE_LOOKAHEAD_* of store.h); with STORE_LOOKAHEAD_READ,
 * *read_ranks says how many of its most confident ranks to read. Thread-safe. */
int readahead_plan(readahead *ra, int layer, int *read_ranks);
/* How many ranks of layer's guesses auto reads now (0: none; on: DF_LOOKAHEAD_RANKS). */
int readahead_reading(readahead *ra, int layer);

#endif
