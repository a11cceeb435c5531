/* spine.h — spine bytes read into memory the budget accounts for, instead of mapped: "units" (a decoder layer
 * or a part of one, the top-level tensors, an lm_head tile) made of regions (one per tensor), numbered in the
 * order a pass uses them. Resident units are read once at start; streamed units share two buffers: acquiring
 * unit i reads it unless already read, then starts reading the next streamed units into any free buffer, so
 * unit i+1 arrives while unit i computes (after the last one the first streamed unit is read for the next
 * token). */
#ifndef DF_STORE_SPINE_H
#define DF_STORE_SPINE_H

#include <stdint.h>
#include "io/io.h"

typedef struct spine_region {
    int file;
    uint64_t off, len;
    int elem;            /* element size: data is moved to a multiple of it if the file offset is not */
    uint64_t buf_off;    /* where the region's aligned span starts in the unit's buffer (set by spine_new) */
} spine_region;

typedef struct spine_unit {
    int n;
    spine_region *r;
    int resident;        /* read at start and kept */
    char name[48];       /* for errors: "layer 12" */
    uint64_t bytes;      /* buffer bytes needed (set by spine_new) */
} spine_unit;

typedef struct spine spine;

/* Bytes a unit's buffer needs (regions laid out at IO_ALIGN boundaries, with slack for realignment). */
uint64_t spine_unit_bytes(const spine_unit *u);
/* Takes ownership of units (and their regions); reads the resident ones before returning. */
int spine_new(spine **out, io_source *src, io_pool *pool, int n_units, spine_unit *units, df_error *err);
void spine_free(spine *sp);
/* The buffer holding unit's bytes, valid until spine_release; reads it first if needed. */
int spine_acquire(spine *sp, int unit, uint8_t **base, df_error *err);
void spine_release(spine *sp, int unit);
const spine_region *spine_unit_region(const spine *sp, int unit, int i);
/* Where region r's first byte is in a buffer returned for its unit. */
const uint8_t *spine_region_data(const uint8_t *base, const spine_region *r);
uint64_t spine_resident_bytes(const spine *sp);
uint64_t spine_stream_bytes(const spine *sp);   /* the two stream buffers together */
int spine_streamed_units(const spine *sp);

#endif
