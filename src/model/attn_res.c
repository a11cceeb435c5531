/* attn_res.c — Block Attention Residuals: a softmax over depth whose keys are the RMS-normed
 * candidate vectors, whose single query is w_norm ⊙ w_proj, and whose values are the raw candidates. It
 * never mixes tokens, so decode needs no extra cache. */
#include <math.h>
#include "layer.h"
#include "common/util.h"

void attn_res(const float *const *blocks, int nb, const float *p, const float *w_norm, const float *w_proj,
              int T, int d, float eps, float *out) {
    float a[CONFIG_MAX_ATTN_RES_BLOCKS];
    int n = nb + 1;
    DF_ASSERT(n <= CONFIG_MAX_ATTN_RES_BLOCKS);
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < n; j++) {
            const float *v = (j < nb ? blocks[j] : p) + (int64_t)t * d;
            double ss = 0.0, sc = 0.0;
            for (int i = 0; i < d; i++) {
                ss += (double)v[i] * v[i];
                sc += (double)v[i] * w_norm[i] * w_proj[i];
            }
            a[j] = (float)(sc / sqrt(ss / d + eps));
        }
        kern_softmax(a, n);
        float *o = out + (int64_t)t * d;
        for (int i = 0; i < d; i++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++) acc += a[j] * (j < nb ? blocks[j] : p)[(int64_t)t * d + i];
            o[i] = acc;
        }
    }
}
