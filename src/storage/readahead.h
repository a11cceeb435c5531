/* readahead.h — whether a guess of the next layer's experts is worth reading (look-ahead `auto`).
 *
 * Reading a guess early pays when the disk has idle time while the engine computes (then the right guesses
 * arrive for free and the wrong ones cost nothing but cache slots) and stops paying when the disk is already
 * busy (every wrong guess delays a needed read) or when the cache holds what will be needed (a wrong guess
 * evicts it). The policy measures, per layer, the guess's recall (share of the layer's experts it named) and
 * precision (share of its names the layer used), and globally the disk's utilisation u (time with reads in
 * flight on the I/O pool) and the cache hit rate. A guess is about as many reads as the layer's own, which
 * keep the disk busy a share u of the time, so the share of the guess's reads that fits the idle time is
 * fit = min(1, (1 - u) / u); the right guesses read there are the gain (as far as the cache would miss them),
 * the wrong ones that spill into busy time (or evict cached experts) the cost. It reads a layer's guess while
 *     recall x fit x (1 - hit rate)  >  (1 - precision) x ((1 - fit) + hit rate)
 * with hysteresis, and only while reading is measured to cut the layer's wait for its experts (against passes
 * without). While it does not read, it still scores a guess every few tokens (without reading) to keep the
 * recall current. The spine needs no such model: the next streamed layer's bytes are always needed, so
 * spine.c always reads them ahead, after the experts in priority. */
#ifndef DF_STORE_READAHEAD_H
#define DF_STORE_READAHEAD_H

#include "cache.h"
#include "io.h"

/* What auto decides from (all fractions in [0, 1]). */
typedef struct ra_inputs {
    double recall, precision;   /* of this layer's guesses, recent */
    double util;                /* disk utilisation, recent */
    double hit_rate;            /* expert cache hits per request, recent */
} ra_inputs;

/* The decision rule alone: 1 = read the guesses, given whether they are being read now. */
int ra_should_read(const ra_inputs *in, int reading);

typedef struct readahead readahead;
/* mode: DF_LOOKAHEAD_*; cache and pool are borrowed (cache may be NULL: nothing to guess). */
readahead *readahead_new(int n_layers, int mode, ecache *cache, io_pool *pool);
void readahead_free(readahead *ra);
/* What to do with a guess of layer's experts now (STORE_LOOKAHEAD_* of store.h). Thread-safe. */
int readahead_plan(readahead *ra, int layer);
/* Whether auto currently reads layer's guesses (on: always; off: never). */
int readahead_reading(readahead *ra, int layer);

#endif
