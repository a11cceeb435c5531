/* kernels_amx.c — MXFP4 matmul of several activation rows on AMX tiles (TDPBF16PS), exact like the FMA paths.
 *
 * Every MXFP4 weight, E2M1 × 2^(s-127), is exactly a bf16 (a 2-bit significand; for 2 <= s <= 160 a normal
 * one). Every fp32 activation x splits exactly into three bf16 parts, x = hi + mid + lo (hi = bf16(x),
 * mid = bf16(x - hi), lo = x - hi - mid: 8 + 8 + 8 bits of x's 24), and a bf16 × bf16 product is exact in
 * fp32. So TDPBF16PS over the three parts sums the same exact products as the fp32 FMA paths, in another
 * order. What AMX does differently is flush subnormals (inputs and results) to zero; to keep that harmless,
 * each activation row is first scaled by a power of two 2^E (exact) so that its largest |x| lies in
 * [2^60, 2^61), and the result is scaled back by 2^-E: what can then be flushed is below 2^-126 in scaled
 * units (docs/PERFORMANCE.md, Kernels, gives the bound). Rows whose scales fall outside [2, 160] (weights
 * subnormal in bf16, or sums that could overflow once scaled), and calls with non-finite activations or
 * fewer than AMX_MIN_N rows, go to the AVX-512 path instead, row by row, so a row's result never depends
 * on how rows are split between threads.
 *
 * Tiles: the weights are the A operand (16 weight rows × one 32-column block, dequantised to bf16 by a
 * 16-entry vpermw table into an L1 buffer, a chunk of blocks × RG rows at a time), the activation parts the
 * B operand (built once per call by amx_pack, see amx_shape), the C tiles 16 weight rows × 16 columns, four
 * of them (RG rows) at a time. Linux grants the tile state only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM), which kern_amx_usable makes; without it this path is not offered. */
#include <string.h>
#include "kernels.h"
#include "common/util.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512F__) && \
    defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

enum {
    AMX_MIN_N = 4,     /* fewer activation rows: the AVX-512 path (faster there, measured) */
    S_MIN = 2,         /* scales outside [S_MIN, S_MAX]: that row on the AVX-512 path */
    S_MAX = 160,
    X_TOP = 60,        /* scaled rows have max |x| in [2^X_TOP, 2^(X_TOP+1)) */
    RG = 64,           /* weight rows per group: four A tiles, four C tiles */
    SG = 1,            /* groups per super-group, which share each chunk's B tiles (1 measured best: the
                        * weight stream from RAM matters more than B tile reuse) */
    CHUNK = 4,         /* blocks per chunk (one cache line of each row) */
    HDR = 16,          /* floats of header before the per-row unscale factors */
    ROW_MODE_MAX = 5,  /* up to this many activation rows: all three parts in one B tile */
};

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

int kern_amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 0;   /* AMX-TILE, AMX-BF16 */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return 0;   /* AVX512_BF16 */
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: once granted it stays granted; asking again is harmless */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

/* How the activation parts fill the B tiles. Up to ROW_MODE_MAX rows: one B tile per block whose column
 * 3i+p is part p of row i (one TDPBF16PS per weight tile and block; the three columns of a row are added
 * at the end). More rows: sets of 16 rows, three B tiles per set and block (one per part), all three
 * accumulating into the same C columns. */
typedef struct {
    int sets, parts;
} amx_shape;

static amx_shape amx_shape_of(int n) {
    return n <= ROW_MODE_MAX ? (amx_shape){1, 1} : (amx_shape){(n + 15) / 16, 3};
}

/* Float offsets of the parts of the packed x: the AVX-512 layout first (for the fallback), then the header
 * (HDR floats, [0] = 1 if AMX may be used, then 2^-E per row, padded to 16), then the B tiles, 256 dwords
 * each, tile (set, block, part) at ((set * blocks + block) * parts + part) * 256. */
static int64_t amx_hdr_at(const df_tensor *w, int n) { return (int64_t)n * w->shape[1]; }
static int64_t amx_tiles_at(const df_tensor *w, int n) { return amx_hdr_at(w, n) + HDR + (n + 15) / 16 * 16; }
static int64_t amx_tile_dwords(const df_tensor *w, int n) {
    amx_shape sh = amx_shape_of(n);
    return (int64_t)sh.sets * (w->shape[1] / 32) * sh.parts * 256;
}

