/* trace.h — routing traces: which experts each layer asked for, one record per prefetch (a decode token's
 * selection, or the union of a prefill chunk's), recorded by the store when asked (--trace-routing FILE) and
 * read back by the cache simulator (`deltafin bench cache`). Text, so a trace can be inspected and cut:
 *
 *     deltafin-routing-trace 1
 *     experts E0 E1 ... E(L-1)          routed experts per layer (0 for dense layers)
 *     LAYER ID ID ...                   one line per record
 *
 * A recording appends to the file; each run starts with its own header, which must match the earlier ones. */
#ifndef DF_STORE_TRACE_H
#define DF_STORE_TRACE_H

#include <stdint.h>
#include "deltafin.h"

typedef struct rtrace_writer rtrace_writer;

int rtrace_writer_open(rtrace_writer **out, const char *path, int n_layers, const int *n_experts, df_error *err);
/* Thread-safe; each record is flushed, so a failing disk is reported here, naming the file. */
int rtrace_writer_record(rtrace_writer *w, int layer, const int *ids, int n, df_error *err);
/* Flushes and closes; returns a write error naming the file, if any. NULL is fine. */
int rtrace_writer_close(rtrace_writer *w, df_error *err);

/* A trace read back: accesses flattened in order, each a key = first key of its layer + expert id. */
typedef struct rtrace {
    int n_layers;
    int *n_experts;          /* per layer */
    int64_t *base;           /* first key of each layer; base[n_layers] = number of keys */
    int64_t *keys;
    int64_t n_access;        /* entries of keys */
    int64_t n_records;
    int64_t *rec;            /* record r is keys[rec[r] .. rec[r+1]) */
} rtrace;

int rtrace_read(rtrace *t, const char *path, df_error *err);
void rtrace_free(rtrace *t);

#endif
