/* sample.c — the sampler of sample.h. Filters run cheapest first (top-k selection, then min-p, then a sort
 * only when top-p needs one) because a K3 vocabulary has 163 840 entries. */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

#define SELECT_INSERT_MAX 64   /* k up to this uses insertion into a sorted window; larger k sorts */

void sample_params_default(sample_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sample_rng_seed(sample_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sample_rng_next(sample_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double sample_rng_uniform(sample_rng *r) { return (double)(sample_rng_next(r) >> 11) * 0x1.0p-53; }

void sampler_init(sampler *s, const sample_params *p, int n_vocab) {
    DF_ASSERT(n_vocab > 0);
    memset(s, 0, sizeof *s);
    s->p = *p;
    if (s->p.n_top_logprobs > SAMPLE_MAX_TOP_LOGPROBS) s->p.n_top_logprobs = SAMPLE_MAX_TOP_LOGPROBS;
    if (s->p.n_top_logprobs < 0) s->p.n_top_logprobs = 0;
    s->n_vocab = n_vocab;
    sample_rng_seed(&s->rng, p->seed);
    s->counts = xcalloc((size_t)n_vocab, sizeof *s->counts);
    s->idx = xmalloc((size_t)n_vocab * sizeof *s->idx);
    s->val = xmalloc((size_t)n_vocab * sizeof *s->val);
}

void sampler_free(sampler *s) {
    free(s->counts);
    free(s->idx);
    free(s->val);
    memset(s, 0, sizeof *s);
}

void sampler_accept(sampler *s, int32_t id) {
    if (id >= 0 && id < s->n_vocab && s->counts[id] < UINT32_MAX) s->counts[id]++;
}

/* a ranks before b: larger value, then smaller id (so equal logits give a deterministic order) */
static int ranks_before(float va, int32_t a, float vb, int32_t b) { return va > vb || (va == vb && a < b); }

/* Writes the k best ids of v[0..n) into out, best first; returns how many (min(k, n)). */
static int select_top(const float *v, int n, int k, int32_t *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && !ranks_before(v[i], i, v[out[m - 1]], out[m - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && ranks_before(v[i], i, v[out[j - 1]], out[j - 1])) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
    return m;
}

typedef struct cand {
    float p;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (ranks_before(x->p, x->id, y->p, y->id)) return -1;
    if (ranks_before(y->p, y->id, x->p, x->id)) return 1;
    return 0;
}

int sampler_check_logits(sampler *s, const float *logits) {
    int bad = 0, first = -1, allowed = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            if (first < 0) first = i;
            bad++;
        } else {
            allowed += logits[i] != -INFINITY;
        }
    }
    if (bad) {
        snprintf(s->error, sizeof s->error, "the model produced %d non-finite logits of %d (token %d: %s)", bad,
                 s->n_vocab, first, isnan(logits[first]) ? "NaN" : "+inf");
        return -1;
    }
    if (!allowed) {
        snprintf(s->error, sizeof s->error, "every one of the %d tokens is forbidden (-inf): nothing to sample",
                 s->n_vocab);
        return -1;
    }
    return 0;
}

const char *sampler_error(const sampler *s) { return s->error; }

static void sampler_penalise(sampler *s, float *logits) {
    int n = s->n_vocab;
    if (s->p.presence_penalty == 0 && s->p.frequency_penalty == 0) return;
    for (int i = 0; i < n; i++)
        if (s->counts[i]) logits[i] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->counts[i];
}

static void sampler_logprobs(sampler *s, const float *logits, int32_t id, sample_result *out) {
    int n = s->n_vocab;
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = logits[i] > m ? logits[i] : m;
    double sum = 0;
    if (m > -INFINITY)
        for (int i = 0; i < n; i++) sum += exp((double)logits[i] - m);
    float lse = m > -INFINITY ? (float)(m + log(sum)) : 0.0f;
    out->id = id;
    out->logprob = logits[id] - lse;
    int32_t top[SAMPLE_MAX_TOP_LOGPROBS];
    out->n_top = s->p.n_top_logprobs ? select_top(logits, n, s->p.n_top_logprobs, top) : 0;
    for (int i = 0; i < out->n_top; i++) out->top[i] = (sample_logprob){top[i], logits[top[i]] - lse};
}

static int32_t sampler_greedy(const float *logits, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[b]) b = i;
    return b;
}

/* Temperature, top-k, min-p, top-p, then one draw. */
static int32_t sampler_draw(sampler *s, const float *logits) {
    int n = s->n_vocab, nc;
    int32_t *idx = s->idx;
    int sorted = 0;
    if (s->p.top_k > 0 && s->p.top_k < n && s->p.top_k <= SELECT_INSERT_MAX) {
        nc = select_top(logits, n, s->p.top_k, idx);
        sorted = 1;
    } else {
        for (int i = 0; i < n; i++) idx[i] = i;
        nc = n;
    }
    float m = logits[sampler_greedy(logits, n)];
    if (m == -INFINITY) return 0;
    float inv_t = 1.0f / s->p.temperature;
    float *p = s->val;
    int k = 0;
    for (int i = 0; i < nc; i++) {   /* min-p relative to the best token, whose weight is exp(0) = 1 */
        float w = expf((logits[idx[i]] - m) * inv_t);
        if (w > 0 && w >= s->p.min_p) {
            idx[k] = idx[i];
            p[k++] = w;
        }
    }
    nc = k;
    int need_sort = !sorted && ((s->p.top_k > 0 && s->p.top_k < nc) || s->p.top_p < 1.0f);
    if (need_sort) {
        cand *cs = xmalloc((size_t)nc * sizeof *cs);
        for (int i = 0; i < nc; i++) cs[i] = (cand){p[i], idx[i]};
        qsort(cs, (size_t)nc, sizeof *cs, cand_cmp);
        for (int i = 0; i < nc; i++) {
            p[i] = cs[i].p;
            idx[i] = cs[i].id;
        }
        free(cs);
        if (s->p.top_k > 0 && s->p.top_k < nc) nc = s->p.top_k;
    }
    double total = 0;
    for (int i = 0; i < nc; i++) total += p[i];
    if (s->p.top_p < 1.0f) {
        double cum = 0, lim = s->p.top_p * total;
        for (int i = 0; i < nc; i++) {
            cum += p[i];
            if (cum >= lim) {
                nc = i + 1;
                total = cum;
                break;
            }
        }
    }
    double u = sample_rng_uniform(&s->rng) * total, acc = 0;
    for (int i = 0; i < nc; i++) {
        acc += p[i];
        if (u < acc) return idx[i];
    }
    return idx[nc - 1];
}

int32_t sampler_sample(sampler *s, float *logits, sample_result *out) {
    if (sampler_check_logits(s, logits)) return -1;
    sampler_penalise(s, logits);
    int32_t id = s->p.temperature <= 0 ? sampler_greedy(logits, s->n_vocab) : sampler_draw(s, logits);
    if (out) sampler_logprobs(s, logits, id, out);
    return id;
}
