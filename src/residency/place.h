/* place.h — routed experts spread over several folders (one per device) so their reads add up the devices'
 * bandwidth. `deltafin place` copies each expert's contiguous span into FOLDER/deltafin-experts.bin, keeping
 * its offset modulo 4 KiB so the bytes land in a slot exactly as from the shard, and records where in
 * DIR/.deltafin/placement, a text file appended layer by layer after the data is synced:
 *
 *     deltafin-placement 1
 *     folder F PATH                  once per folder
 *     expert LAYER E F OFFSET LENGTH  once per placed expert
 *     done LAYER                     the layer's experts above are complete
 *
 * An interrupted copy resumes after the last "done"; lines after it are ignored. On open the store reads the
 * placement (folders may be renamed with --expert-dirs) and reads each placed expert from its folder. */
#ifndef DF_STORE_PLACE_H
#define DF_STORE_PLACE_H

#include <stdint.h>
#include "deltafin.h"

#define PLACE_FILE ".deltafin/placement"
#define PLACE_DATA "deltafin-experts.bin"

typedef struct place_entry {
    int folder;              /* -1: not placed (read from the shard) */
    uint64_t offset, length;
} place_entry;

typedef struct placement {
    int n_folders;
    char **folders;          /* folder paths (as recorded, or as overridden) */
    char **files;            /* FOLDER/deltafin-experts.bin */
    uint64_t *ends;          /* per folder: bytes the recorded experts use */
    int n_layers;
    int64_t *base;           /* first entry of each layer */
    place_entry *e;
    int last_done;           /* highest layer marked done, -1 if none */
    int64_t n_placed;
} placement;

/* Reads DIR/.deltafin/placement for a model of these layers/experts. *found = 0 (and DF_OK) when there is none.
 * override: comma-separated folders replacing the recorded ones in order (NULL: as recorded). Checks every
 * folder's data file exists and holds its experts: a missing or short one is an error naming the folder. */
int placement_load(placement *p, const char *dir, int n_layers, const int *n_experts, const char *override,
                   int *found, df_error *err);
void placement_free(placement *p);
/* Where expert (layer, e) is: *folder = -1 when it was not placed. */
void placement_where(const placement *p, int layer, int e, int *folder, uint64_t *offset, uint64_t *length);

/* What `deltafin place` copies: one expert's span in a shard file. */
typedef struct place_src {
    const char *path;        /* shard file */
    uint64_t offset, length; /* the contiguous span; length 0: not contiguous, left in place */
} place_src;

/* Copies the experts of every layer (src[layer][e]) into the folders, weights[f] of the bytes each (by expert
 * heat when given: hot experts spread first), resuming an interrupted run; prints progress to stderr when
 * verbose. Returns DF_OK with *placed = experts placed in total. */
int placement_write(const char *dir, int n_folders, const char *const *folders, const double *weights,
                    int n_layers, const int *n_experts, const place_src *const *src, const float *heat,
                    int verbose, int64_t *placed, df_error *err);

#endif
