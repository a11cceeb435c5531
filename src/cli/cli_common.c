/* cli_common.c — helpers shared by subcommands: where the default model is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"

static int cli_is_model_dir(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return access(p, R_OK) == 0;
}

/* Looked for in this order, so an installed or copied binary finds its own model from any folder: next to
 * the executable (a build tree), PREFIX/share/deltafin (make install), then the working folder. */
const char *cli_default_model(char *buf, size_t cap) {
    const char *env = getenv("DELTAFIN_MODEL");
    if (env && *env) return env;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        static const char *const rel[] = {"models/default", "../share/deltafin/models/default"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            if (snprintf(buf, cap, "%s/%s", exe, rel[i]) < (int)cap && cli_is_model_dir(buf)) return buf;
        }
    }
    if (!cli_is_model_dir("models/default"))
        fprintf(stderr, "deltafin: no -m DIR given and no default model found: looked in $DELTAFIN_MODEL, "
                "%s/models/default, %s/../share/deltafin/models/default and ./models/default\n",
                slash ? exe : "(executable folder)", slash ? exe : "(executable folder)");
    return "models/default";
}

int cli_rank_serve(df_engine_opts *o, const char *cmd, int *status) {
    o->ranks = DF_RANKS_LAUNCHER;
    *status = 0;
    if (df_launcher_rank() <= 0) return 0;
    char defm[4096];
    df_engine_opts w = *o;
    if (!w.model_dir) w.model_dir = cli_default_model(defm, sizeof defm);
    df_error err = {0};
    if (df_engine_serve(&w, &err)) {
        fprintf(stderr, "deltafin %s: %s\n", cmd, err.msg);
        *status = 1;
    }
    return 1;
}
