/* spine_warm.h — a spine served from the shards' mappings, read into memory ahead of the model. Left to page
 * faults, the first pass reads it one fault's read-ahead at a time, inside its matmuls and never beside the
 * expert reads; a thread that asks for it in the order the model uses it, a few chunks in flight, turns
 * that into reads that overlap the model's work and the time before the first prompt. */
#ifndef DF_SPINE_WARM_H
#define DF_SPINE_WARM_H

#include <stddef.h>
#include <stdint.h>

typedef struct spine_warm spine_warm;

typedef struct warm_range {
    const uint8_t *p;   /* inside a read-only file mapping */
    size_t n;
} warm_range;

/* Starts reading the ranges, in order (copied); NULL when there is nothing to read or no thread to read it. */
spine_warm *spine_warm_start(const warm_range *r, int n);
/* Waits until every range is in memory and mapped (or the kernel refused one). NULL: returns at once. */
void spine_warm_wait(spine_warm *w);
/* Bytes in memory so far. */
uint64_t spine_warm_done(spine_warm *w);
/* Stops after the chunk in hand and frees. */
void spine_warm_free(spine_warm *w);

#endif
