/* cmd_warm.c — `deltafin warm -m DIR`: opens the model with its saved heat and waits until the hottest experts
 * that fit the budget are read, then says how many and how long it took. On a partial install (--remote) this
 * fetches them into the disk cache, where they stay; locally it measures what warming costs at open. */
#include <getopt.h>
#include <stdio.h>
#include "cli.h"
#include "cli_opts.h"
#include "deltafin.h"
#include "common/util.h"

int cmd_warm(int argc, char **argv) {
    static const struct option longopts[] = {{"model", 1, 0, 'm'}, {"help", 0, 0, 'h'}, CLI_STORAGE_LONGOPTS,
                                             {0, 0, 0, 0}};
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    opts.n_threads = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        int s = cli_storage_opt(c, optarg, &opts);
        if (s > 0) continue;
        if (s < 0) return 2;
        if (c == 'm') opts.model_dir = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr, "usage: deltafin warm -m DIR [storage options, e.g. --mem 8G]\n"
                                                "  reads the hottest experts of DIR/.deltafin/heat into the cache\n");
            return c == 'h' ? 0 : 2;
        }
    }
    char defm[4096];
    if (!opts.model_dir) opts.model_dir = cli_default_model(defm, sizeof defm);
    opts.heat = DF_HEAT_ON;
    df_error err = {0};
    df_engine *eng = NULL;
    double t0 = df_now();
    if (df_engine_open(&eng, &opts, &err)) {
        fprintf(stderr, "deltafin warm: %s\n", err.msg);
        return 1;
    }
    const char *note = df_engine_heat_note(eng);
    if (note[0]) fprintf(stderr, "deltafin warm: warning: %s\n", note);
    df_engine_warm_wait(eng);
    df_stats st;
    df_engine_stats(eng, &st);
    double s = df_now() - t0;
    printf("%s: warmed %llu experts (%.1f MiB) into %d cache slots in %.2f s%s\n", opts.model_dir,
           (unsigned long long)st.warm_loads, (double)st.warm_loads * (double)st.expert_bytes / 1048576.0,
           st.cache_slots, s, st.warm_loads ? "" : " (no heat saved yet: run the model first)");
    df_engine_free(eng);
    return 0;
}
