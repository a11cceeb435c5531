/* heat.h — per-expert heat kept across runs in DIR/.deltafin/heat: how often each routed expert was asked for,
 * older runs weighing less. The store counts requests while it runs, saves at close (temp file, fsync,
 * rename: a crash leaves the old file or the new one, never a torn one) and, on open, warms the expert cache
 * with the hottest experts. A file that fails validation is ignored with a note.
 *
 * File (little-endian): "DFHEAT1\n", u32 layers, u32 experts per layer, f32 heat per expert (layer-major),
 * u64 FNV-1a of everything before it. */
#ifndef DF_STORE_HEAT_H
#define DF_STORE_HEAT_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

#define HEAT_FILE ".deltafin/heat"

typedef struct heat heat;

/* A table for this model shape, filled from DIR/.deltafin/heat when that file is valid for it. A missing file
 * gives an empty table and an empty note; an invalid one an empty table and a note saying why it was ignored. */
heat *heat_load(const char *dir, int n_layers, const int *n_experts, char *note, size_t note_cap);
void heat_free(heat *h);
/* Counts one request for each of these experts of this layer (thread-safe). */
void heat_add(heat *h, int layer, const int *ids, int n);
/* Writes the table (earlier runs' heat decayed, this run's added) to DIR/.deltafin/heat atomically; nothing when
 * this run counted no request. */
int heat_save(heat *h, const char *dir, df_error *err);
/* Up to max experts with heat, hottest first: their layers, ids and heat. Returns how many. */
int heat_top(const heat *h, int max, int *layers, int *ids, float *weights);
/* One line for `deltafin info`: total heat, experts with heat, share of the hottest tenth. */
void heat_summary(const heat *h, char *buf, size_t cap);

#endif
