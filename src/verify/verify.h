/* verify.h — `deltafin verify`: what can be checked about a model folder without the network, each check
 * reported PASS, FAIL (naming what failed) or SKIP (does not apply, and why): the checkpoint's files, its config
 * against the published Kimi K3 values, every tensor's presence and shape against the config, the SHA-256
 * checks an install recorded, that the engine opens and computes finite logits, and token oracles: the
 * tokenizer's ids for a prompt and the greedy continuation after it. The published K3 oracle is built in; other
 * models have none unless the caller gives one. */
#ifndef DF_VERIFY_H
#define DF_VERIFY_H

#include <stdint.h>

#include "deltafin.h"
#include "format/checkpoint.h"
#include "model/config.h"

typedef enum { VERIFY_PASS, VERIFY_FAIL, VERIFY_SKIP } verify_result;

/* Where results go: line() is called once per check as it finishes; the counts add up. */
typedef struct verify_report {
    void (*line)(void *ctx, verify_result res, const char *check, const char *detail);
    void *ctx;
    int n_pass, n_fail, n_skip;
} verify_report;

void verify_say(verify_report *r, verify_result res, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A token oracle: a prompt, the ids its tokenizer must give, and the greedy continuation the model must give
 * (argmax at every step, no BOS added). */
typedef struct verify_oracle {
    char *source;            /* where it comes from, for messages */
    char *prompt;
    int32_t *prompt_ids;
    int n_prompt_ids;
    int32_t *greedy;
    int n_greedy;
} verify_oracle;

/* The oracle the original Deltafin published for Kimi K3. */
void verify_oracle_k3(verify_oracle *o);
/* Oracles from a JSON file: {"prompt", "prompt_ids", "greedy"} or {"cases": [such objects]} (the layout of
 * models/default/reference.json). */
int verify_oracles_load(const char *path, verify_oracle **out, int *n, df_error *err);
void verify_oracles_free(verify_oracle *v, int n);

typedef struct verify_opts {
    df_engine_opts engine;       /* model_dir and the storage options of the engine checks */
    const verify_oracle *oracles;   /* given by the caller: used instead of a built-in one */
    int n_oracles;
    int no_engine;               /* skip opening the engine (files, config, tensors and install only) */
} verify_opts;

/* Runs every check that applies; returns the number of FAILs (also in r->n_fail). */
int verify_model(const verify_opts *o, verify_report *r);

/* verify_shapes.c. The config against the published K3 values (family K3 only): shape values first, then
 * sizes (vocabulary, layers, experts, top-k, layer schedule), which a K3-shaped synthetic checkpoint may
 * shrink. *published is set when the sizes are the published model's too. */
void verify_config_k3(const df_config *cfg, verify_report *r, int *published);
/* Every tensor of the checkpoint against the shapes the config gives, and every tensor the config needs
 * present. Returns the number of problems found (0: PASS reported). */
int verify_tensors(const checkpoint *ck, const df_config *cfg, verify_report *r);

#endif
