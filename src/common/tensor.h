/* tensor.h — a view of one weight tensor as the storage layer hands it to model and kernels.
 *
 * A view never owns its bytes: storage keeps them alive (mmap, cache slot, spine buffer) until the layer or
 * expert that returned the view is released. Matrices are [out, in] row-major (PyTorch layout). MXFP4 views
 * carry the logical shape [out, in]; data points at the packed nibbles [out, in/2] (low nibble = even
 * column) and scale at the E8M0 bytes [out, in/32]. I8 views carry one fp16 scale per row in scale. */
#ifndef DF_TENSOR_H
#define DF_TENSOR_H

#include <stdint.h>
#include <string.h>

typedef enum {
    DF_DT_F32 = 0,
    DF_DT_F16,
    DF_DT_BF16,
    DF_DT_MXFP4,  /* compressed-tensors mxfp4-pack-quantized: weight_packed + weight_scale */
    DF_DT_I8,     /* per-row absmax int8 with fp16 row scales (int8 spine) */
    DF_DT_U8,
    DF_DT_I32,
    DF_DT_I64,
    DF_DT_COUNT
} df_dtype;

typedef struct df_tensor {
    const char *name;      /* full checkpoint name, for error messages */
    df_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    const void *scale;     /* MXFP4: uint8 E8M0 [out, in/32]; I8: fp16 [out]; else NULL */
} df_tensor;

const char *tensor_dtype_name(df_dtype dt);
int64_t tensor_numel(const df_tensor *t);
/* Bytes of data (not counting scale). */
uint64_t tensor_data_bytes(const df_tensor *t);
/* Bytes of one row of a matrix's data. */
uint64_t tensor_row_bytes(const df_tensor *t);
/* Rows [r0, r0+n) of a matrix as a view of the same bytes. */
df_tensor tensor_rows(const df_tensor *t, int64_t r0, int64_t n);
/* Converts row r of a matrix (or element range of a vector when ndim == 1, r = 0) to fp32. */
void tensor_row_f32(const df_tensor *t, int64_t r, float *out);
/* Converts a whole (small) tensor to fp32; out holds tensor_numel floats. */
void tensor_to_f32(const df_tensor *t, float *out);

static inline float df_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
float df_f16_to_f32(uint16_t h);
uint16_t df_f32_to_f16(float f);
uint16_t df_f32_to_bf16(float f);   /* round to nearest even */
/* E2M1 code → value, and E8M0 scale byte → 2^(s-127). */
extern const float df_e2m1_values[16];
float df_e8m0_to_f32(uint8_t s);

#endif
