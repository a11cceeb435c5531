/* scratch.c — the forward pass's bump arena (see scratch.h for its growth rule). */
#include <stdlib.h>
#include <string.h>
#include "scratch.h"
#include "common/util.h"

static void *scratch_block(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n)) df_die("out of memory (%zu bytes of scratch)", n);
    return p;
}

void scratch_init(scratch *a, size_t cap) {
    memset(a, 0, sizeof *a);
    a->cap = scratch_size(cap, 1);
    a->base = scratch_block(a->cap);
}

void scratch_free(scratch *a) {
    for (int i = 0; i < a->n_spill; i++) free(a->spill[i]);
    free(a->spill);
    free(a->base);
    memset(a, 0, sizeof *a);
}

void *scratch_alloc(scratch *a, size_t n) {
    size_t sz = scratch_size(n, 1), at = a->used;
    a->used += sz;
    if (a->used > a->need) a->need = a->used;
    if (a->used <= a->cap) return a->base + at;
    if (a->n_spill == a->spill_cap) {
        a->spill_cap = a->spill_cap ? 2 * a->spill_cap : 16;
        a->spill = xrealloc(a->spill, (size_t)a->spill_cap * sizeof *a->spill);
    }
    a->grows++;
    return a->spill[a->n_spill++] = scratch_block(sz);
}

void *scratch_zalloc(scratch *a, size_t n) { return memset(scratch_alloc(a, n), 0, n); }

void scratch_end_pass(scratch *a) {
    a->used = 0;
    if (a->n_spill || a->need > a->cap) {
        for (int i = 0; i < a->n_spill; i++) free(a->spill[i]);
        a->n_spill = 0;
        free(a->base);
        a->cap = scratch_size(a->need + a->need / 2, 1);
        a->base = scratch_block(a->cap);
        a->grows++;
    }
    a->need = 0;
}
