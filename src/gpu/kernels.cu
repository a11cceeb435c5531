/* kernels.cu — the CUDA kernels of the GPU backend, compiled at run time by NVRTC for the device's own
 * architecture (kcache.c) from this source, embedded in the binary as a string (scripts/embed-cu.sh).
 *
 * Exact by default, like the CPU kernels: fp32 activations, weights dequantised exactly (BF16, F16, I8 with its
 * fp16 row scale applied after the sum, MXFP4 with its power-of-two block scale applied to the block's sum, which
 * rounds the same as scaling each product), fp32 sums; only the order of summation differs from the CPU. Norms
 * sum squares in double as the CPU does. Kernels take plain pointers and sizes; a weight matrix comes as a
 * wmat (data, scale, rows, cols, dtype) with the dtype codes of common/tensor.h. */

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define DF_INF __int_as_float(0x7f800000)

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_MXFP4 3
#define DT_I8 4

/* A weight matrix [rows, cols] in device memory; 8-byte fields only, so that the host struct matches. */
struct wmat {
    u64 data, scale;
    i64 rows, cols, dt;
    i64 vec;          /* rows and their bases are 16-byte aligned and cols fills whole vectors */
};

__device__ __forceinline__ float bf16f(u32 h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float f16f(u32 h) {
    float f;
    unsigned short s = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
}
__device__ __forceinline__ float e8m0f(u32 s) { return __uint_as_float(s ? s << 23 : 0x00400000u); }
/* E2M1 code -> value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
__device__ __forceinline__ float e2m1f(u32 n) {
    u32 m = n & 7;
    float mag = m < 2 ? 0.5f * (float)m : __uint_as_float(((m >> 1) + 126u) << 23) * (1.0f + 0.5f * (float)(m & 1));
    return (n & 8) ? -mag : mag;
}

/* One element of a matrix, dequantised (without an I8 row's scale, which the caller applies). */
__device__ __forceinline__ float wel(const wmat &w, i64 r, i64 c) {
    const u8 *d = (const u8 *)w.data;
    switch ((int)w.dt) {
    case DT_F32: return ((const float *)d)[r * w.cols + c];
    case DT_F16: return f16f(((const u16 *)d)[r * w.cols + c]);
    case DT_BF16: return bf16f(((const u16 *)d)[r * w.cols + c]);
    case DT_MXFP4: {
        u32 b = d[(r * w.cols + c) >> 1];
        float s = e8m0f(((const u8 *)w.scale)[(r * w.cols + c) >> 5]);
        return e2m1f((c & 1) ? b >> 4 : b & 15) * s;
    }
    default: return (float)((const signed char *)d)[r * w.cols + c];
    }
}

__device__ __forceinline__ float row_scale(const wmat &w, i64 r) {
    return w.dt == DT_I8 ? f16f(((const u16 *)w.scale)[r]) : 1.0f;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[j] += row r of w . x[j] for j < nt, the lanes of one warp splitting the columns (partial sums per lane). */
template <int NT>
__device__ __forceinline__ void warp_row_dot(const wmat &w, i64 r, const float *x, i64 ldx, int nt, int xvec,
                                             float *acc) {
    int lane = threadIdx.x & 31;
    i64 C = w.cols;
    if (w.vec && xvec) {
        switch ((int)w.dt) {
        case DT_F32: {
            const float4 *wr = (const float4 *)((const float *)w.data + r * C);
            for (i64 q = lane; q < C / 4; q += 32) {
                float4 a = __ldg(wr + q);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < nt) {
                        float4 b = *(const float4 *)(x + j * ldx + q * 4);
                        acc[j] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                    }
            }
            return;
        }
        case DT_BF16:
        case DT_F16: {
            const uint4 *wr = (const uint4 *)((const u16 *)w.data + r * C);
            int bf = w.dt == DT_BF16;
#pragma unroll 4
            for (i64 q = lane; q < C / 8; q += 32) {
                uint4 a = __ldg(wr + q);
                float f[8];
                u32 u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    f[2 * i] = bf ? bf16f(u[i] & 0xffffu) : f16f(u[i] & 0xffffu);
                    f[2 * i + 1] = bf ? bf16f(u[i] >> 16) : f16f(u[i] >> 16);
                }
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < nt) {
                        const float4 *xb = (const float4 *)(x + j * ldx + q * 8);
                        float4 b0 = xb[0], b1 = xb[1];
                        acc[j] += f[0] * b0.x + f[1] * b0.y + f[2] * b0.z + f[3] * b0.w + f[4] * b1.x + f[5] * b1.y +
                                  f[6] * b1.z + f[7] * b1.w;
                    }
            }
            return;
        }
        case DT_I8: {
            const uint4 *wr = (const uint4 *)((const signed char *)w.data + r * C);
            for (i64 q = lane; q < C / 16; q += 32) {
                uint4 a = __ldg(wr + q);
                u32 u[4] = {a.x, a.y, a.z, a.w};
                float f[16];
#pragma unroll
                for (int i = 0; i < 16; i++) f[i] = (float)(signed char)((u[i >> 2] >> (8 * (i & 3))) & 0xff);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < nt) {
                        const float4 *xb = (const float4 *)(x + j * ldx + q * 16);
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float4 b = xb[i];
                            s += f[4 * i] * b.x + f[4 * i + 1] * b.y + f[4 * i + 2] * b.z + f[4 * i + 3] * b.w;
                        }
                        acc[j] += s;
                    }
            }
            return;
        }
        case DT_MXFP4: {
            /* A lane takes 4 bytes (8 columns) at a time, so that the warp's loads of x are 32 consecutive 32-byte
             * pieces: 16-byte pieces per lane spread x over 32 cache lines per load and made L1 the bottleneck. The
             * magnitudes are twice the E2M1 values as small integers; the 0.5 goes into the block scale (exact). */
            const u32 *wr = (const u32 *)((const u8 *)w.data + r * (C / 2));
            const u8 *sr = (const u8 *)w.scale + r * (C / 32);
#pragma unroll 4
            for (i64 q = lane; q < C / 8; q += 32) {
                u32 a = __ldg(wr + q);
                float sc = 0.5f * e8m0f(__ldg(sr + (q >> 2)));
                float f[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    u32 n = (a >> (4 * i)) & 15;
                    float mag = (float)((u32)(0x0C08060403020100ull >> (8 * (n & 7))) & 0xffu);
                    f[i] = __uint_as_float(__float_as_uint(mag) | ((n & 8) << 28));
                }
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < nt) {
                        const float4 *xb = (const float4 *)(x + j * ldx + q * 8);
                        float4 b0 = xb[0], b1 = xb[1];
                        float s = f[0] * b0.x + f[1] * b0.y + f[2] * b0.z + f[3] * b0.w + f[4] * b1.x + f[5] * b1.y +
                                  f[6] * b1.z + f[7] * b1.w;
                        acc[j] += s * sc;
                    }
            }
            return;
        }
        }
    }
    for (i64 c = lane; c < C; c += 32) {
        float a = wel(w, r, c);
#pragma unroll
        for (int j = 0; j < NT; j++)
            if (j < nt) acc[j] += a * x[j * ldx + c];
    }
}

