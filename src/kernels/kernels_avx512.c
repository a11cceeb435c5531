/* kernels_avx512.c — AVX-512 (F/BW/VL/DQ) matmul for every weight dtype, exact fp32 products.
 *
 * Built with AVX-512 flags (Makefile) and only entered after kern_available checked the CPU. A register tile
 * of up to 4 weight rows × 4 activation rows is accumulated over all columns: each weight block is loaded and
 * dequantised once for the 4 activation rows. MXFP4 uses a 16-entry fp32 table of the E2M1 values indexed by
 * vpermps, which reads only the low 4 bits of each index: 64 packed bytes (4 blocks) are loaded as 16 dwords
 * and shifted by 4k to give nibble k of each, 16 weights per shift + vpermps, with the activations packed
 * (pack_avx512) to match; the blocks' 2^(s-127) multiply either the weights or, for 1-2 activation rows,
 * each group's sums (see mxfp4_tile). I8 sums w·x per row and applies the row's fp16 scale once at the end. */
#include "kernels.h"
#include "kern_tiles.h"
#include "common/util.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__FMA__)
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* Weight columns [c, c+32) as two fp32 vectors, in the order of the (packed, for MXFP4) activations. */
AI void load32(const int dt, const kern_wrow *w, int64_t c, __m512 tbl, float sc, __m512 *w0, __m512 *w1) {
    switch (dt) {
    case DF_DT_F32:
        *w0 = _mm512_loadu_ps(w->d + c * 4);
        *w1 = _mm512_loadu_ps(w->d + c * 4 + 64);
        break;
    case DF_DT_BF16:
        *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w->d + c * 2))), 16));
        *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w->d + c * 2 + 32))), 16));
        break;
    case DF_DT_F16:
        *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + c * 2)));
        *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + c * 2 + 32)));
        break;
    case DF_DT_I8:
        *w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w->d + c))));
        *w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w->d + c + 16))));
        break;
    default: {   /* MXFP4: sc holds 2^(s-127) of this block */
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->d + c / 2)));
        __m512 t = _mm512_mul_ps(tbl, _mm512_set1_ps(sc));
        *w0 = _mm512_permutexvar_ps(idx, t);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), t);
        break;
    }
    }
}

/* 2^(s-127) for the (up to 16) E8M0 bytes of blocks [b, b+nb) of a row; s = 0 gives the subnormal 2^-127. */
AI void e8m0_16(const uint8_t *s, int nb, float *out) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << nb) - 1), s));
    v = _mm512_max_epu32(_mm512_slli_epi32(v, 23), _mm512_set1_epi32(0x00400000));
    _mm512_storeu_ps(out, _mm512_castsi512_ps(v));
}

/* Weight columns [c, c+16) masked to the m valid ones (not MXFP4, whose rows are whole blocks). */
AI __m512 load16m(const int dt, const kern_wrow *w, int64_t c, __mmask16 m) {
    switch (dt) {
    case DF_DT_F32: return _mm512_maskz_loadu_ps(m, w->d + c * 4);
    case DF_DT_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w->d + c * 2)), 16));
    case DF_DT_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w->d + c * 2));
    default: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w->d + c)));
    }
}

/* Every E8M0 scale of the row is at most 127 (2^(s-127) <= 1). */
AI int row_scales_le_one(const kern_wrow *w, int64_t nb) {
    __mmask64 any = 0;
    for (int64_t b = 0; b < nb; b += 64) {
        __mmask64 m = nb - b >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (nb - b)) - 1);
        any |= _mm512_test_epi8_mask(_mm512_maskz_loadu_epi8(m, w->s + b), _mm512_set1_epi8((char)0x80));
    }
    return any == 0;
}

/* acc[j][i] += the 32 weights of row j at column c (wv[j]) times x[i][c..c+32). */
AI void fma_block32(const int nw, const int na, __m512 wv[4][2], const float *const *x, int64_t c,
                    __m512 acc[4][4]) {
#pragma GCC unroll 4
    for (int i = 0; i < na; i++) {
        __m512 x0 = _mm512_loadu_ps(x[i] + c), x1 = _mm512_loadu_ps(x[i] + c + 16);
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++) {
            acc[j][i] = _mm512_fmadd_ps(wv[j][0], x0, acc[j][i]);
            acc[j][i] = _mm512_fmadd_ps(wv[j][1], x1, acc[j][i]);
        }
    }
}

/* One 128-column group (4 blocks, 64 packed bytes per row) of an MXFP4 tile. Dword l of the 64 bytes holds
 * nibbles k = 0..7 of columns 8l + k (the packed x matches: kern group layout), so a shift by 4k and one
 * vpermps give 16 weights with no zero-extension. Lane l's block is l/4; scv[j] holds its 2^(s-127).
 * unscaled (na <= 2 only): accumulate Σ e2m1·x per lane over the 8 nibbles and multiply by the scale once
 * per group; exact products either way, and the scaling by a power of two <= 1 is exact for normal sums
 * and at least as fine as fp32's own rounding for subnormal ones (the caller checks for overflow). */
