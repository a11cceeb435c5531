/* kern_tiles.h — internal to src/kernels: the matmul_rows driver shared by the FMA paths (avx2, avx512, neon).
 *
 * The driver (kern_matmul_tiles, kernels.c) walks weight rows in groups that fit in L2, passes every group of
 * up to 4 activation rows over each group, calls the ISA's register tile for nw weight rows × na activation
 * rows, applies the I8 row scales and writes y. An ISA file supplies only its tile: an always-inline
 * tile(dt, nw, na, w, x, cols, pf, out) with dt, nw, na constant in each inlined copy, made into the per-dtype
 * functions, their table and the ISA's matmul_rows by KERN_TILES_DEFINE. */
#ifndef DF_KERN_TILES_H
#define DF_KERN_TILES_H

#include <string.h>
#include "kernels.h"

typedef struct {
    const uint8_t *d;   /* start of the row's data */
    const uint8_t *s;   /* MXFP4: the row's E8M0 scales */
} kern_wrow;

/* out[j*4 + i] = row j of w · x[i], for j < nw, i < na (na in 1..4, nw 1 or the ISA's full width). pf: the
 * next tile's weights (contiguous after this tile's rows) to prefetch, or NULL. */
typedef void (*kern_tiles_fn)(int nw, int na, const kern_wrow *w, const float *const *x, int64_t cols,
                              const uint8_t *pf, float *out);

typedef struct {
    const char *isa;
    int nw;                     /* weight rows of a full tile; the groups are multiples of it */
    unsigned prefetch_dtypes;   /* bit (1u << dtype): tiles are given pf */
    kern_tiles_fn fn[DF_DT_COUNT];   /* by weight dtype; NULL: not supported */
} kern_tiles;

/* The matmul_rows of df_kernels, for the ISA whose tiles ts holds. */
void kern_matmul_tiles(const kern_tiles *ts, const df_tensor *t, int64_t r0, int64_t r1, const float *x, int n,
                       float *y, int64_t ldy);

/* Weight c of a row of a dtype other than MXFP4 (whose rows are whole vectors), for the tiles' column tails. */
static inline float kern_weight_at(int dt, const kern_wrow *w, int64_t c) {
    uint16_t h;
    float f;
    switch (dt) {
    case DF_DT_F32: memcpy(&f, w->d + c * 4, 4); return f;
    case DF_DT_BF16: memcpy(&h, w->d + c * 2, 2); return df_bf16_to_f32(h);
    case DF_DT_F16: memcpy(&h, w->d + c * 2, 2); return df_f16_to_f32(h);
    default: return (float)(int8_t)w->d[c];
    }
}

/* How far ahead of the tile's reading point each row's own line is prefetched, in bytes, for dtypes whose rows
 * are long (I8 and 16-bit: 7 KB and more); 0: none (F32 here; MXFP4 prefetches the next tile instead).
 * Measured on AVX-512: I8 at 768 bytes and BF16 at 2048 beat next-tile prefetching and the other distances
 * tried (docs/PERFORMANCE.md, Kernels). */
static inline int64_t kern_ahead_bytes(int dt) {
    return dt == DF_DT_I8 ? 768 : dt == DF_DT_BF16 || dt == DF_DT_F16 ? 2048 : 0;
}

/* Prefetches byte `at` of each of the tile's nw rows (row_bytes long) into L1, or, past a row's end, the same
 * row of the next tile (nw rows on; rows are contiguous), whose start would otherwise arrive unprefetched.
 * Callers issue one per 64 bytes of row they read. */
static inline void kern_prefetch_ahead(const kern_wrow *w, int nw, int64_t at, int64_t row_bytes) {
    const int64_t o = at < row_bytes ? at : at + (int64_t)(nw - 1) * row_bytes;
    for (int j = 0; j < nw; j++) __builtin_prefetch(w[j].d + o, 0, 3);
}

/* The tile for weight dtype DT as a kern_tiles_fn: nw is NW (the full width) or 1, na 1..4, each a
 * constant in its own inlined copy of tile(). */
#define KERN_TILES_NA(DT, NW)                                   \
    switch (na) {                                               \
    case 1: tile(DT, NW, 1, w, x, cols, pf, out); return;       \
    case 2: tile(DT, NW, 2, w, x, cols, pf, out); return;       \
    case 3: tile(DT, NW, 3, w, x, cols, pf, out); return;       \
    default: tile(DT, NW, 4, w, x, cols, pf, out); return;      \
    }
#define KERN_TILE_SET(NAME, DT, NW)                                                                    \
    static void NAME(int nw, int na, const kern_wrow *w, const float *const *x, int64_t cols,          \
                     const uint8_t *pf, float *out) {                                                  \
        if (nw == (NW)) KERN_TILES_NA(DT, NW)                                                          \
        KERN_TILES_NA(DT, 1)                                                                           \
    }

/* The five dtypes' tiles, their kern_tiles table (isa name ISA, full width NW, PF: prefetch_dtypes) and
 * matmul_rows_ISA, the df_kernels entry, which runs them through kern_matmul_tiles. */
#define KERN_TILES_DEFINE(ISA, NW, PF)                                                                     \
    KERN_TILE_SET(ISA##_f32, DF_DT_F32, NW)                                                                \
    KERN_TILE_SET(ISA##_bf16, DF_DT_BF16, NW)                                                              \
    KERN_TILE_SET(ISA##_f16, DF_DT_F16, NW)                                                                \
    KERN_TILE_SET(ISA##_i8, DF_DT_I8, NW)                                                                  \
    KERN_TILE_SET(ISA##_mxfp4, DF_DT_MXFP4, NW)                                                            \
    static const kern_tiles ISA##_tiles = {#ISA, NW, PF,                                                   \
                                           {[DF_DT_F32] = ISA##_f32, [DF_DT_BF16] = ISA##_bf16,            \
                                            [DF_DT_F16] = ISA##_f16, [DF_DT_I8] = ISA##_i8,                \
                                            [DF_DT_MXFP4] = ISA##_mxfp4}};                                 \
    static void matmul_rows_##ISA(const df_tensor *t, int64_t r0, int64_t r1, const float *x, int n, float *y, \
                                  int64_t ldy) {                                                           \
        kern_matmul_tiles(&ISA##_tiles, t, r0, r1, x, n, y, ldy);                                          \
    }

#endif
