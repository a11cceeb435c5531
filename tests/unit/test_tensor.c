/* test_tensor.c — dtype conversions and the MXFP4 worked example of the format. */
#include <math.h>
#include "test.h"
#include "common/tensor.h"

int main(void) {
    /* scale 0x7E, bytes 0x2F 0x90 0x77 → -3.0 0.5 0.0 -0.25 3.0 3.0 */
    uint8_t packed[16] = {0x2F, 0x90, 0x77};
    uint8_t scale[1] = {0x7E};
    df_tensor t = {.name = "w", .dtype = DF_DT_MXFP4, .ndim = 2, .shape = {1, 32}, .data = packed, .scale = scale};
    float row[32];
    tensor_row_f32(&t, 0, row);
    const float want[6] = {-3.0f, 0.5f, 0.0f, -0.25f, 3.0f, 3.0f};
    int okv = 1;
    for (int i = 0; i < 6; i++) okv &= row[i] == want[i];
    CHECK(okv, "mxfp4 worked example decodes");
    CHECK(df_bf16_to_f32(df_f32_to_bf16(1.0f)) == 1.0f, "bf16 round trip of 1.0");
    CHECK(df_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 round to nearest even (tie down)");
    CHECK(df_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 round to nearest even (tie up)");
    int f16ok = 1;
    for (float v = -70000.0f; v < 70000.0f; v += 13.37f) {
        float r = df_f16_to_f32(df_f32_to_f16(v));
        if (fabsf(v) < 65504.0f && fabsf(r - v) > fabsf(v) * 0.001f + 1e-3f) f16ok = 0;
    }
    CHECK(f16ok, "f16 round trip within half precision");
    CHECK(df_f16_to_f32(df_f32_to_f16(5.9604645e-08f)) == 5.9604645e-08f, "f16 smallest subnormal");
    TEST_EXIT();
}
