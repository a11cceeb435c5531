/* tiles.c — row tiles of a big top-level matrix as streamed spine units (see tiles.h). */
#include "tiles.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

void tiles_init(tiles *t, const df_tensor *whole, uint64_t row_bytes, uint64_t tile_bytes, int first_unit) {
    int64_t rows = whole->shape[0];
    int64_t per = (int64_t)DF_MAX(1, tile_bytes / DF_MAX(row_bytes, 1));
    per = DF_MIN(per, (rows + 1) / 2);
    per = DF_MAX(per, 1);
    *t = (tiles){.first_unit = first_unit, .n = (int)((rows + per - 1) / per), .per = per, .whole = *whole,
                 .row_bytes = row_bytes};
    t->whole.data = NULL;
}

void tiles_units(const tiles *t, int file, uint64_t off, int elem, spine_unit *u) {
    int64_t rows = t->whole.shape[0];
    for (int j = 0; j < t->n; j++) {
        int64_t r0 = (int64_t)j * t->per, n = DF_MIN(t->per, rows - r0);
        u[j] = (spine_unit){.n = 1, .r = xcalloc(1, sizeof *u[j].r)};
        u[j].r[0] = (spine_region){file, off + (uint64_t)r0 * t->row_bytes, (uint64_t)n * t->row_bytes, elem, 0};
        snprintf(u[j].name, sizeof u[j].name, "lm_head tile %d", j);
    }
}

int tiles_acquire(spine *sp, const tiles *t, int j, df_tensor *out, df_error *err) {
    uint8_t *base = NULL;
    int rc = spine_acquire(sp, t->first_unit + j, &base, err);
    if (rc) return rc;
    *out = t->whole;
    out->shape[0] = DF_MIN(t->per, t->whole.shape[0] - (int64_t)j * t->per);
    out->data = spine_region_data(base, spine_unit_region(sp, t->first_unit + j, 0));
    return DF_OK;
}

void tiles_release(spine *sp, const tiles *t, int j) { spine_release(sp, t->first_unit + j); }