#define MM_WARPS 8
#define MM_NT 8

/* y[i * ldy + r] = sum_c x[i * ldx + c] W[r, c] for i < n: a warp per row, NT rows of x per block row. */
template <int NT>
__device__ __forceinline__ void matmul_body(const wmat &w, const float *x, i64 ldx, int n, float *y, i64 ldy, int xvec) {
    i64 r = (i64)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    int i0 = blockIdx.y * NT;
    if (r >= w.rows) return;
    int nt = min(NT, n - i0);
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j] = 0.0f;
    warp_row_dot<NT>(w, r, x + (i64)i0 * ldx, ldx, nt, xvec, acc);
    float sc = row_scale(w, r);
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float s = warp_sum(acc[j]);
        if (lane == j && j < nt) y[(i64)(i0 + j) * ldy + r] = s * sc;
    }
}

extern "C" __global__ void __launch_bounds__(256) k_matmul(wmat w, const float *x, i64 ldx, int n, float *y,
                                                           i64 ldy, int xvec) {
    matmul_body<MM_NT>(w, x, ldx, n, y, ldy, xvec);
}

/* The one-row case (decode): fewer registers, so more warps in flight per multiprocessor; the same sums. */
extern "C" __global__ void __launch_bounds__(256, 4) k_matmul1(wmat w, const float *x, i64 ldx, int n, float *y,
                                                               i64 ldy, int xvec) {
    matmul_body<1>(w, x, ldx, n, y, ldy, xvec);
}

