/* tensor.c — dtype names, sizes, row views and scalar conversions of weight views to fp32. */
#include "tensor.h"

#include <math.h>
#include "util.h"

const float df_e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

const char *tensor_dtype_name(df_dtype dt) {
    static const char *const names[DF_DT_COUNT] = {"F32", "F16", "BF16", "MXFP4", "I8", "U8", "I32", "I64"};
    return (unsigned)dt < DF_DT_COUNT ? names[dt] : "?";
}

int64_t tensor_numel(const df_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static uint64_t dtype_bytes(df_dtype dt, uint64_t n) {
    switch (dt) {
    case DF_DT_F32: case DF_DT_I32: return n * 4;
    case DF_DT_F16: case DF_DT_BF16: return n * 2;
    case DF_DT_MXFP4: return n / 2;
    case DF_DT_I8: case DF_DT_U8: return n;
    case DF_DT_I64: return n * 8;
    default: return 0;
    }
}

uint64_t tensor_data_bytes(const df_tensor *t) {
    return dtype_bytes(t->dtype, (uint64_t)tensor_numel(t));
}

uint64_t tensor_row_bytes(const df_tensor *t) {
    DF_ASSERT(t->ndim == 2);
    return dtype_bytes(t->dtype, (uint64_t)t->shape[1]);
}

df_tensor tensor_rows(const df_tensor *t, int64_t r0, int64_t n) {
    DF_ASSERT(t->ndim == 2 && r0 >= 0 && r0 + n <= t->shape[0]);
    df_tensor v = *t;
    int64_t cols = t->shape[1];
    v.shape[0] = n;
    const uint8_t *d = t->data, *s = t->scale;
    switch (t->dtype) {
    case DF_DT_F32: v.data = d + r0 * cols * 4; break;
    case DF_DT_F16: case DF_DT_BF16: v.data = d + r0 * cols * 2; break;
    case DF_DT_MXFP4: v.data = d + r0 * cols / 2; v.scale = s + r0 * cols / 32; break;
    case DF_DT_I8: v.data = d + r0 * cols; v.scale = s + r0 * 2; break;
    default: df_die("tensor_rows: unsupported dtype %s", tensor_dtype_name(t->dtype));
    }
    return v;
}

float df_e8m0_to_f32(uint8_t s) {
    return ldexpf(1.0f, (int)s - 127);
}

float df_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            float f = ldexpf((float)man, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t df_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
    if (a < 6.103515625e-05f) {                     /* subnormal: multiples of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t au = u & 0x7fffffff;
    uint32_t mant = au & 0x7fffff, exp = (au >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

uint16_t df_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void tensor_row_f32(const df_tensor *t, int64_t r, float *out) {
    int64_t cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    if (t->ndim == 1) DF_ASSERT(r == 0);
    const uint8_t *d = t->data;
    switch (t->dtype) {
    case DF_DT_F32:
        memcpy(out, d + r * cols * 4, cols * 4);
        break;
    case DF_DT_BF16: {
        const uint16_t *p = (const uint16_t *)(d + r * cols * 2);
        for (int64_t c = 0; c < cols; c++) out[c] = df_bf16_to_f32(p[c]);
        break;
    }
    case DF_DT_F16: {
        const uint16_t *p = (const uint16_t *)(d + r * cols * 2);
        for (int64_t c = 0; c < cols; c++) out[c] = df_f16_to_f32(p[c]);
        break;
    }
    case DF_DT_MXFP4: {
        const uint8_t *p = d + r * cols / 2, *s = (const uint8_t *)t->scale + r * cols / 32;
        for (int64_t c = 0; c < cols; c += 2) {
            float f = df_e8m0_to_f32(s[c / 32]);
            out[c] = df_e2m1_values[p[c / 2] & 15] * f;
            out[c + 1] = df_e2m1_values[p[c / 2] >> 4] * f;
        }
        break;
    }
    case DF_DT_I8: {
        const int8_t *p = (const int8_t *)(d + r * cols);
        float f = df_f16_to_f32(((const uint16_t *)t->scale)[r]);
        for (int64_t c = 0; c < cols; c++) out[c] = p[c] * f;
        break;
    }
    default:
        df_die("tensor_row_f32: unsupported dtype %s for %s", tensor_dtype_name(t->dtype),
               t->name ? t->name : "?");
    }
}

void tensor_to_f32(const df_tensor *t, float *out) {
    if (t->ndim <= 1) {
        df_tensor v = *t;
        v.ndim = 1;
        if (t->ndim == 0) v.shape[0] = 1;
        tensor_row_f32(&v, 0, out);
        return;
    }
    df_tensor v = *t;   /* fold leading dims into rows */
    int64_t cols = t->shape[t->ndim - 1], rows = tensor_numel(t) / cols;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    for (int64_t r = 0; r < rows; r++) tensor_row_f32(&v, r, out + r * cols);
}
