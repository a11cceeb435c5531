/* kernels_scalar.c — the portable reference implementation every ISA path is tested against. */
#include <math.h>
#include <stdlib.h>
#include "kernels.h"
#include "common/util.h"

static void matmul_rows_scalar(const df_tensor *w, int64_t r0, int64_t r1, const float *x, int n, float *y,
                               int64_t ldy) {
    int64_t cols = w->shape[1];
    float *row = xmalloc(cols * sizeof(float));
    for (int64_t r = r0; r < r1; r++) {
        tensor_row_f32(w, r, row);
        for (int i = 0; i < n; i++) {
            const float *xi = x + (int64_t)i * cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < cols; c++) acc += xi[c] * row[c];
            y[i * ldy + r] = acc;
        }
    }
    free(row);
}

static uint64_t read_bytes_scalar(const void *p, size_t n) {
    const uint64_t *q = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a += q[i];
        b += q[i + 1];
        c += q[i + 2];
        d += q[i + 3];
    }
    return a + b + c + d;
}

static const df_kernels scalar = {"scalar", 0, NULL, NULL, NULL, matmul_rows_scalar, read_bytes_scalar};

const df_kernels *kern_scalar(void) { return &scalar; }

void kern_rmsnorm(float *out, const float *x, const float *w, int d, float eps) {
    double ss = 0.0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

float kern_dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

void kern_silu_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = kern_silu(g[i]) * u[i];
}

void kern_situ_mul(float *g, const float *u, int n, float beta, float beta_lin) {
    for (int i = 0; i < n; i++) {
        float a = g[i];
        float up = beta_lin > 0 ? beta_lin * tanhf(u[i] / beta_lin) : u[i];
        g[i] = beta * tanhf(a / beta) * kern_sigmoid(a) * up;
    }
}

void kern_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= s;
}