/* ---- small elementwise pieces --------------------------------------------------------------------------- */

extern "C" __global__ void k_add(float *y, const float *x, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) y[i] += x[i];
}

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

extern "C" __global__ void k_sigmoid(float *y, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) y[i] = sigm(y[i]);
}

/* y *= sigmoid(g) */
extern "C" __global__ void k_mul_sigmoid(float *y, const float *g, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] *= sigm(g[i]);
}

/* g = act(g) * up(u): SiLU, or SiTU (situ != 0) with beta and beta_lin (<= 0: u raw). */
__device__ __forceinline__ float glu_act(float a, float u, int situ, float beta, float beta_lin) {
    if (!situ) return a / (1.0f + expf(-a)) * u;
    float up = beta_lin > 0 ? beta_lin * tanhf(u / beta_lin) : u;
    return beta * tanhf(a / beta) * sigm(a) * up;
}

extern "C" __global__ void k_glu(float *g, const float *u, i64 n, int situ, float beta, float beta_lin) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        g[i] = glu_act(g[i], u[i], situ, beta, beta_lin);
}

/* dst[r * ldd + c] = src[r * lds + c] for c < width */
extern "C" __global__ void k_copy2d(float *dst, i64 ldd, const float *src, i64 lds, int width, int rows) {
    int r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width && r < rows; c += gridDim.x * blockDim.x)
        dst[(i64)r * ldd + c] = src[(i64)r * lds + c];
}

/* h[t] = row tokens[t] of the embedding table, dequantised. */
extern "C" __global__ void k_embed(float *h, const int *tokens, wmat w) {
    int t = blockIdx.x;
    i64 r = tokens[t];
    float sc = row_scale(w, r);
    for (i64 c = threadIdx.x; c < w.cols; c += blockDim.x) h[t * w.cols + c] = wel(w, r, c) * sc;
}

__device__ double block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) s += sh[i];
        sh[32] = s;
    }
    __syncthreads();
    double s = sh[32];
    __syncthreads();
    return s;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w may be NULL), rows of width d with strides ldi / ldo;
 * squares summed in double as on the CPU. A block per row. */
extern "C" __global__ void k_rmsnorm(float *out, i64 ldo, const float *x, i64 ldi, const float *w, int d, float eps) {
    __shared__ double sh[33];
    const float *xr = x + (i64)blockIdx.x * ldi;
    float *o = out + (i64)blockIdx.x * ldo;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss, sh);
    float inv = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

/* Gated RMSNorm of KDA's output per head: o = rmsnorm(o) * w * sigmoid(gate), rows of width D. */
extern "C" __global__ void k_gated_norm(float *o, const float *gate, const float *w, int D, float eps) {
    __shared__ double sh[33];
    float *orow = o + (i64)blockIdx.x * D;
    const float *g = gate + (i64)blockIdx.x * D;
    double ss = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += (double)orow[i] * orow[i];
    ss = block_sum_d(ss, sh);
    float inv = 1.0f / sqrtf((float)(ss / D) + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) orow[i] = orow[i] * inv * w[i] * sigm(g[i]);
}

