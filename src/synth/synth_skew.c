/* synth_skew.c — skewed routing for `deltafin synth --route-skew S`. The router of a synthetic checkpoint
 * sees hidden states that are nearly independent random vectors, so its logits are close to independent
 * normals; the correction bias (used for selection only, as in the real models) is tuned against a sample of
 * such logits until each expert's selection frequency matches a Zipf target. The update is the one DeepSeek-V3
 * uses to balance load, pointed at an unbalanced target instead. */
#include "synth_skew.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define SKEW_SAMPLES 1024
#define SKEW_ROUNDS 120

static uint64_t skew_rng(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double skew_unit(uint64_t *s) { return ((double)(skew_rng(s) >> 11) + 0.5) / 9007199254740992.0; }

void synth_zipf_targets(int experts, int topk, double skew, uint64_t seed, double *target) {
    int *rank = xmalloc(sizeof *rank * (size_t)experts);
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int e = 0; e < experts; e++) rank[e] = e;
    for (int e = experts - 1; e > 0; e--) {
        int j = (int)(skew_rng(&r) % (uint64_t)(e + 1)), t = rank[e];
        rank[e] = rank[j], rank[j] = t;
    }
    /* water-filling: find c with sum min(1, c r^-s) = topk */
    double lo = 0, hi = (double)topk * pow((double)experts, skew) + 1;
    for (int it = 0; it < 200; it++) {
        double c = 0.5 * (lo + hi), sum = 0;
        for (int i = 0; i < experts; i++) sum += DF_MIN(1.0, c * pow(i + 1.0, -skew));
        if (sum < topk) lo = c;
        else hi = c;
    }
    for (int e = 0; e < experts; e++) target[e] = DF_MIN(1.0, lo * pow(rank[e] + 1.0, -skew));
    free(rank);
}

/* Value of the k-th largest of v[0..n) (1-based k); v is reordered. */
static float skew_kth(float *v, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = v[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j], v[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return v[want];
}

void synth_route_bias(int experts, int topk, const double *target, double sigma, uint64_t seed, float *bias) {
    float *s = xmalloc(sizeof *s * (size_t)experts * SKEW_SAMPLES), *row = xmalloc(sizeof *row * (size_t)experts);
    int *count = xmalloc(sizeof *count * (size_t)experts);
    uint64_t r = seed * 0xD1B54A32D192ED03ull + 11;
    for (size_t i = 0; i < (size_t)experts * SKEW_SAMPLES; i++) {   /* Box-Muller */
        double z = sqrt(-2 * log(skew_unit(&r))) * cos(2 * M_PI * skew_unit(&r));
        s[i] = (float)(1 / (1 + exp(-sigma * z)));
    }
    for (int e = 0; e < experts; e++) bias[e] = 0;
    for (int round = 0; round < SKEW_ROUNDS; round++) {
        memset(count, 0, sizeof *count * (size_t)experts);
        for (int t = 0; t < SKEW_SAMPLES; t++) {
            const float *st = s + (size_t)t * experts;
            for (int e = 0; e < experts; e++) row[e] = st[e] + bias[e];
            float kth = skew_kth(row, experts, topk);
            for (int e = 0; e < experts; e++) count[e] += st[e] + bias[e] >= kth;
        }
        double step = 0.25 * (1.0 - (double)round / SKEW_ROUNDS) + 0.01;
        for (int e = 0; e < experts; e++) {
            double got = (double)count[e] / SKEW_SAMPLES, want = target[e];
            bias[e] += (float)(step * (want - got) / sqrt(want * (1 - want) + 1e-3));
        }
    }
    free(s);
    free(row);
    free(count);
}
