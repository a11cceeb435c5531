/* synth_skew.h — router biases that make a synthetic checkpoint's expert popularity follow a Zipf law. */
#ifndef DF_CLI_SYNTH_SKEW_H
#define DF_CLI_SYNTH_SKEW_H

#include <stdint.h>

/* Per-expert selection frequencies (summing to topk, none above 1) of a Zipf law with this exponent over a
 * seeded random ranking of the experts: the expert of rank r gets min(1, c r^-skew). */
void synth_zipf_targets(int experts, int topk, double skew, uint64_t seed, double *target);
/* e_score_correction_bias values for one MoE layer: with router logits ~ N(0, sigma^2) independently per
 * expert (random gate rows on an RMS-normalised input), sigmoid scores plus these biases select expert e for
 * about target[e] of the tokens. Calibrated by simulation; writes bias[experts]. */
void synth_route_bias(int experts, int topk, const double *target, double sigma, uint64_t seed, float *bias);

#endif