/* ---- KDA ----------------------------------------------------------------------------------------------- */

/* Causal depthwise conv + SiLU of one [T, P] projection (column block `part` of 3) with history hist
 * [W-1, 3P]; conv weight w [P, W], w[c, W-1] multiplying the current token. */
extern "C" __global__ void k_kda_conv(float *y, const float *x, const float *hist, const float *w, int T, i64 P,
                                      int W, int part) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * P) return;
    int t = (int)(i / P);
    i64 c = i % P;
    float acc = 0.0f;
    for (int j = 0; j < W; j++) {
        int src = t - (W - 1) + j;
        float v = src >= 0 ? x[(i64)src * P + c] : hist[(i64)(W - 1 + src) * 3 * P + part * P + c];
        acc += w[c * W + j] * v;
    }
    y[i] = acc / (1.0f + expf(-acc));
}

/* The next history [W-1, 3P] after T more rows of [q|k|v] pre-conv inputs, into out (not hist itself). */
extern "C" __global__ void k_kda_conv_hist(float *out, const float *hist, const float *x0, const float *x1,
                                           const float *x2, int T, i64 P, int W) {
    int keep = W - 1;
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)keep * 3 * P) return;
    int r = (int)(i / (3 * P));
    i64 pc = i % (3 * P);
    int part = (int)(pc / P);
    i64 c = pc % P;
    int src = T - keep + r;
    const float *x = part == 0 ? x0 : part == 1 ? x1 : x2;
    out[i] = src >= 0 ? x[(i64)src * P + c] : hist[(i64)(r + T) * 3 * P + pc];
}

/* g += dt_bias, then the log decay: lower_bound * sigmoid(A g) (K3's bounded form) or -A softplus(g). */
extern "C" __global__ void k_kda_gate(float *g, const float *dt_bias, const float *alog, int T, int H, int D,
                                      int per_channel, int bounded, float lower_bound) {
    i64 P = (i64)H * D;
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * P) return;
    int h = (int)((i % P) / D), j = (int)(i % D);
    float x = g[i] + dt_bias[i % P];
    float A = expf(per_channel ? alog[j] : alog[h]);
    g[i] = bounded ? lower_bound * sigm(A * x) : -A * (x > 20.0f ? x : log1pf(expf(x)));
}

/* x[row] *= scale / sqrt(sum x^2 + 1e-6) for rows of width D: a warp per row, the sum in float. */
extern "C" __global__ void k_l2norm(float *x, i64 rows, int D, float scale) {
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float *v = x + row * D;
    float ss = 0.0f;
    for (int j = lane; j < D; j += 32) ss += v[j] * v[j];
    ss = warp_sum(ss);
    float inv = scale / sqrtf(ss + 1e-6f);
    for (int j = lane; j < D; j += 32) v[j] *= inv;
}

/* The gated delta rule for one head (block h) over T tokens, in fp32: S[j][c] (key j, value c) in shared
 * memory, thread c owning column c. Writes o[t] (stride P) unless o is NULL (a rollback replay). */
extern "C" __global__ void k_kda_recur(float *S, const float *q, const float *k, const float *v, const float *g,
                                       const float *beta, int T, int H, int D, float *o) {
    extern __shared__ float sm[];
    float *Ss = sm, *ks = sm + D * D, *qs = ks + D, *es = qs + D;
    int h = blockIdx.x, c = threadIdx.x;
    i64 P = (i64)H * D;
    float *Sh = S + (i64)h * D * D;
    for (int j = 0; j < D; j++) Ss[j * D + c] = Sh[j * D + c];
    for (int t = 0; t < T; t++) {
        i64 off = (i64)t * P + (i64)h * D;
        __syncthreads();
        ks[c] = k[off + c];
        es[c] = expf(g[off + c]);
        if (o) qs[c] = q[off + c];
        __syncthreads();
        float m = 0.0f;
        for (int j = 0; j < D; j++) {
            float s = Ss[j * D + c] * es[j];
            Ss[j * D + c] = s;
            m += s * ks[j];
        }
        float u = beta[(i64)t * H + h] * (v[off + c] - m);
        float acc = 0.0f;
        for (int j = 0; j < D; j++) {
            float s = Ss[j * D + c] + ks[j] * u;
            Ss[j * D + c] = s;
            acc += s * qs[j];
        }
        if (o) o[off + c] = acc;
    }
    __syncthreads();
    for (int j = 0; j < D; j++) Sh[j * D + c] = Ss[j * D + c];
}

