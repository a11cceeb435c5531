/* kernels_neon.c — aarch64 NEON matmul for every weight dtype, exact fp32 products.
 *
 * Register tile of 2 weight rows × 4 activation rows, 16 columns per step. MXFP4: the packed activations
 * (kern_pack_x) hold a block's 16 even columns then its 16 odd ones, so a step takes the low or the high
 * nibbles of the block's 16 bytes and looks them up with tbl in a table of the E2M1 values times 2 (integers
 * -12..12), widened to fp32 and multiplied by 2^(s-128) — the same exact products as the reference. */
#include "kernels.h"
#include "kern_tiles.h"
#include "common/util.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define AI static inline __attribute__((always_inline))

AI void widen_i8(int8x16_t v, float32x4_t sc, float32x4_t *o) {
    int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
    o[0] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), sc);
    o[1] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), sc);
    o[2] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), sc);
    o[3] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), sc);
}

AI float32x4_t bf16x4(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }

/* Weight columns [c, c+16) (c a multiple of 16) as four fp32 vectors, in activation (packed) order. */
AI void load16(const int dt, const kern_wrow *w, int64_t c, int8x16_t lut, float32x4_t *o) {
    switch (dt) {
    case DF_DT_F32: {
        const float *p = (const float *)(w->d + c * 4);
        for (int k = 0; k < 4; k++) o[k] = vld1q_f32(p + 4 * k);
        break;
    }
    case DF_DT_BF16: {
        const uint16_t *p = (const uint16_t *)(w->d + c * 2);
        for (int k = 0; k < 4; k++) o[k] = bf16x4(vld1_u16(p + 4 * k));
        break;
    }
    case DF_DT_F16: {
        const uint16_t *p = (const uint16_t *)(w->d + c * 2);
        for (int k = 0; k < 4; k++) o[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * k)));
        break;
    }
    case DF_DT_I8:
        widen_i8(vld1q_s8((const int8_t *)(w->d + c)), vdupq_n_f32(1.0f), o);
        break;
    default: {   /* MXFP4 */
        int64_t c0 = c & ~(int64_t)31;
        uint8x16_t b = vld1q_u8(w->d + c0 / 2);
        uint8x16_t nib = (c & 16) ? vshrq_n_u8(b, 4) : vandq_u8(b, vdupq_n_u8(15));
        uint32_t sb = kern_e8m0_bits(w->s[c0 / 32]);
        float sc;
        memcpy(&sc, &sb, 4);
        widen_i8(vqtbl1q_s8(lut, nib), vdupq_n_f32(sc * 0.5f), o);
        break;
    }
    }
}

AI void tile(const int dt, const int nw, const int na, const kern_wrow *w, const float *const *x, int64_t cols,
             const uint8_t *pf, float *out) {
    (void)pf;   /* no prefetching on this path */
    static const int8_t lut_vals[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const int8x16_t lut = vld1q_s8(lut_vals);
    float32x4_t acc[2][4];
    for (int j = 0; j < nw; j++)
        for (int i = 0; i < na; i++) acc[j][i] = vdupq_n_f32(0.0f);
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        float32x4_t wv[2][4];
        for (int j = 0; j < nw; j++) load16(dt, &w[j], c, lut, wv[j]);
        for (int i = 0; i < na; i++)
            for (int k = 0; k < 4; k++) {
                float32x4_t xv = vld1q_f32(x[i] + c + 4 * k);
                for (int j = 0; j < nw; j++) acc[j][i] = vfmaq_f32(acc[j][i], wv[j][k], xv);
            }
    }
    for (int j = 0; j < nw; j++)
        for (int i = 0; i < na; i++) {
            float s = vaddvq_f32(acc[j][i]);
            for (int64_t t = c; t < cols; t++) s += kern_weight_at(dt, &w[j], t) * x[i][t];
            out[j * 4 + i] = s;
        }
}

KERN_TILES_DEFINE(neon, 2, 0)

static uint64_t read_bytes_neon(const void *p, size_t n) {
    const uint64_t *q = p;
    uint64x2_t s0 = vdupq_n_u64(0), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n / 8; i += 8) {
        s0 = vaddq_u64(s0, vld1q_u64(q + i));
        s1 = vaddq_u64(s1, vld1q_u64(q + i + 2));
        s2 = vaddq_u64(s2, vld1q_u64(q + i + 4));
        s3 = vaddq_u64(s3, vld1q_u64(q + i + 6));
    }
    return vaddvq_u64(vaddq_u64(vaddq_u64(s0, s1), vaddq_u64(s2, s3)));
}

static const df_kernels neon = {"neon", 1u << DF_DT_MXFP4, NULL, NULL, NULL, matmul_rows_neon, read_bytes_neon};

const df_kernels *kern_neon(void) { return &neon; }

#else
const df_kernels *kern_neon(void) { return NULL; }
#endif
