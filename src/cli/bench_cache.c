/* bench_cache.c — `deltafin bench cache --trace FILE`: replays a recorded routing trace through each
 * replacement policy of the expert cache, through Belady's offline optimum and through two bounds told part of
 * the future (every expert's count; the next token's selections), at cache sizes given as a share of all
 * routed experts, and reports hit rates and how much of the LRU-to-optimum gap each closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "common/util.h"
#include "residency/policy.h"
#include "residency/trace.h"

#define BC_MAX_SIZES 32

static int bench_cache_usage(FILE *f) {
    fprintf(f, "usage: deltafin bench cache --trace FILE [--sizes 5,10,25,50] [--warmup F] [--json]\n"
               "  replays a routing trace (run/bench --trace-routing FILE) through each expert cache policy\n"
               "  and Belady's optimum; sizes are percent of all routed experts; hits in the first F of the\n"
               "  records are not counted (steady state, as after warming from saved heat)\n");
    return f == stdout ? 0 : 2;
}

static int bench_cache_sizes(const char *s, double *out) {
    int n = 0;
    while (*s && n < BC_MAX_SIZES) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || v <= 0 || v > 100) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return *s ? -1 : n;
}

int bench_cache(int argc, char **argv) {
    const char *path = NULL;
    double sizes[BC_MAX_SIZES] = {5, 10, 25, 50};
    int n_sizes = 4, json = 0;
    double warmup = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--trace") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            char *end;
            warmup = strtod(argv[++i], &end);
            if (*end || !(warmup >= 0 && warmup < 1)) {
                fprintf(stderr, "deltafin bench cache: --warmup: expected a fraction in [0, 1)\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            if ((n_sizes = bench_cache_sizes(argv[++i], sizes)) <= 0) {
                fprintf(stderr, "deltafin bench cache: --sizes: expected percentages in (0, 100] like 5,10,25\n");
                return 2;
            }
        } else return bench_cache_usage(!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") ? stdout : stderr);
    }
    if (!path) return bench_cache_usage(stderr);
    rtrace t;
    df_error err = {0};
    if (rtrace_read(&t, path, &err)) {
        fprintf(stderr, "deltafin bench cache: %s\n", err.msg);
        return 1;
    }
    int64_t n_keys = t.base[t.n_layers], count_from = t.rec[(int64_t)(warmup * (double)t.n_records)];
    if (!t.n_access) {
        fprintf(stderr, "deltafin bench cache: %s holds no expert requests\n", path);
        rtrace_free(&t);
        return 1;
    }
    if (json) printf("{\"trace\":\"%s\",\"experts\":%lld,\"requests\":%lld,\"records\":%lld,\"warmup\":%g,\"rows\":[",
                     path, (long long)n_keys, (long long)t.n_access, (long long)t.n_records, warmup);
    else {
        printf("trace %s: %lld routed experts, %lld requests in %lld records; hits counted after the first %g of "
               "them\n", path, (long long)n_keys, (long long)t.n_access, (long long)t.n_records, warmup);
        printf("%6s %7s", "size", "slots");
        for (int k = 0; k <= POLICY_ORACLE_NEXT; k++) printf(" %10s", policy_name(k));
        for (int k = 1; k <= POLICY_ORACLE_NEXT; k++)
            if (k != POLICY_BELADY) printf("  gap %-8s", policy_name(k));
        printf("   (hit rates; gap = share of the lru-to-belady gap closed)\n");
    }
    for (int s = 0; s < n_sizes; s++) {
        int slots = (int)DF_MAX(1, DF_MIN(n_keys, (int64_t)(sizes[s] / 100.0 * (double)n_keys + 0.5)));
        double rate[POLICY_ORACLE_NEXT + 1];
        policy_trace pt = {t.keys, t.rec, t.n_access, t.n_records, t.n_layers, t.base, count_from};
        for (int k = 0; k <= POLICY_ORACLE_NEXT; k++)
            rate[k] = (double)policy_simulate(k, &pt, slots) / (double)(t.n_access - count_from);
        double gap = rate[POLICY_BELADY] - rate[POLICY_LRU];
        if (json) {
            printf("%s{\"size_pct\":%g,\"slots\":%d", s ? "," : "", sizes[s], slots);
            for (int k = 0; k <= POLICY_ORACLE_NEXT; k++) printf(",\"%s\":%.6f", policy_name(k), rate[k]);
            for (int k = 1; k <= POLICY_ORACLE_NEXT; k++)
                if (k != POLICY_BELADY)
                    printf(",\"gap_closed_%s\":%.4f", policy_name(k), gap > 0 ? (rate[k] - rate[0]) / gap : 1.0);
            printf("}");
        } else {
            printf("%5g%% %7d", sizes[s], slots);
            for (int k = 0; k <= POLICY_ORACLE_NEXT; k++) printf(" %10.4f", rate[k]);
            for (int k = 1; k <= POLICY_ORACLE_NEXT; k++)
                if (k != POLICY_BELADY) printf("  %11.1f%%", gap > 0 ? 100 * (rate[k] - rate[0]) / gap : 100.0);
            printf("\n");
        }
    }
    if (json) printf("]}\n");
    rtrace_free(&t);
    return 0;
}