/* ---- MLA (absorbed) -------------------------------------------------------------------------------------- */

/* qlat[t, h, l] = sum_n q[t, h, n] W_UK_h[n, l]: W_UK_h is rows h*(Nn+Nv) .. +Nn of kv_b [H*(Nn+Nv), Lc]. */
extern "C" __global__ void k_mla_qlat(float *qlat, const float *q, wmat kvb, int H, int Nn, int Nv, int Nr, int Lc) {
    int h = blockIdx.y, t = blockIdx.z;
    int l = blockIdx.x * blockDim.x + threadIdx.x;
    if (l >= Lc) return;
    const float *qt = q + ((i64)t * H + h) * (Nn + Nr);
    i64 r0 = (i64)h * (Nn + Nv);
    float acc = 0.0f;
#pragma unroll 8
    for (int n = 0; n < Nn; n++) acc += qt[n] * (wel(kvb, r0 + n, l) * row_scale(kvb, r0 + n));
    qlat[((i64)t * H + h) * Lc + l] = acc;
}

#define ATT_WARPS 8
#define ATT_LPT 8     /* latent entries per thread: Lc <= 256 * ATT_LPT */

/* lat[t, h] = sum_s softmax_s((qlat . c_s + q_rope . r_s) * scale) c_s over positions s <= pos0 + t (a block per
 * (head, row)): each warp scores one position at a time, the softmax runs online over chunks of ATT_WARPS. */
extern "C" __global__ void __launch_bounds__(256) k_mla_attn(float *lat, const float *qlat, const float *q,
                                                             const float *cc, const float *cr, const i64 *posp,
                                                             i64 delta, int H, int Lc, int Nr, int Nn, float scale) {
    i64 pos0 = *posp + delta;   /* in device memory, so that a captured decode graph serves every position */
    __shared__ float qs[256 * ATT_LPT + 512];
    __shared__ float sc[ATT_WARPS];
    int h = blockIdx.x, t = blockIdx.y;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float *ql = qlat + ((i64)t * H + h) * Lc, *qr = q + ((i64)t * H + h) * (Nn + Nr) + Nn;
    for (int i = threadIdx.x; i < Lc; i += blockDim.x) qs[i] = ql[i];
    for (int i = threadIdx.x; i < Nr; i += blockDim.x) qs[Lc + i] = qr[i];
    __syncthreads();
    i64 n = pos0 + t + 1;
    float M = -DF_INF, Z = 0.0f, acc[ATT_LPT];
#pragma unroll
    for (int i = 0; i < ATT_LPT; i++) acc[i] = 0.0f;
    for (i64 s0 = 0; s0 < n; s0 += ATT_WARPS) {
        i64 s = s0 + wid;
        float d = 0.0f;
        if (s < n) {
            const float *cs = cc + s * Lc, *rs = cr + s * Nr;
            for (int i = lane; i < Lc; i += 32) d += qs[i] * cs[i];
            for (int i = lane; i < Nr; i += 32) d += qs[Lc + i] * rs[i];
        }
        d = warp_sum(d);
        if (lane == 0) sc[wid] = s < n ? d * scale : -DF_INF;
        __syncthreads();
        float cm = sc[0];
        for (int i = 1; i < ATT_WARPS; i++) cm = fmaxf(cm, sc[i]);
        float nm = fmaxf(M, cm), corr = expf(M - nm);
        float p[ATT_WARPS];
        float ps = 0.0f;
        for (int i = 0; i < ATT_WARPS; i++) {
            p[i] = s0 + i < n ? expf(sc[i] - nm) : 0.0f;
            ps += p[i];
        }
        Z = Z * corr + ps;
#pragma unroll
        for (int k = 0; k < ATT_LPT; k++) {
            int l = threadIdx.x + k * 256;
            if (l < Lc) {
                float a = acc[k] * corr;
                for (int i = 0; i < ATT_WARPS; i++)
                    if (s0 + i < n) a += p[i] * cc[(s0 + i) * Lc + l];
                acc[k] = a;
            }
        }
        M = nm;
        __syncthreads();
    }
    float *out = lat + ((i64)t * H + h) * Lc;
#pragma unroll
    for (int k = 0; k < ATT_LPT; k++) {
        int l = threadIdx.x + k * 256;
        if (l < Lc) out[l] = acc[k] / Z;
    }
}