static size_t amx_pack_floats(const df_tensor *w, int n) {
    if (w->dtype != DF_DT_MXFP4 || n < AMX_MIN_N) return (size_t)n * w->shape[1];
    return (size_t)(amx_tiles_at(w, n) + amx_tile_dwords(w, n));
}

#define AI static inline __attribute__((always_inline))

/* The A tiles hold a block's 32 weights in the order the dequantisation produces them: word u is column
 * 4 (u % 8) + u / 8. Pair k of a B tile row (words 2k, 2k+1) must hold the same two columns. */
AI __m512i b_pair_order(void) {
    uint16_t idx[32];
    for (int u = 0; u < 32; u++) idx[u] = (uint16_t)(4 * (u % 8) + u / 8);
    return _mm512_loadu_si512(idx);
}

/* 32 fp32 (x0 = columns 0..15, x1 = 16..31) rounded to bf16, in column order; *r0, *r1 get x minus that,
 * exactly (the remainder has at most 16 significant bits of x's 24). */
AI __m512i split_part(__m512 x0, __m512 x1, __m512 *r0, __m512 *r1) {
    __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h));
    __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1));
    *r0 = _mm512_sub_ps(x0, _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)));
    *r1 = _mm512_sub_ps(x1, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    return h;
}

/* In-register transpose of 16 rows of 16 dwords: swaps the off-diagonal blocks at sizes 8, 4, 2, 1. Row j
 * (j & s == 0) takes element k & s from row j+s at k-s; row j+s takes element k, !(k & s), from row j at
 * k+s. Index tables: [size][k], 16+ meaning the second source. */
static const int32_t tr_lo[4][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
};
static const int32_t tr_hi[4][16] = {
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
};

AI void transpose16(__m512i r[16]) {
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
        const int s = 8 >> l;
        __m512i va = _mm512_loadu_si512(tr_lo[l]), vb = _mm512_loadu_si512(tr_hi[l]);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            if (j & s) continue;
            __m512i a = r[j], b = r[j + s];
            r[j] = _mm512_permutex2var_epi32(a, va, b);
            r[j + s] = _mm512_permutex2var_epi32(a, vb, b);
        }
    }
}

/* The three parts of row xi's block b (32 columns), scaled by sc, each as 16 dwords in B pair order. */
AI void split_block(const float *xi, int64_t b, __m512 sc, __m512i order, __m512i out[3]) {
    __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(xi + 32 * b), sc);
    __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(xi + 32 * b + 16), sc);
    __m512 r0, r1, q0, q1, z0, z1;
    out[0] = _mm512_permutexvar_epi16(order, split_part(x0, x1, &r0, &r1));
    out[1] = _mm512_permutexvar_epi16(order, split_part(r0, r1, &q0, &q1));
    out[2] = _mm512_permutexvar_epi16(order, split_part(q0, q1, &z0, &z1));
}

