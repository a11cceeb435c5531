/* kernels_avx512.c — AVX-512 (F/BW/VL/DQ) matmul for every weight dtype, exact fp32 products.
 *
 * Built with AVX-512 flags (Makefile) and only entered after kern_available checked the CPU. A register tile
 * of up to 4 weight rows × 4 activation rows is accumulated over all columns: each weight block is loaded and
 * dequantised once for the 4 activation rows. MXFP4 uses a 16-entry fp32 table (the E2M1 values times the
 * block's 2^(s-127)) indexed by vpermps, which reads only the low 4 bits of each index, so the low nibbles
 * need no masking and the high ones one shift; the activations are packed (kern_pack_x) to match. I8 sums
 * w·x per row and applies the row's fp16 scale once at the end. */
#include "kernels.h"
#include "kern_tiles.h"
#include "../common/util.h"

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

/* out[j*4 + i] = row j of w · x[i], for j < nw, i < na. nw, na, dt are constants after inlining. */
AI void tile(const int dt, const int nw, const int na, const kern_wrow *w, const float *const *x, int64_t cols,
             const uint8_t *pf, float *out) {
    /* pf: the next tile's weights (contiguous after this tile's rows) or NULL, prefetched a little per block so
     * the stream keeps flowing while this tile computes; pf_step is their size per 32-column block */
    const int64_t pf_step = nw * (dt == DF_DT_F32 ? 128 : dt == DF_DT_MXFP4 ? 16 : dt == DF_DT_I8 ? 32 : 64);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) acc[j][i] = _mm512_setzero_ps();
    const __m512 tbl = _mm512_loadu_ps(df_e2m1_values);
    int64_t c = 0;
    /* Columns in spans of 16 blocks, whose MXFP4 scales are expanded to fp32 once per span. */
    for (int64_t span = 0; span + 32 <= cols; span += 512) {
        int nb = (int)((cols - span) / 32 < 16 ? (cols - span) / 32 : 16);
        float sc[4][16];
        if (dt == DF_DT_MXFP4)
#pragma GCC unroll 4
            for (int j = 0; j < nw; j++) e8m0_16(w[j].s + span / 32, nb, sc[j]);
        for (int b = 0; b < nb; b++, c += 32) {
            __m512 wv[4][2];
            if (pf)
                for (int64_t o = 0; o < pf_step; o += 64) _mm_prefetch((const char *)pf + (c / 32) * pf_step + o, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int j = 0; j < nw; j++) load32(dt, &w[j], c, tbl, dt == DF_DT_MXFP4 ? sc[j][b] : 0.0f, &wv[j][0], &wv[j][1]);
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
    }
    for (; dt != DF_DT_MXFP4 && c < cols; c += 16) {
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

static uint64_t read_bytes_avx512(const void *p, size_t n) {
    const char *q = p;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 256) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(q + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(q + i + 64));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(q + i + 128));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(q + i + 192));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

/* kern_pack_x_mxfp4's layout (even columns of a block, then odd ones), two permutes per block. */
static void pack_avx512(const df_tensor *w, const float *x, int n, float *xp, int part, int parts) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    int64_t cols = w->shape[1], b0, b1;
    kern_pack_blocks(cols / 32, part, parts, &b0, &b1);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r * cols + b0 * 32; i < r * cols + b1 * 32; i += 32) {
            __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
            _mm512_storeu_ps(xp + i, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(xp + i + 16, _mm512_permutex2var_ps(a, odd, b));
        }
}

static const df_kernels avx512 = {"avx512", 1u << DF_DT_MXFP4, NULL, pack_avx512, NULL, matmul_rows_avx512,
                                  read_bytes_avx512};

const df_kernels *kern_avx512(void) { return &avx512; }

#else
const df_kernels *kern_avx512(void) { return NULL; }
#endif