/* The cache rows of T new positions from pos = *posp + delta on: c[pos + t] = RMSNorm(kv[t, :Lc]) * w (eps 1e-6, squares
 * summed in double), r[pos + t] = kv[t, Lc:Lc+Nr]. A block per row. */
extern "C" __global__ void k_mla_append(float *c, float *r, const float *kv, const float *w, const i64 *posp,
                                        i64 delta, int Lc, int Nr, float eps) {
    __shared__ double sh[33];
    int t = blockIdx.x;
    i64 pos = *posp + delta + t;
    const float *x = kv + (i64)t * (Lc + Nr);
    double ss = 0.0;
    for (int i = threadIdx.x; i < Lc; i += blockDim.x) ss += (double)x[i] * x[i];
    ss = block_sum_d(ss, sh);
    float inv = 1.0f / sqrtf((float)(ss / Lc) + eps);
    for (int i = threadIdx.x; i < Lc; i += blockDim.x) c[pos * Lc + i] = x[i] * inv * w[i];
    for (int i = threadIdx.x; i < Nr; i += blockDim.x) r[pos * Nr + i] = x[Lc + i];
}

/* o[t, h*Nv + v] = sum_l W_UV_h[v, l] lat[t, h, l]; W_UV_h is rows h*(Nn+Nv)+Nn .. +Nv of kv_b. A warp per v. */
extern "C" __global__ void k_mla_uv(float *o, const float *lat, wmat kvb, int H, int Nn, int Nv, int Lc) {
    int v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), h = blockIdx.y, t = blockIdx.z;
    int lane = threadIdx.x & 31;
    if (v >= Nv) return;
    i64 r = (i64)h * (Nn + Nv) + Nn + v;
    const float *lt = lat + ((i64)t * H + h) * Lc;
    float acc = 0.0f;
    for (int l = lane; l < Lc; l += 32) acc += wel(kvb, r, l) * lt[l];
    acc = warp_sum(acc) * row_scale(kvb, r);
    if (lane == 0) o[((i64)t * H + h) * Nv + v] = acc;
}

/* ---- MoE ----------------------------------------------------------------------------------------------- */

struct best {
    float v;
    int i;
};

/* The better of two candidates: a present one, the larger value, on a tie the lower index. */
__device__ __forceinline__ best best_of(best a, best b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

__device__ best block_best(best b, best *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) {
        best x;
        x.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        x.i = __shfl_xor_sync(0xffffffffu, b.i, o);
        b = best_of(b, x);
    }
    if (lane == 0) sh[wid] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        best r = sh[0];
        for (int i = 1; i < (int)(blockDim.x >> 5); i++) r = best_of(r, sh[i]);
        sh[32] = r;
    }
    __syncthreads();
    best r = sh[32];
    __syncthreads();
    return r;
}

#define ROUTE_MAX_E 4096
#define ROUTE_MAX_K 64

/* Routing of one token (a block per token): sigmoid scores, correction bias for selection only, group-limited
 * top-k (group score: the sum of its two best), weights renormalised and scaled; ids written ascending with their
 * weights, so that outputs are added in ascending expert order as on the CPU. */
