/* tiles.h — a top-level matrix too big for the memory budget (lm_head at K3 shapes: 2.35 GB in BF16) served
 * as tiles of whole rows that stream through the spine's two buffers like streamed layers: while tile j is
 * multiplied, tile j+1 is read, and after the last tile the first streamed layer of the next token. */
#ifndef DF_STORE_TILES_H
#define DF_STORE_TILES_H

#include <stdint.h>
#include "deltafin.h"
#include "common/tensor.h"
#include "spine.h"

typedef struct tiles {
    int first_unit, n;       /* spine units first_unit .. first_unit + n - 1 */
    int64_t per;             /* rows per tile (the last tile may have fewer) */
    df_tensor whole;         /* dtype and shape [rows, cols] of the matrix; data unused */
    uint64_t row_bytes;
} tiles;

/* Splits a [rows, cols] matrix of row_bytes per row into tiles of about tile_bytes (at least one row each, at
 * least two tiles) numbered from spine unit first_unit. */
void tiles_init(tiles *t, const df_tensor *whole, uint64_t row_bytes, uint64_t tile_bytes, int first_unit);
/* Fills the spine units of the tiles (u[0..t->n)) for a matrix stored at file offset off of file `file`. */
void tiles_units(const tiles *t, int file, uint64_t off, int elem, spine_unit *u);
/* Tile j as a [rows_j, cols] view valid until tiles_release. */
int tiles_acquire(spine *sp, const tiles *t, int j, df_tensor *out, df_error *err);
void tiles_release(spine *sp, const tiles *t, int j);

#endif
