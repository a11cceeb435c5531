/* bench_streams.c — the streams of `deltafin bench` (bench_streams.h): sessions, prompts, batched prefill and
 * decode passes, and the unique expert pairs of a prefill read back from the routing trace. A prefill in
 * several passes asks storage for each pass's union per layer, so storage's request counter sums those unions;
 * only the trace tells how many distinct (layer, expert) pairs the whole prompt needed. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_streams.h"
#include "common/util.h"

/* Stream 0 keeps the seed the single-stream bench always used, so its prompt and tokens stay comparable. */
static void streams_prompt(int32_t *ids, int n, int k, int vocab) {
    uint64_t x = 88172645463325252ull ^ ((uint64_t)k * 0x9E3779B97F4A7C15ull);
    if (!x) x = 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = vocab ? (int32_t)(x % (uint64_t)vocab) : 0;
    }
}

int bench_streams_init(bench_streams *b, df_engine *eng, int n, int prompt, int with_saved, df_error *err) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->prompt = prompt;
    b->vocab = df_engine_info(eng)->vocab_size;
    b->s = xcalloc((size_t)n, sizeof *b->s);
    if (with_saved) b->saved = xcalloc((size_t)n, sizeof *b->saved);
    b->ids = xmalloc((size_t)n * (size_t)prompt * sizeof *b->ids);
    b->logits = xcalloc((size_t)n * (size_t)b->vocab, sizeof *b->logits);
    for (int k = 0; k < n; k++) streams_prompt(b->ids + (size_t)k * prompt, prompt, k, b->vocab);
    int rc = df_batch_init(&b->batch, eng, err);
    for (int k = 0; !rc && k < n; k++) {
        rc = df_session_init(&b->s[k], eng, err);
        if (!rc && with_saved) rc = df_session_init(&b->saved[k], eng, err);
    }
    return rc;
}

void bench_streams_free(bench_streams *b) {
    for (int k = 0; k < b->n; k++) {
        if (b->s) df_session_free(b->s[k]);
        if (b->saved) df_session_free(b->saved[k]);
    }
    df_batch_free(b->batch);
    free(b->s);
    free(b->saved);
    free(b->ids);
    free(b->logits);
    memset(b, 0, sizeof *b);
}

int bench_streams_prefill(bench_streams *b, int rows, int *passes, df_error *err) {
    int rc = DF_OK, k = 0, at = 0;   /* the next prompt token to evaluate: stream k, position at */
    *passes = 0;
    while (!rc && k < b->n) {
        df_batch_clear(b->batch);
        for (int room = rows; !rc && room > 0 && k < b->n;) {
            int take = DF_MIN(room, b->prompt - at);
            int last = at + take == b->prompt;
            rc = df_batch_add(b->batch, b->s[k], b->ids + (size_t)k * b->prompt + at, take,
                              last ? b->logits + (size_t)k * b->vocab : NULL, 0, err);
            room -= take;
            at += take;
            if (last) k++, at = 0;
        }
        if (!rc) rc = df_batch_eval(b->batch, err);
        if (!rc) ++*passes;
    }
    return rc;
}

int bench_streams_eval(bench_streams *b, const int32_t *tok, float *logits, df_error *err) {
    df_batch_clear(b->batch);
    int rc = DF_OK;
    for (int k = 0; !rc && k < b->n; k++)
        rc = df_batch_add(b->batch, b->s[k], &tok[k], 1, logits + (size_t)k * b->vocab, 0, err);
    return rc ? rc : df_batch_eval(b->batch, err);
}

int bench_streams_save(bench_streams *b, df_error *err) {
    int rc = DF_OK;
    for (int k = 0; !rc && k < b->n; k++) rc = df_session_copy(b->saved[k], b->s[k], err);
    return rc;
}

int bench_streams_restore(bench_streams *b, df_error *err) {
    int rc = DF_OK;
    for (int k = 0; !rc && k < b->n; k++) rc = df_session_copy(b->s[k], b->saved[k], err);
    return rc;
}

uint64_t bench_streams_memory(const bench_streams *b) {
    uint64_t bytes = 0;
    for (int k = 0; k < b->n; k++)
        bytes += df_session_memory(b->s[k]) + (b->saved ? df_session_memory(b->saved[k]) : 0);
    return bytes;
}

static int key_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int64_t bench_trace_unique(const char *path, int64_t from, uint64_t *asked) {
    *asked = 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (fseek(f, (long)from, SEEK_SET)) {
        fclose(f);
        return -1;
    }
    char *line = NULL;
    size_t lcap = 0, n = 0, cap = 0;
    uint64_t *keys = NULL;
    while (getline(&line, &lcap, f) >= 0) {
        if (!isdigit((unsigned char)line[0])) continue;   /* a run's header lines */
        char *p = line, *end;
        long layer = strtol(p, &end, 10);
        if (layer < 0 || layer > 0xFFFFFF) continue;
        for (p = end;; p = end) {
            long id = strtol(p, &end, 10);
            if (end == p || id < 0 || id > 0xFFFFFF) break;
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                keys = xrealloc(keys, cap * sizeof *keys);
            }
            keys[n++] = (uint64_t)layer << 32 | (uint64_t)id;
        }
    }
    free(line);
    fclose(f);
    if (n) qsort(keys, n, sizeof *keys, key_cmp);
    int64_t unique = 0;
    for (size_t i = 0; i < n; i++) unique += !i || keys[i] != keys[i - 1];
    free(keys);
    *asked = n;
    return unique;
}
