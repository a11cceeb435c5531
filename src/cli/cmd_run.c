/* cmd_run.c — `deltafin run -m DIR --tokens 1,2,3 -n N`: greedy continuation of a token-id prompt, printed
 * as ids as they are generated, then the speed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "common/util.h"

static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16;
    *out = xmalloc(cap * sizeof(int32_t));
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return -1;
        if (*n == cap) *out = xrealloc(*out, (cap *= 2) * sizeof(int32_t));
        (*out)[(*n)++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

int cmd_run(int argc, char **argv) {
    static const struct option longopts[] = {{"model", 1, 0, 'm'}, {"tokens", 1, 0, 'k'}, {"threads", 1, 0, 't'},
                                             {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    const char *tokens = NULL;
    int n_gen = 16, c;
    while ((c = getopt_long(argc, argv, "m:k:n:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': opts.model_dir = optarg; break;
        case 'k': tokens = optarg; break;
        case 'n': n_gen = atoi(optarg); break;
        case 't': opts.n_threads = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: deltafin run -m DIR --tokens 1,2,3 [-n N] [--threads N]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (!opts.model_dir) opts.model_dir = cli_default_model();
    int32_t *ids = NULL;
    int n = 0;
    if (!tokens || parse_ids(tokens, &ids, &n)) {
        fprintf(stderr, "deltafin run: --tokens needs a comma-separated list of token ids\n");
        free(ids);
        return 2;
    }
    df_error err = {0};
    df_engine *eng = NULL;
    df_session *s = NULL;
    int rc = df_engine_open(&eng, &opts, &err);
    if (!rc) rc = df_session_init(&s, eng, &err);
    float *logits = rc ? NULL : xmalloc((size_t)df_engine_info(eng)->vocab_size * sizeof(float));
    double t0 = df_now(), t1 = t0;
    int made = 0;
    if (!rc) rc = df_session_eval(s, ids, n, logits, 0, &err);
    if (!rc) t1 = df_now();
    while (!rc && made < n_gen) {
        int32_t next = argmax(logits, df_engine_info(eng)->vocab_size);
        printf("%s%d", made ? "," : "", next);
        fflush(stdout);
        if (++made < n_gen) rc = df_session_eval(s, &next, 1, logits, 0, &err);
    }
    if (made) printf("\n");
    if (rc) {
        fprintf(stderr, "deltafin run: %s\n", err.msg);
    } else {
        double t2 = df_now();
        fprintf(stderr, "prefill %d tokens in %.3f s; %d tokens generated, %.2f tokens/s\n", n, t1 - t0, made,
                made > 1 ? (made - 1) / (t2 - t1) : 0.0);
    }
    free(logits);
    free(ids);
    df_session_free(s);
    df_engine_free(eng);
    return rc ? 1 : 0;
}