/* Every part computes the row scales (cheap next to the split) and part 0 writes them to the header. */
static void amx_pack(const df_tensor *w, const float *x, int n, float *xp, int part, int parts) {
    kern_avx512()->pack(w, x, n, xp, part, parts);
    if (n < AMX_MIN_N) return;
    int64_t cols = w->shape[1], nb = cols / 32, b0, b1;
    kern_pack_blocks(nb, part, parts, &b0, &b1);
    amx_shape sh = amx_shape_of(n);
    float *hdr = xp + amx_hdr_at(w, n);
    uint32_t *tiles = (uint32_t *)(xp + amx_tiles_at(w, n));
    const __m512i order = b_pair_order();
    int ok = 1;
    float *upf = xmalloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * cols;
        __m512i mx = _mm512_setzero_si512();
        for (int64_t c = 0; c < cols; c += 16)
            mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_loadu_si512(xi + c), _mm512_set1_epi32(0x7fffffff)));
        uint32_t top = (uint32_t)_mm512_reduce_max_epu32(mx);
        if (top >= 0x7f800000u) ok = 0;   /* inf or NaN: the whole call takes the AVX-512 path */
        int e = top ? (int)(top >> 23) - 127 : 0;
        int E = DF_MAX(-100, DF_MIN(100, X_TOP - e));
        uint32_t u = (uint32_t)(127 + E) << 23, down = (uint32_t)(127 - E) << 23;
        if (part == 0) memcpy(&hdr[HDR + i], &down, 4);
        memcpy(&upf[i], &u, 4);
    }
    if (part == 0) hdr[0] = ok ? 1.0f : 0.0f;
    if (sh.parts == 1) {   /* column 3i+p of the block's tile; row k of the tile is pair k */
        memset(tiles + b0 * 256, 0, (b1 - b0) * 256 * sizeof(uint32_t));
        const __m512i rows16 = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
        for (int i = 0; i < n; i++)
            for (int64_t b = b0; b < b1; b++) {
                __m512i pt[3];
                split_block(x + (int64_t)i * cols, b, _mm512_set1_ps(upf[i]), order, pt);
                for (int p = 0; p < 3; p++) _mm512_i32scatter_epi32(tiles + b * 256 + 3 * i + p, rows16, pt[p], 4);
            }
    } else {   /* column i % 16 of set i / 16: a 16 × 16 transpose per set, block and part */
        for (int s = 0; s < sh.sets; s++)
            for (int64_t b = b0; b < b1; b++) {
                __m512i r[3][16];
                for (int j = 0; j < 16; j++) {
                    int i = s * 16 + j;
                    __m512i pt[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
                    if (i < n) split_block(x + (int64_t)i * cols, b, _mm512_set1_ps(upf[i]), order, pt);
                    r[0][j] = pt[0], r[1][j] = pt[1], r[2][j] = pt[2];
                }
                for (int p = 0; p < 3; p++) {
                    transpose16(r[p]);
                    uint32_t *t = tiles + ((s * nb + b) * 3 + p) * 256;
                    for (int k = 0; k < 16; k++) _mm512_storeu_si512(t + 16 * k, r[p][k]);
                }
            }
    }
    free(upf);
}

/* bf16 of the 16 E2M1 values (sign in bit 3), twice: vpermw reads 5 index bits, of which bit 4 is junk here */
static const uint16_t e2m1_bf16[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,
};

/* 4L for the dwords of 128-bit lane L (a dword shift moves both of its words' nibbles alike, and only bits 0-4
 * of each word are read: vpsrlvd is one uop where vpsrlvw is two) */
static const uint32_t lane_shifts[16] = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};

/* Blocks [0, cb) of one row (d: its packed bytes, sc: its E8M0 scales, lut: scale_lut) as bf16 into dst.
 * The 16 bytes are broadcast to the four 128-bit lanes and lane L shifted right by 4L bits, so that the low
 * four bits of word w of lane L are the nibble of column 4w + L; vpermw looks them up in the block's table:
 * the E2M1 bf16 values with (s-127) << 7 added to the nonzero ones, which multiplies them by 2^(s-127) and,
 * for S_MIN <= s <= S_MAX, keeps them normal bf16. */
AI void dequant_blocks(const int cb, const uint8_t *d, const uint8_t *sc, const int32_t *lut, __m512i base,
                       __m512i shifts, uint16_t *dst) {
#pragma GCC unroll 4
    for (int b = 0; b < cb; b++) {
        __m512i raw = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(d + 16 * b)));
        __m512i idx = _mm512_srlv_epi32(raw, shifts);
        __m512i tbl = _mm512_mask_add_epi16(base, (__mmask32)0xfefefefeu, base, _mm512_set1_epi32(lut[sc[b]]));
        _mm512_store_si512(dst + 32 * b, _mm512_permutexvar_epi16(idx, tbl));
    }
}

/* The table add of each E8M0 scale byte s: (s-127) << 7 in both halves of a dword (a broadcast from memory then
 * costs no shuffle). */
static void scale_lut(int32_t lut[256]) {
    for (int s = 0; s < 256; s++) lut[s] = (int32_t)((((uint32_t)(s - 127) << 7) & 0xffffu) * 0x10001u);
}