AI void group_mxfp4(const int nw, const int na, const int unscaled, const kern_wrow *w, const float *const *x,
                    int64_t c, __m512 tbl, const float (*sc)[16], int b, const uint8_t *pf, __m512 (*acc)[4]) {
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 scv[4], t[4][2];
    __m512i v[4];
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++) {
        scv[j] = _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_loadu_ps(sc[j] + b)));
        v[j] = _mm512_loadu_si512(w[j].d + c / 2);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m512 wk[4];
        /* the next tile's nw lines for these 4 blocks, one every other step: issued together they stall */
        if (pf && k % 2 == 0 && k / 2 < nw) _mm_prefetch((const char *)pf + 64 * (k / 2), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++) {
            wk[j] = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(v[j], 4 * k) : v[j], tbl);
            if (!unscaled) wk[j] = _mm512_mul_ps(wk[j], scv[j]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) {
            __m512 xk = _mm512_loadu_ps(x[i] + c + 16 * k);
#pragma GCC unroll 4
            for (int j = 0; j < nw; j++) {
                if (!unscaled) acc[j][i] = _mm512_fmadd_ps(wk[j], xk, acc[j][i]);
                else t[j][i] = k ? _mm512_fmadd_ps(wk[j], xk, t[j][i]) : _mm512_mul_ps(wk[j], xk);
            }
        }
    }
    if (unscaled)
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++)
#pragma GCC unroll 2
            for (int i = 0; i < (na < 2 ? na : 2); i++) acc[j][i] = _mm512_fmadd_ps(t[j][i], scv[j], acc[j][i]);
}

/* One pass of the MXFP4 tile: columns in spans of 16 blocks (scales expanded to fp32 once per span),
 * 128-column groups, then the span's last blocks one by one in the per-block layout. allow_unscaled: group_mxfp4 may use its
 * unscaled sums (every row's scales must be <= 1). */
AI void mxfp4_pass(const int nw, const int na, const int allow_unscaled, const kern_wrow *w,
                   const float *const *x, int64_t cols, const uint8_t *pf, float *out) {
    const int64_t pf_step = nw * 16;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) acc[j][i] = _mm512_setzero_ps();
    const __m512 tbl = _mm512_loadu_ps(df_e2m1_values);
    int64_t c = 0;
    for (int64_t span = 0; span + 32 <= cols; span += 512) {
        int nb = (int)((cols - span) / 32 < 16 ? (cols - span) / 32 : 16), b = 0;
        float sc[4][16];
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++) e8m0_16(w[j].s + span / 32, nb, sc[j]);
        for (; b + 4 <= nb; b += 4, c += 128) {
            group_mxfp4(nw, na, allow_unscaled, w, x, c, tbl, (const float (*)[16])sc, b,
                        pf ? pf + (c / 32) * pf_step : NULL, acc);
        }
        for (; b < nb; b++, c += 32) {
            __m512 wv[4][2];
#pragma GCC unroll 4
            for (int j = 0; j < nw; j++) load32(DF_DT_MXFP4, &w[j], c, tbl, sc[j][b], &wv[j][0], &wv[j][1]);
            fma_block32(nw, na, wv, x, c, acc);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) out[j * 4 + i] = _mm512_reduce_add_ps(acc[j][i]);
}

/* The MXFP4 tile, unscaled (faster) for up to 2 activation rows where it is exact: each weight row whose
 * scales are all <= 1 (else scaled), and again scaled for a row whose unscaled result is not finite (an
 * unscaled group sum can overflow where the scaled products do not). A row's mode depends only on its own
 * data, so its result does not depend on how rows are grouped into tiles. */
AI void mxfp4_tile(const int nw, const int na, const kern_wrow *w, const float *const *x, int64_t cols,
                   const uint8_t *pf, float *out) {
    if (na > 2) {
        mxfp4_pass(nw, na, 0, w, x, cols, pf, out);
        return;
    }
    int ok = 0;
    for (int j = 0; j < nw; j++) ok += row_scales_le_one(&w[j], cols / 32);
    if (ok == 0) {
        mxfp4_pass(nw, na, 0, w, x, cols, pf, out);
        return;
    }
    if (ok == nw) mxfp4_pass(nw, na, 1, w, x, cols, pf, out);
    for (int j = 0; j < nw; j++) {
        int unscaled = row_scales_le_one(&w[j], cols / 32);
        float o1[16];
        if (ok != nw) {
            mxfp4_pass(1, na, unscaled, &w[j], x, cols, NULL, o1);
            for (int i = 0; i < na; i++) out[j * 4 + i] = o1[i];
        }
        int finite = 1;
        for (int i = 0; i < na; i++) finite &= out[j * 4 + i] - out[j * 4 + i] == 0.0f;
        if (unscaled && !finite) {
            mxfp4_pass(1, na, 0, &w[j], x, cols, NULL, o1);
            for (int i = 0; i < na; i++) out[j * 4 + i] = o1[i];
        }
    }
}

