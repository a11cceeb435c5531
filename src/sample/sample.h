/* sample.h — picking the next token from logits: presence/frequency penalties, temperature, top-k, top-p,
 * min-p, a seeded per-sampler RNG (xoshiro256**, no global state) and log-probabilities of the chosen token
 * and its best alternatives. Temperature 0 is greedy (ties go to the lowest id), so it is deterministic;
 * with the same seed and logits, sampling is reproducible. Logits that are NaN or +inf (a broken model or
 * kernel) are an error, never a token: -inf alone means "forbidden". */
#ifndef DF_SAMPLE_H
#define DF_SAMPLE_H

#include <stdint.h>

#define SAMPLE_MAX_TOP_LOGPROBS 20

typedef struct sample_params {
    float temperature;        /* 0 = greedy */
    float top_p;              /* 1 = off */
    int top_k;                /* 0 = off */
    float min_p;              /* 0 = off; drop tokens below min_p * p(best) */
    float presence_penalty;   /* subtracted once from every token already generated */
    float frequency_penalty;  /* subtracted per occurrence */
    uint64_t seed;
    int n_top_logprobs;       /* alternatives to report, 0..SAMPLE_MAX_TOP_LOGPROBS */
} sample_params;

void sample_params_default(sample_params *p);   /* temperature 1, everything else off, seed 0 */

typedef struct sample_rng {
    uint64_t s[4];
} sample_rng;

void sample_rng_seed(sample_rng *r, uint64_t seed);
uint64_t sample_rng_next(sample_rng *r);
double sample_rng_uniform(sample_rng *r);       /* [0, 1) with 53 random bits */

typedef struct sample_logprob {
    int32_t id;
    float logprob;
} sample_logprob;

/* Log-probabilities come from the penalised logits before temperature and truncation: the model's own
 * distribution, so they do not change with the sampling knobs. */
typedef struct sample_result {
    int32_t id;
    float logprob;
    int n_top;
    sample_logprob top[SAMPLE_MAX_TOP_LOGPROBS];   /* best first */
} sample_result;

typedef struct sampler {
    sample_params p;
    sample_rng rng;
    int n_vocab;
    uint32_t *counts;   /* occurrences of each id in the generated text, for the penalties */
    int32_t *idx;       /* scratch: candidate ids */
    float *val;         /* scratch: candidate logits / probabilities */
    char error[160];    /* why the last sampler_sample returned -1 */
} sampler;

void sampler_init(sampler *s, const sample_params *p, int n_vocab);
void sampler_free(sampler *s);
/* Records a generated token (penalties). */
void sampler_accept(sampler *s, int32_t id);
/* Picks a token from logits[n_vocab] (modified in place: penalties are applied). out may be NULL. Returns -1
 * (sampler_error says why) when a logit is NaN or +inf, or when every token is forbidden (-inf). */
int32_t sampler_sample(sampler *s, float *logits, sample_result *out);
/* -1 with the reason in s->error when logits[n_vocab] hold a NaN or +inf, else 0. */
int sampler_check_logits(sampler *s, const float *logits);
const char *sampler_error(const sampler *s);

#endif