/* Whether every scale of a row lies in [S_MIN, S_MAX]. */
static int row_scales_ok(const uint8_t *s, int64_t nb) {
    __mmask64 bad = 0;
    for (int64_t c = 0; c < nb; c += 64) {
        __mmask64 m = nb - c >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (nb - c)) - 1);
        __m512i v = _mm512_maskz_loadu_epi8(m, s + c);
        bad |= _mm512_mask_cmplt_epu8_mask(m, v, _mm512_set1_epi8(S_MIN)) |
               _mm512_mask_cmpgt_epu8_mask(m, v, _mm512_set1_epi8((char)S_MAX));
    }
    return !bad;
}

/* The prefetches that keep memory busy (the dequantisation, which reads the weights, and the TDPs take turns
 * on the core, so loads issued only while dequantising leave memory idle half the time). During one chunk's
 * TDPs, the group's next chunk (one line per row) into L1. The next super-group's weights into L2 in address
 * order, one line per row and chunk in all, which spreads them evenly over the current super-group (it has
 * as many row-chunks as lines): half between the TDPs, half between the rows' dequantisation. A software
 * prefetch holds a fill buffer until its line arrives, so they are spread out (all between the TDPs: 4%
 * slower; in bursts of 8: 10% slower). */
typedef struct {
    const uint8_t *next_sg;      /* the next super-group's first weight byte */
    int64_t at, end;             /* bytes of it prefetched, and its size */
    const uint8_t *next_chunk;   /* the group's next chunk in row 0, or NULL after the last chunk */
    int64_t row_bytes;
    int row, rows;               /* rows of the next chunk prefetched, of rows */
} amx_prefetch;

AI void prefetch_some(amx_prefetch *pf) {
    if (pf->next_chunk)
        for (int i = 0; i < 4 && pf->row < pf->rows; i++, pf->row++)
            _mm_prefetch((const char *)pf->next_chunk + pf->row * pf->row_bytes, _MM_HINT_T0);
    for (int i = 0; i < 2 && pf->at < pf->end; i++, pf->at += 64)
        _mm_prefetch((const char *)pf->next_sg + pf->at, _MM_HINT_T1);
}

/* One group's rows [0, nr) (row 0 at d, its scales at sc, nb per row), blocks [b0, b0+cb), into abuf; every
 * other row also issues one of pf's next super-group prefetches. */
static void dequant_group(const uint8_t *d, const uint8_t *sc, const int32_t *lut, int nr, int64_t row_bytes,
                          int64_t nb, int64_t b0, int cb, __m512i base, __m512i shifts, uint16_t *abuf,
                          amx_prefetch *pf) {
    for (int m = 0; m < nr; m++) {
        if ((m & 1) && pf->at < pf->end) {
            _mm_prefetch((const char *)pf->next_sg + pf->at, _MM_HINT_T1);
            pf->at += 64;
        }
        const uint8_t *dm = d + m * row_bytes + b0 * 16;
        const uint8_t *o = sc + m * nb + b0;
        if (cb == CHUNK) dequant_blocks(CHUNK, dm, o, lut, base, shifts, abuf + m * CHUNK * 32);
        else dequant_blocks(cb, dm, o, lut, base, shifts, abuf + m * CHUNK * 32);
    }
}

#define TDP_ROWTILE(T, P)                                                                          \
    do {                                                                                           \
        _tile_loadd(7, a + (T) * 16 * CHUNK * 32, CHUNK * 64);                                     \
        _tile_dpbf16ps(T, 7, 4);                                                                   \
        if ((P) == 3) {                                                                            \
            _tile_dpbf16ps(T, 7, 5);                                                               \
            _tile_dpbf16ps(T, 7, 6);                                                               \
        }                                                                                          \
    } while (0)