extern "C" __global__ void __launch_bounds__(256) k_route(int *ids, float *wts, const float *logits,
                                                          const float *bias, int E, int G, int topk_group, int k,
                                                          int renorm, float scale) {
    __shared__ float sg[ROUTE_MAX_E], ch[ROUTE_MAX_E];
    __shared__ best sh[33];
    __shared__ int sel[ROUTE_MAX_K], gkeep[1024];
    __shared__ float gs[1024];
    int t = blockIdx.x;
    const float *lg = logits + (i64)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float s = sigm(lg[e]);
        sg[e] = s;
        ch[e] = s + bias[e];
    }
    __syncthreads();
    if (G > 1 && topk_group < G) {
        int per = E / G;
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            float a = -DF_INF, b = -DF_INF;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (ch[e] > a) {
                    b = a;
                    a = ch[e];
                } else if (ch[e] > b) {
                    b = ch[e];
                }
            }
            gs[g] = a + b;
            gkeep[g] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int kept = 0; kept < topk_group; kept++) {
                int bi = -1;
                for (int g = 0; g < G; g++)
                    if (!gkeep[g] && (bi < 0 || gs[g] > gs[bi])) bi = g;
                gkeep[bi] = 1;
            }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (!gkeep[e / per]) ch[e] = -DF_INF;
        __syncthreads();
    }
    for (int j = 0; j < k; j++) {
        best b;
        b.v = 0.0f;
        b.i = -1;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= sel[q] == e;
            if (taken) continue;
            best x;
            x.v = ch[e];
            x.i = e;
            b = best_of(b, x);
        }
        b = block_best(b, sh);
        if (threadIdx.x == 0) sel[j] = b.i;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float w[ROUTE_MAX_K], sum = 0.0f;
        for (int j = 0; j < k; j++) {
            w[j] = sg[sel[j]];
            sum += w[j];
        }
        for (int j = 0; j < k; j++) {
            if (renorm) w[j] /= sum + 1e-20f;
            w[j] *= scale;
        }
        for (int a = 1; a < k; a++)      /* ascending expert id */
            for (int b = a; b > 0 && sel[b] < sel[b - 1]; b--) {
                int ti = sel[b];
                sel[b] = sel[b - 1];
                sel[b - 1] = ti;
                float tw = w[b];
                w[b] = w[b - 1];
                w[b - 1] = tw;
            }
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = sel[j];
            wts[t * k + j] = w[j];
        }
    }
}

/* One layer's routed experts in device memory: expert e's gate (w1), up (w3) and down (w2) lie at
 * base + e * stride + the offsets, all experts of one shape and dtype. */
struct experts {
    u64 base, stride;
    u64 w1, w1s, w3, w3s, w2, w2s;
    i64 inter, dim, dt, vec;
};

__device__ __forceinline__ wmat expert_mat(const experts &x, int e, int which) {
    wmat w;
    u64 b = x.base + (u64)e * x.stride;
    w.data = b + (which == 0 ? x.w1 : which == 1 ? x.w3 : x.w2);
    w.scale = b + (which == 0 ? x.w1s : which == 1 ? x.w3s : x.w2s);
    w.rows = which == 2 ? x.dim : x.inter;
    w.cols = which == 2 ? x.inter : x.dim;
    w.dt = x.dt;
    w.vec = x.vec;
    return w;
}

/* act[(t*k + j), i] = act(gate_e[i] . z[t]) * (up_e[i] . z[t]) for e = ids[t*k + j]: a warp per row i, all of a
 * pass's (token, expert) pairs in one launch (blockIdx.y), the expert read from device memory. */
