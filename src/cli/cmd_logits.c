/* cmd_logits.c — `deltafin logits -m DIR --prompt prompt.json -o out.f32`: the prefill consumed as one
 * batch (a row of logits per token), then each decode token singly with the cache; rows written as
 * little-endian float32 [len(prefill)+len(decode), vocab]. The fixture format of tests/fixtures. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_opts.h"
#include "deltafin.h"
#include "common/prompt.h"
#include "common/util.h"

static void usage(void) {
    fprintf(stderr, "usage: deltafin logits -m DIR --prompt prompt.json -o out.f32 [--threads N] [storage options]\n"
                    "storage options:\n" CLI_STORAGE_USAGE);
}

int cmd_logits(int argc, char **argv) {
    static const struct option longopts[] = {{"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"output", 1, 0, 'o'},
                                             {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'}, CLI_STORAGE_LONGOPTS,
                                             {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    const char *prompt = NULL, *outp = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:o:t:h", longopts, NULL)) != -1) {
        int so = cli_storage_opt(c, optarg, &opts);
        if (so < 0) return 2;
        if (so) continue;
        switch (c) {
        case 'm': opts.model_dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'o': outp = optarg; break;
        case 't': {
            long v;
            if (cli_parse_int("-t/--threads", optarg, 1, 1024, &v) < 0) return 2;
            opts.n_threads = (int)v;
            break;
        }
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (cli_no_stray_args("logits", argc, argv, optind)) return 2;
    if (!opts.model_dir || !prompt || !outp) {
        usage();
        return 2;
    }
    int served;
    if (cli_rank_serve(&opts, "logits", &served)) return served;
    df_error err = {0};
    int32_t *pre = NULL, *dec = NULL;
    int np = 0, nd = 0;
    df_engine *eng = NULL;
    df_session *s = NULL;
    FILE *f = NULL;
    float *logits = NULL;
    int rc = prompt_read_file(prompt, &pre, &np, &dec, &nd, &err);
    if (!rc) rc = df_engine_open(&eng, &opts, &err);
    if (!rc) rc = df_session_init(&s, eng, &err);
    if (!rc) {
        int V = df_engine_info(eng)->vocab_size;
        logits = xmalloc((size_t)(np > 1 ? np : 1) * V * sizeof(float));
        if (!(f = fopen(outp, "wb"))) {
            df_error_set(&err, DF_EIO, "%s: cannot create", outp);
            rc = DF_EIO;
        }
        if (!rc) rc = df_session_eval(s, pre, np, logits, 1, &err);
        if (!rc && fwrite(logits, sizeof(float), (size_t)np * V, f) != (size_t)np * V) rc = DF_EIO;
        for (int i = 0; !rc && i < nd; i++) {
            rc = df_session_eval(s, dec + i, 1, logits, 1, &err);
            if (!rc && fwrite(logits, sizeof(float), V, f) != (size_t)V) rc = DF_EIO;
        }
        if (f && fclose(f) && !rc) rc = DF_EIO;
        if (rc == DF_EIO && !err.msg[0]) df_error_set(&err, DF_EIO, "%s: write failed", outp);
    }
    if (rc) fprintf(stderr, "deltafin logits: %s\n", err.msg);
    free(logits);
    free(pre);
    free(dec);
    df_session_free(s);
    df_engine_free(eng);
    return rc ? 1 : 0;
}