/* out[j*4 + i] = row j of w · x[i], for j < nw, i < na. nw, na, dt are constants after inlining. */
AI void tile(const int dt, const int nw, const int na, const kern_wrow *w, const float *const *x, int64_t cols,
             const uint8_t *pf, float *out) {
    if (dt == DF_DT_MXFP4) {
        mxfp4_tile(nw, na, w, x, cols, pf, out);
        return;
    }
    /* pf: the next tile's weights (contiguous after this tile's rows) or NULL, prefetched a little per block so
     * the stream keeps flowing while this tile computes; pf_step is their size per 32-column block */
    const int64_t pf_step = nw * (dt == DF_DT_F32 ? 128 : dt == DF_DT_I8 ? 32 : 64);
    const int64_t ahead = kern_ahead_bytes(dt), size = dt == DF_DT_I8 ? 1 : 2;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) acc[j][i] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m512 wv[4][2];
        if (ahead && (dt != DF_DT_I8 || (c & 32))) kern_prefetch_ahead(w, nw, c * size + ahead, cols * size);
        if (pf)
            for (int64_t o = 0; o < pf_step; o += 64) _mm_prefetch((const char *)pf + (c / 32) * pf_step + o, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++) load32(dt, &w[j], c, _mm512_setzero_ps(), 0.0f, &wv[j][0], &wv[j][1]);
        fma_block32(nw, na, wv, x, c, acc);
    }
    for (; c < cols; c += 16) {
        __mmask16 m = cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < nw; j++) wv[j] = load16m(dt, &w[j], c, m);
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) {
            __m512 x0 = _mm512_maskz_loadu_ps(m, x[i] + c);
#pragma GCC unroll 4
            for (int j = 0; j < nw; j++) acc[j][i] = _mm512_fmadd_ps(wv[j], x0, acc[j][i]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) out[j * 4 + i] = _mm512_reduce_add_ps(acc[j][i]);
}

/* prefetching the next tile helps MXFP4, whose dequantisation keeps the core busy; measured to hurt BF16 */
KERN_TILES_DEFINE(avx512, 4, 1u << DF_DT_MXFP4)

/* Four interleaved streams (quarters of the buffer) with the kernels' own prefetch 2 KiB ahead in each: the way
 * the matmul tiles read their rows, so the yardstick reads at least as fast as they do (one stream, with or
 * without the prefetch, read 4-8% slower than the BF16 kernel here). */
static uint64_t read_bytes_avx512(const void *p, size_t n) {
    const char *q = p;
    const size_t quarter = n / 4 / 64 * 64;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < quarter; i += 64) {
        for (int k = 0; k < 4; k++) _mm_prefetch(q + k * quarter + i + 2048, _MM_HINT_T0);
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(q + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(q + quarter + i));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(q + 2 * quarter + i));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(q + 3 * quarter + i));
    }
    for (size_t i = 4 * quarter; i < n; i += 64) s0 = _mm512_add_epi64(s0, _mm512_load_si512(q + i));
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

/* The layout the MXFP4 tile reads: each whole 128-column group transposed from 16 × 8 to 8 × 16 (packed
 * column 16k + l is column 8l + k, matching nibble k of dword l of the group's 64 weight bytes), and the
 * blocks after the last whole group in kern_pack_x_mxfp4's layout (even columns of a block, then odd ones).
 * Parts split the groups; part 0 also packs the trailing blocks. */
static void pack_avx512(const df_tensor *w, const float *x, int n, float *xp, int part, int parts) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i by8 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(8));
    int64_t cols = w->shape[1], ng = cols / 128, g0, g1;
    kern_pack_blocks(ng, part, parts, &g0, &g1);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = r * cols + g0 * 128; i < r * cols + g1 * 128; i += 128)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) _mm512_storeu_ps(xp + i + 16 * k, _mm512_i32gather_ps(by8, x + i + k, 4));
        for (int64_t i = r * cols + ng * 128; part == 0 && i < (r + 1) * cols; i += 32) {
            __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
            _mm512_storeu_ps(xp + i, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(xp + i + 16, _mm512_permutex2var_ps(a, odd, b));
        }
    }
}

static const df_kernels avx512 = {"avx512", 1u << DF_DT_MXFP4, NULL, pack_avx512, NULL, matmul_rows_avx512,
                                  read_bytes_avx512};

const df_kernels *kern_avx512(void) { return &avx512; }

#else
const df_kernels *kern_avx512(void) { return NULL; }
#endif