/* parts * 256 bytes from p into L1 */
AI void prefetch_b(const int parts, const char *p) {
    for (int i = 0; i < parts * 256; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
}

/* C (tiles 0-3, four row tiles) += A (abuf, blocks [0, cb)) · B (bt: the set's tiles of those blocks), with
 * prefetches between the row tiles. */
AI void chunk_tdp(const int parts, const uint32_t *bt, const uint16_t *abuf, int cb, amx_prefetch *pf) {
    for (int b = 0; b < cb; b++) {
        const uint32_t *bb = bt + b * parts * 256;
        _tile_loadd(4, bb, 64);
        if (parts == 3) {
            _tile_loadd(5, bb + 256, 64);
            _tile_loadd(6, bb + 512, 64);
        }
        const uint16_t *a = abuf + 32 * b;
        const char *bn = (const char *)(bb + parts * 256);   /* the next block's B tiles, a quarter at a time */
        prefetch_some(pf);
        prefetch_b(parts, bn);
        TDP_ROWTILE(0, parts);
        prefetch_some(pf);
        prefetch_b(parts, bn + parts * 256);
        TDP_ROWTILE(1, parts);
        prefetch_some(pf);
        prefetch_b(parts, bn + parts * 512);
        TDP_ROWTILE(2, parts);
        prefetch_some(pf);
        prefetch_b(parts, bn + parts * 768);
        TDP_ROWTILE(3, parts);
    }
}

/* Writes one group's results from its C tiles (cg: [set][row tile][16 rows][16 columns]), transposed 16 x 16
 * at a time so that y is written in runs of 16 output rows. */
static void amx_store(const float *cg, amx_shape sh, int n, int nr, const float *unscale, float *y, int64_t ldy) {
    for (int rt = 0; rt * 16 < nr; rt++)
        for (int s = 0; s < sh.sets; s++) {
            __m512i c[16];
            for (int k = 0; k < 16; k++) c[k] = _mm512_load_si512(cg + s * 1024 + rt * 256 + 16 * k);
            transpose16(c);   /* c[q]: column q of the C tile, one value per weight row */
            __mmask16 mk = (__mmask16)((1u << DF_MIN(16, nr - rt * 16)) - 1);
            for (int j = 0; j < 16 && s * 16 + j < n; j++) {
                int i = s * 16 + j;
                __m512 v = _mm512_castsi512_ps(c[j]);
                if (sh.parts == 1)   /* row j's three parts are columns 3j .. 3j+2 (n <= 5) */
                    v = _mm512_add_ps(_mm512_add_ps(_mm512_castsi512_ps(c[3 * j]), _mm512_castsi512_ps(c[3 * j + 1])),
                                      _mm512_castsi512_ps(c[3 * j + 2]));
                _mm512_mask_storeu_ps(y + i * ldy + rt * 16, mk, _mm512_mul_ps(v, _mm512_set1_ps(unscale[i])));
            }
        }
}

/* Rows are taken a super-group (SG groups of RG) at a time and the columns a chunk at a time: every group of
 * the super-group runs the chunk (dequantise, then TDPs against the chunk's B tiles), its C tiles kept in
 * memory between chunks. TDPs and vector work do not overlap on this hardware (measured), so nothing is
 * gained by interleaving them. */
static void matmul_rows_amx(const df_tensor *t, int64_t r0, int64_t r1, const float *xp, int n, float *y,
                            int64_t ldy) {
    const df_kernels *fb = kern_avx512();
    if (t->dtype != DF_DT_MXFP4 || n < AMX_MIN_N || xp[amx_hdr_at(t, n)] == 0.0f) {
        fb->matmul_rows(t, r0, r1, xp, n, y, ldy);
        return;
    }
    int64_t cols = t->shape[1], nb = cols / 32, row_bytes = cols / 2;
    amx_shape sh = amx_shape_of(n);
    const float *unscale = xp + amx_hdr_at(t, n) + HDR;
    const uint32_t *tiles = (const uint32_t *)(xp + amx_tiles_at(t, n));
    const uint8_t *data = t->data, *scale = t->scale;
    const __m512i base = _mm512_loadu_si512(e2m1_bf16), shifts = _mm512_loadu_si512(lane_shifts);
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int k = 0; k < 8; k++) cfg.rows[k] = 16, cfg.colsb[k] = 64;   /* 0-3 C, 4-6 B, 7 A */
    _tile_loadconfig(&cfg);
    const int64_t cg_floats = (int64_t)sh.sets * 1024;   /* one group's C tiles */
    float *cacc = xaligned_alloc(64, (size_t)SG * cg_floats * sizeof(float));
    int32_t lut[256];
    scale_lut(lut);
    uint16_t *abuf = xaligned_alloc(64, RG * CHUNK * 32 * sizeof(uint16_t));   /* zero: rows past nr */
    for (int64_t rs = r0; rs < r1; rs += SG * RG) {
        int nrs = (int)DF_MIN(SG * RG, r1 - rs), ng = (nrs + RG - 1) / RG;
        amx_prefetch pf = {data + (rs + SG * RG) * row_bytes, 0,
                           DF_MAX(0, DF_MIN(SG * RG, r1 - rs - SG * RG)) * row_bytes, NULL, row_bytes, 0, 0};
        uint64_t ok_rows[SG] = {0};
        for (int m = 0; m < nrs; m++) {
            if (row_scales_ok(scale + (rs + m) * nb, nb)) ok_rows[m / RG] |= 1ull << (m % RG);
        }
        const int keep_c = ng == 1 && sh.sets == 1;
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            int cb = (int)DF_MIN(CHUNK, nb - b0);
            for (int g = 0; g < ng; g++) {
                int64_t rg = rs + g * RG;
                int nr = (int)DF_MIN(RG, r1 - rg);
                dequant_group(data + rg * row_bytes, scale + rg * nb, lut, nr, row_bytes, nb, b0, cb, base, shifts,
                              abuf, &pf);
                pf.next_chunk = b0 + CHUNK < nb ? data + rg * row_bytes + (b0 + CHUNK) * 16 : NULL;
                pf.row = 0, pf.rows = nr;
                for (int s = 0; s < sh.sets; s++) {
                    float *cs = cacc + g * cg_floats + s * 1024;
                    if (b0 == 0) {   /* (with one group and one set, C stays in the tiles between chunks) */
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                    } else if (!keep_c) {
                        _tile_loadd(0, cs, 64);
                        _tile_loadd(1, cs + 256, 64);
                        _tile_loadd(2, cs + 512, 64);
                        _tile_loadd(3, cs + 768, 64);
                    }
                    const uint32_t *bt = tiles + (s * nb + b0) * sh.parts * 256;
                    if (sh.parts == 3) chunk_tdp(3, bt, abuf, cb, &pf);
                    else chunk_tdp(1, bt, abuf, cb, &pf);
                    if (!keep_c || b0 + CHUNK >= nb) {
                        _tile_stored(0, cs, 64);
                        _tile_stored(1, cs + 256, 64);
                        _tile_stored(2, cs + 512, 64);
                        _tile_stored(3, cs + 768, 64);
                    }
                }
            }
        }
        for (int g = 0; g < ng; g++) {
            int64_t rg = rs + g * RG;
            int nr = (int)DF_MIN(RG, r1 - rg);
            amx_store(cacc + g * cg_floats, sh, n, nr, unscale, y + rg, ldy);
            for (int m = 0; m < nr; m++)
                if (!(ok_rows[g] >> m & 1)) fb->matmul_rows(t, rg + m, rg + m + 1, xp, n, y, ldy);
        }
    }
    _tile_release();
    free(cacc);
    free(abuf);
}

static uint64_t read_bytes_amx(const void *p, size_t n) { return kern_avx512()->read_bytes(p, n); }

/* One task per thread where the call runs on AMX: each task's first group starts with its weights not yet
 * prefetched (measured: 4% faster than 4 tasks per thread for the 16-row expert matrices). */
static int amx_tasks_per_thread(const df_tensor *w, int n) { return w->dtype == DF_DT_MXFP4 && n >= AMX_MIN_N ? 1 : 4; }

static const df_kernels amx = {"amx",           1u << DF_DT_MXFP4, amx_pack_floats,      amx_pack,
                               amx_tasks_per_thread, matmul_rows_amx,   read_bytes_amx};

const df_kernels *kern_amx(void) { return kern_avx512() ? &amx : NULL; }

#else
int kern_amx_usable(void) { return 0; }
const df_kernels *kern_amx(void) { return NULL; }
#endif
