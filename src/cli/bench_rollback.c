/* bench_rollback.c — `deltafin bench rollback`: what returning a session to an accepted prefix costs after a
 * verify pass (speculation), from the rollback record (replaying the KDA recurrence, no weight reads) and,
 * for comparison, by evaluating the history again; and the memory the record takes per session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "common/util.h"

static int usage(FILE *f) {
    fprintf(f, "usage: deltafin bench rollback [-m DIR] [--rows K] [--accept A] [--prompt P] [--rounds N] "
               "[--threads N] [--json]\n"
               "  After a P-token prompt, N times: a verify pass of K rows, then back to P + A tokens.\n"
               "  Reports the time per rollback from the record and by evaluating again, the weight bytes\n"
               "  each read, the record's memory per session, and the verify pass's time with and without\n"
               "  keeping the record.\n");
    return f == stdout ? 0 : 2;
}

typedef struct {
    double seconds, pass_seconds;   /* per truncate; per verify pass */
    uint64_t disk_bytes;            /* weight bytes per truncate */
} rollback_cost;

/* rounds times: the prompt, a verify pass of rows tokens, back to prompt + accept; sums the truncates' time
 * and weight reads and the verify passes' time. */
static int measure(df_engine *eng, df_session *s, const int32_t *ids, int prompt, int rows, int accept, int rounds,
                   rollback_cost *out, df_error *err) {
    memset(out, 0, sizeof *out);
    int rc = DF_OK;
    for (int r = 0; !rc && r < rounds; r++) {
        df_session_reset(s);
        rc = df_session_eval(s, ids, prompt, NULL, 0, err);
        double t0 = df_now();
        if (!rc) rc = df_session_eval(s, ids + prompt, rows, NULL, 0, err);
        out->pass_seconds += df_now() - t0;
        df_stats a, b;
        df_engine_stats(eng, &a);
        t0 = df_now();
        if (!rc) rc = df_session_truncate(s, prompt + accept, err);
        out->seconds += df_now() - t0;
        df_engine_stats(eng, &b);
        out->disk_bytes += b.disk_bytes + b.net_bytes - a.disk_bytes - a.net_bytes;
    }
    out->seconds /= rounds;
    out->pass_seconds /= rounds;
    out->disk_bytes /= (uint64_t)rounds;
    return rc;
}

int bench_rollback(int argc, char **argv) {
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    char defm[4096];
    opts.model_dir = cli_default_model(defm, sizeof defm);
    int rows = 8, accept = 3, prompt = 16, rounds = 5, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) opts.model_dir = argv[++i];
        else if (!strcmp(a, "--rows") && v) rows = atoi(argv[++i]);
        else if (!strcmp(a, "--accept") && v) accept = atoi(argv[++i]);
        else if (!strcmp(a, "--prompt") && v) prompt = atoi(argv[++i]);
        else if (!strcmp(a, "--rounds") && v) rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && v) opts.n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        else {
            fprintf(stderr, "deltafin bench rollback: unknown option or missing value '%s'\n", a);
            return usage(stderr);
        }
    }
    if (rows < 2 || rows > 1024 || accept < 0 || accept >= rows || prompt < 1 || rounds < 1) {
        fprintf(stderr, "deltafin bench rollback: need 2 <= --rows <= 1024, 0 <= --accept < --rows, --prompt >= 1, "
                        "--rounds >= 1\n");
        return 2;
    }
    df_engine *eng = NULL;
    df_session *s = NULL;
    df_error err = {0};
    int rc = df_engine_open(&eng, &opts, &err);
    if (!rc) rc = df_session_init(&s, eng, &err);
    if (!rc) df_session_set_rollback_rows(s, rows);   /* the record sized for the verify pass exactly */
    if (rc) {
        fprintf(stderr, "deltafin bench rollback: %s\n", err.msg);
        df_engine_free(eng);
        return 1;
    }
    const df_model_info *info = df_engine_info(eng);
    int n = prompt + rows;
    if (n > info->max_context) {
        fprintf(stderr, "deltafin bench rollback: %d tokens exceed the model's context of %lld\n", n,
                (long long)info->max_context);
        df_session_free(s);
        df_engine_free(eng);
        return 2;
    }
    int32_t *ids = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(1 + ((int64_t)i * 7919) % (info->vocab_size - 1));
    rollback_cost rec, again;
    rc = measure(eng, s, ids, prompt, rows, accept, rounds, &rec, &err);
    uint64_t with_record = df_session_memory(s);
    df_session_set_rollback_rows(s, 0);
    uint64_t without = df_session_memory(s);
    if (!rc) rc = measure(eng, s, ids, prompt, rows, accept, rounds, &again, &err);
    if (rc) {
        fprintf(stderr, "deltafin bench rollback: %s\n", err.msg);
    } else if (json) {
        printf("{\"rows\":%d,\"accept\":%d,\"prompt\":%d,\"rounds\":%d,\"replay_s\":%.6g,\"replay_disk_bytes\":%llu,"
               "\"reeval_s\":%.6g,\"reeval_disk_bytes\":%llu,\"record_bytes\":%llu,"
               "\"pass_s_record\":%.6g,\"pass_s_no_record\":%.6g}\n",
               rows, accept, prompt, rounds, rec.seconds, (unsigned long long)rec.disk_bytes, again.seconds,
               (unsigned long long)again.disk_bytes, (unsigned long long)(with_record - without), rec.pass_seconds,
               again.pass_seconds);
    } else {
        printf("rollback after a %d-row verify pass to %d accepted (prompt %d, %d rounds, %s):\n"
               "  from the record:     %.3f ms per rollback, %llu weight bytes read\n"
               "  evaluating again:    %.3f ms per rollback, %llu weight bytes read\n"
               "  record memory:       %.2f MiB per session (for passes of up to %d rows)\n"
               "  verify pass:         %.3f ms keeping the record, %.3f ms without\n",
               rows, accept, prompt, rounds, info->family, rec.seconds * 1e3, (unsigned long long)rec.disk_bytes,
               again.seconds * 1e3, (unsigned long long)again.disk_bytes,
               (double)(with_record - without) / (1 << 20), rows,
               rec.pass_seconds * 1e3, again.pass_seconds * 1e3);
    }
    free(ids);
    df_session_free(s);
    df_engine_free(eng);
    return rc ? 1 : 0;
}
