/* cmd_verify.c — `deltafin verify -m DIR [--oracle FILE] [--no-engine]`: the checks of verify.h, one line each
 * (PASS, FAIL naming what failed, or SKIP saying why it does not apply), a summary, and exit status 1 on any
 * FAIL. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "cli_opts.h"
#include "common/util.h"
#include "verify/verify.h"

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin verify [-m DIR] [--oracle FILE] [--no-engine] [--threads N] [storage options]\n"
               "  checks a model folder without the network: its files, config (against the published Kimi K3's\n"
               "  values for K3), every tensor's shape, the install's recorded SHA-256 checks, that the engine opens\n"
               "  and computes, and the token oracle (built in for the published K3); exit 1 on any FAIL\n"
               "  --oracle FILE   check this oracle instead: {\"prompt\", \"prompt_ids\", \"greedy\"} or\n"
               "                  {\"cases\": [...]} (the layout of models/default/reference.json)\n"
               "  --no-engine     files, config, tensors and install only (reads headers, no weights)\n"
               "storage options (for the engine checks):\n" CLI_STORAGE_USAGE);
}

static void print_line(void *ctx, verify_result res, const char *check, const char *detail) {
    (void)ctx;
    printf("%s  %s: %s\n", res == VERIFY_PASS ? "PASS" : res == VERIFY_FAIL ? "FAIL" : "SKIP", check, detail);
    fflush(stdout);
}

int cmd_verify(int argc, char **argv) {
    static const struct option longopts[] = {{"model", 1, 0, 'm'}, {"oracle", 1, 0, 'O'}, {"no-engine", 0, 0, 'N'},
                                             {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'}, CLI_STORAGE_LONGOPTS,
                                             {0, 0, 0, 0}};
    verify_opts vo = {0};
    df_engine_opts_default(&vo.engine);
    const char *oracle_path = NULL;
    char defbuf[4096];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", longopts, NULL)) != -1) {
        int so = cli_storage_opt(c, optarg, &vo.engine);
        if (so < 0) return 2;
        if (so) continue;
        switch (c) {
        case 'm': vo.engine.model_dir = optarg; break;
        case 'O': oracle_path = optarg; break;
        case 'N': vo.no_engine = 1; break;
        case 't': {
            long v;
            if (cli_parse_int("-t/--threads", optarg, 1, 1024, &v) < 0) return 2;
            vo.engine.n_threads = (int)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (cli_no_stray_args("verify", argc, argv, optind)) return 2;
    if (!vo.engine.model_dir) vo.engine.model_dir = cli_default_model(defbuf, sizeof defbuf);
    verify_oracle *oracles = NULL;
    df_error err = {0};
    if (oracle_path && verify_oracles_load(oracle_path, &oracles, &vo.n_oracles, &err)) {
        fprintf(stderr, "deltafin verify: %s\n", err.msg);
        return 2;
    }
    vo.oracles = oracles;
    printf("deltafin verify: %s\n", vo.engine.model_dir);
    fflush(stdout);
    verify_report r = {.line = print_line};
    double t0 = df_now();
    verify_model(&vo, &r);
    printf("%s: %d passed, %d failed, %d skipped in %.1f s\n", r.n_fail ? "FAIL" : "PASS", r.n_pass, r.n_fail,
           r.n_skip, df_now() - t0);
    verify_oracles_free(oracles, vo.n_oracles);
    return r.n_fail ? 1 : 0;
}