extern "C" __global__ void __launch_bounds__(256, 4) k_moe_gate_up(float *act, const float *z, const int *ids,
                                                                experts x, int k, int xvec, int situ, float beta,
                                                                float beta_lin) {
    int pair = blockIdx.y, t = pair / k;
    i64 i = (i64)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (i >= x.inter) return;
    int e = ids[pair];
    wmat g = expert_mat(x, e, 0), u = expert_mat(x, e, 1);
    float ag[1] = {0.0f}, au[1] = {0.0f};
    const float *zt = z + (i64)t * x.dim;
    warp_row_dot<1>(g, i, zt, x.dim, 1, xvec, ag);
    warp_row_dot<1>(u, i, zt, x.dim, 1, xvec, au);
    float sg = warp_sum(ag[0]) * row_scale(g, i), su = warp_sum(au[0]) * row_scale(u, i);
    if ((threadIdx.x & 31) == 0) act[(i64)pair * x.inter + i] = glu_act(sg, su, situ, beta, beta_lin);
}

/* part[(t*k + j), r] = wts[t*k + j] * (down_e[r] . act[t*k + j]) */
extern "C" __global__ void __launch_bounds__(256, 4) k_moe_down(float *part, const float *act, const int *ids,
                                                             const float *wts, experts x, int avec) {
    int pair = blockIdx.y;
    i64 r = (i64)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= x.dim) return;
    wmat d = expert_mat(x, ids[pair], 2);
    float a[1] = {0.0f};
    warp_row_dot<1>(d, r, act + (i64)pair * x.inter, x.inter, 1, avec, a);
    float s = warp_sum(a[0]) * row_scale(d, r);
    if ((threadIdx.x & 31) == 0) part[(i64)pair * x.dim + r] = s * wts[pair];
}

/* y[t, r] = sum_j part[t*k + j, r], the k slots in order (ascending expert id). */
extern "C" __global__ void k_moe_sum(float *y, const float *part, int T, int k, i64 dim) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * dim) return;
    i64 t = i / dim, r = i % dim;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += part[(t * k + j) * dim + r];
    y[i] = s;
}

/* ---- block attention residuals --------------------------------------------------------------------------- */

#define RES_MAX 128
struct res_ptrs {
    u64 p[RES_MAX];
};

/* out[t] = sum_j a_j v_j[t], a = softmax_j((v_j . (w_norm * w_proj)) / sqrt(mean(v_j^2) + eps)), sums in double
 * as on the CPU. A block per row. */
extern "C" __global__ void k_attn_res(float *out, res_ptrs v, int n, const float *wn, const float *wp, int d,
                                      float eps) {
    __shared__ double sh[33];
    __shared__ float a[RES_MAX];
    i64 t = blockIdx.x;
    for (int j = 0; j < n; j++) {
        const float *x = (const float *)v.p[j] + t * d;
        double ss = 0.0, sc = 0.0;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            ss += (double)x[i] * x[i];
            sc += (double)x[i] * wn[i] * wp[i];
        }
        ss = block_sum_d(ss, sh);
        sc = block_sum_d(sc, sh);
        if (threadIdx.x == 0) a[j] = (float)(sc / sqrt(ss / d + eps));
    }
    if (threadIdx.x == 0) {
        float m = -DF_INF, s = 0.0f;
        for (int j = 0; j < n; j++) m = a[j] > m ? a[j] : m;
        for (int j = 0; j < n; j++) {
            a[j] = expf(a[j] - m);
            s += a[j];
        }
        for (int j = 0; j < n; j++) a[j] /= s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += a[j] * ((const float *)v.p[j])[t * d + i];
        out[t * d + i] = acc;
    }
}

/* ---- measuring ------------------------------------------------------------------------------------------ */

/* Reads n float4s once (16-byte loads, grid-stride), leaving a per-block sum so that the reads stay: the memory
 * read rate yardstick of `deltafin bench` on a GPU. */
extern "C" __global__ void k_read(const float4 *p, i64 n, float *out) {
    float s = 0.0f;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float4 v = __ldg(p + i);
        s += v.x + v.y + v.z + v.w;
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) atomicAdd(out + blockIdx.x, s);
}
