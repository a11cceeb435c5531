/* bench_spec.h — `deltafin bench` decoding through the shared decode loop with speculation and/or a prompt
 * set (bench_spec.c). */
#ifndef DF_BENCH_SPEC_H
#define DF_BENCH_SPEC_H

#include "deltafin.h"
#include "sample/spec.h"
#include "tokenizer/tokenizer.h"

typedef struct bench_spec_args {
    const char *model_dir;
    spec_opts spec;
    const char *prompts_path;     /* JSON lines {"name","kind","text"}; NULL: the random prompt below */
    const char *kind;             /* keep only prompts of this kind; NULL = all */
    const int32_t *random_prompt;
    int n_random;
    int n;                        /* tokens to generate per prompt (fewer where the context ends) */
} bench_spec_args;

typedef struct bench_spec_result {
    int prompts, prompt_tokens, passes, drafted, accepted;
    double prefill_s, decode_s;
    tok_ids tokens;               /* every generated token, prompt after prompt */
    df_stats delta;               /* counters summed over the decode phases */
    df_profile prof;              /* likewise */
} bench_spec_result;

int bench_spec_decode(df_engine *eng, df_session *s, const bench_spec_args *a, bench_spec_result *r,
                      df_error *err);
/* Sets the counters of s2 to those of s1 plus acc (the decode phases' sums). */
void bench_spec_shift(df_stats *s2, const df_stats *s1, const df_stats *acc);

#endif
