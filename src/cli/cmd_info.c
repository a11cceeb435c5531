/* cmd_info.c — `deltafin info -m DIR`: family, layer schedule, context length, whether a tokenizer (and a
 * chat format) is there, parameter and byte counts, dtypes, and any problem found by checking every tensor
 * against the config. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"
#include "cli_opts.h"
#include "deltafin.h"
#include "common/util.h"
#include "install/remote.h"
#include "tokenizer/tokenizer.h"

/* Whether run -p, chat and serve can work on this folder (run --tokens and logits need no tokenizer). */
static void info_tokenizer(const char *dir) {
    tokenizer *tok = NULL;
    df_error err = {0};
    if (tokenizer_load_dir(&tok, dir, &err)) {
        printf("tokenizer: none (%s); only token-id prompts work (run --tokens, logits)\n", err.msg);
        return;
    }
    chat_format fmt = 0;
    df_error ferr = {0};
    if (chat_detect_format(tok, &fmt, &ferr)) fmt = 0;
    printf("tokenizer: present, %d ids; chat format: %s\n", (int)tokenizer_n_vocab(tok),
           fmt == CHAT_K3 ? "Kimi K3" : fmt == CHAT_K2 ? "Kimi K2" : "none (run works, chat does not)");
    tokenizer_free(tok);
}

int cmd_info(int argc, char **argv) {
    static const struct option longopts[] = {{"model", 1, 0, 'm'}, {"help", 0, 0, 'h'}, CLI_STORAGE_LONGOPTS,
                                             {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    opts.n_threads = 1;
    opts.heat = DF_HEAT_READ;
    opts.preload = DF_PRELOAD_OFF;   /* prints the plan: nothing to compute */
    opts.ctx_tokens = CLI_DEFAULT_CTX;   /* the plan as run and chat make it */
    int c;
    while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        int s = cli_storage_opt(c, optarg, &opts);
        if (s > 0) continue;
        if (c == 'm') opts.model_dir = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr, "usage: deltafin info [-m DIR] [storage options, e.g. --spine int8]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (cli_no_stray_args("info", argc, argv, optind)) return 2;
    char defm[4096];
    if (!opts.model_dir) opts.model_dir = cli_default_model(defm, sizeof defm);
    int served;
    if (cli_rank_serve(&opts, "info", &served)) return served;
    df_error err = {0};
    df_engine *eng = NULL;
    if (df_engine_open(&eng, &opts, &err)) {
        fprintf(stderr, "deltafin info: %s\n", err.msg);
        return 1;
    }
    size_t cap = 1 << 16;
    char *buf = xmalloc(cap);
    df_engine_describe(eng, buf, cap);
    install_describe(opts.model_dir, buf, cap);   /* a partial install: how much is local */
    printf("model: %s\n%s", opts.model_dir, buf);
    printf("context: %lld tokens\n", (long long)df_engine_info(eng)->max_context);
    info_tokenizer(opts.model_dir);
    int rc = df_engine_check(eng, &err);
    if (rc) printf("problem: %s\n", err.msg);
    else printf("check: every tensor present with the expected shape\n");
    free(buf);
    df_engine_free(eng);
    return rc ? 1 : 0;
}
