/* kernels_avx2.c — AVX2+FMA+F16C matmul for every weight dtype, exact fp32 products.
 *
 * Built with -mavx2 -mfma -mf16c (Makefile) and only entered after kern_available checked the CPU. With 16 ymm
 * registers the register tile is 2 weight rows × 4 activation rows, stepping 16 columns at a time. MXFP4: in a
 * 32-column block the packed activations (kern_pack_x) hold the 16 even columns (low nibbles) then the 16 odd
 * ones (high nibbles), so a 16-column step reads one nibble of each of the 16 bytes. vpermps looks up only 8
 * entries (low 3 bits), so the E2M1 sign (bit 3) picks between a positive and a negative table with blendv. */
#include "kernels.h"
#include "kern_tiles.h"
#include "common/util.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI __m256 e2m1_lookup(__m256i idx, __m256 tpos, __m256 tneg) {
    __m256 m = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));   /* bit 3 → sign bit */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(tpos, idx), _mm256_permutevar8x32_ps(tneg, idx), m);
}

/* Weight columns [c, c+16) (c a multiple of 16) as two fp32 vectors, in activation (packed) order. */
AI void load16(const int dt, const kern_wrow *w, int64_t c, __m256 *w0, __m256 *w1) {
    switch (dt) {
    case DF_DT_F32:
        *w0 = _mm256_loadu_ps((const float *)(w->d + c * 4));
        *w1 = _mm256_loadu_ps((const float *)(w->d + c * 4 + 32));
        break;
    case DF_DT_BF16:
        *w0 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w->d + c * 2))), 16));
        *w1 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w->d + c * 2 + 16))), 16));
        break;
    case DF_DT_F16:
        *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->d + c * 2)));
        *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->d + c * 2 + 16)));
        break;
    case DF_DT_I8:
        *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w->d + c))));
        *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w->d + c + 8))));
        break;
    default: {   /* MXFP4 */
        int64_t c0 = c & ~(int64_t)31;
        const uint8_t *b = w->d + c0 / 2;
        uint32_t sb = kern_e8m0_bits(w->s[c0 / 32]);
        __m256 sc = _mm256_castsi256_ps(_mm256_set1_epi32((int)sb));
        __m256 tpos = _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), sc);
        __m256 tneg = _mm256_mul_ps(_mm256_setr_ps(-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f), sc);
        __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
        __m256i i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8)));
        if (c & 16) {
            i0 = _mm256_srli_epi32(i0, 4);
            i1 = _mm256_srli_epi32(i1, 4);
        }
        *w0 = e2m1_lookup(i0, tpos, tneg);
        *w1 = e2m1_lookup(i1, tpos, tneg);
        break;
    }
    }
}

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[j*4 + i] = row j of w · x[i], for j < nw, i < na. */
AI void tile(const int dt, const int nw, const int na, const kern_wrow *w, const float *const *x, int64_t cols,
             const uint8_t *pf, float *out) {
    (void)pf;   /* the next tile is not prefetched on this path */
    const int64_t ahead = kern_ahead_bytes(dt), wsize = dt == DF_DT_I8 ? 1 : 2, every = 64 / wsize;
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) acc[j][i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m256 wv[2][2];
        if (ahead && c % every == 0) kern_prefetch_ahead(w, nw, c * wsize + ahead, cols * wsize);
#pragma GCC unroll 2
        for (int j = 0; j < nw; j++) load16(dt, &w[j], c, &wv[j][0], &wv[j][1]);
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) {
            __m256 x0 = _mm256_loadu_ps(x[i] + c), x1 = _mm256_loadu_ps(x[i] + c + 8);
#pragma GCC unroll 2
            for (int j = 0; j < nw; j++) {
                acc[j][i] = _mm256_fmadd_ps(wv[j][0], x0, acc[j][i]);
                acc[j][i] = _mm256_fmadd_ps(wv[j][1], x1, acc[j][i]);
            }
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < nw; j++)
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) {
            float s = hsum(acc[j][i]);
            for (int64_t t = c; t < cols; t++) s += kern_weight_at(dt, &w[j], t) * x[i][t];
            out[j * 4 + i] = s;
        }
}

KERN_TILES_DEFINE(avx2, 2, 0)

/* Four interleaved streams with a prefetch 2 KiB ahead in each, like read_bytes_avx512 (see there). */
static uint64_t read_bytes_avx2(const void *p, size_t n) {
    const char *q = p;
    const size_t quarter = n / 4 / 64 * 64;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < quarter; i += 64)
        for (int k = 0; k < 4; k++) {
            const char *r = q + k * quarter + i;
            _mm_prefetch(r + 2048, _MM_HINT_T0);
            s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)r));
            s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(r + 32)));
        }
    for (size_t i = 4 * quarter; i < n; i += 64) {
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(q + i)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(q + i + 32)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, s);
    return v[0] + v[1] + v[2] + v[3];
}

static const df_kernels avx2 = {"avx2", 1u << DF_DT_MXFP4, NULL, NULL, NULL, matmul_rows_avx2, read_bytes_avx2};

const df_kernels *kern_avx2(void) { return &avx2; }

#else
const df_kernels *kern_avx2(void) { return NULL; }
#endif
