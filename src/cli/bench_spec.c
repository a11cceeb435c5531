/* bench_spec.c — the decode part of `deltafin bench` when it measures speculative decoding (--spec, or a
 * prompt set with --prompts): each prompt is prefilled (not counted), then N tokens are decoded greedily
 * through the shared decode loop with the chosen speculation, and the engine's counters and profile are
 * summed over the decode phases only. A prompt set is JSON lines {"name", "kind", "text"}; --kind keeps one
 * kind (e.g. repetitive or prose). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_spec.h"
#include "common/util.h"
#include "sample/generate.h"
#include "tokenizer/tokenizer.h"

/* The counters print_result reads as differences, accumulated: acc += b - a. */
static void stats_acc(df_stats *acc, const df_stats *a, const df_stats *b) {
#define ACC(f) acc->f += b->f - a->f
    ACC(disk_bytes);
    ACC(net_bytes);
    ACC(expert_disk_bytes);
    ACC(spine_disk_bytes);
    ACC(expert_hits);
    ACC(expert_misses);
    ACC(expert_loads);
    ACC(expert_requests);
    ACC(lookahead_loads);
    ACC(lookahead_requests);
    ACC(lookahead_recalled);
    ACC(tokens_evaluated);
#undef ACC
}

void bench_spec_shift(df_stats *s2, const df_stats *s1, const df_stats *acc) {
    df_stats base = *s1;   /* s1 may be s2 */
#define SET(f) s2->f = base.f + acc->f
    SET(disk_bytes);
    SET(net_bytes);
    SET(expert_disk_bytes);
    SET(spine_disk_bytes);
    SET(expert_hits);
    SET(expert_misses);
    SET(expert_loads);
    SET(expert_requests);
    SET(lookahead_loads);
    SET(lookahead_requests);
    SET(lookahead_recalled);
    SET(tokens_evaluated);
#undef SET
}

/* Reads the prompt set: the texts of the lines whose kind matches (all when kind is NULL). */
static int read_prompts(const char *path, const char *kind, char ***texts, int *n, df_error *err) {
    size_t len = 0;
    char *buf = df_read_file(path, &len, err);
    if (!buf) return DF_EIO;
    *texts = NULL;
    *n = 0;
    int rc = DF_OK, line = 0;
    for (char *p = buf; *p && !rc; line++) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (*p) {
            json_error_t je;
            json_t *o = json_loads(p, 0, &je);
            const char *t = o ? json_string_value(json_object_get(o, "text")) : NULL;
            const char *k = o ? json_string_value(json_object_get(o, "kind")) : NULL;
            if (!t) {
                df_error_set(err, DF_EFORMAT, "%s line %d: expected a JSON object with a string \"text\"", path,
                             line + 1);
                rc = DF_EFORMAT;
            } else if (!kind || (k && !strcmp(k, kind))) {
                *texts = xrealloc(*texts, (size_t)(*n + 1) * sizeof(char *));
                (*texts)[(*n)++] = xstrdup(t);
            }
            json_decref(o);
        }
        if (!e) break;
        p = e + 1;
    }
    free(buf);
    if (!rc && !*n) {
        df_error_set(err, DF_EINVAL, "%s: no prompt%s%s", path, kind ? " of kind " : "", kind ? kind : "");
        rc = DF_EINVAL;
    }
    return rc;
}

int bench_spec_decode(df_engine *eng, df_session *s, const bench_spec_args *a, bench_spec_result *r,
                      df_error *err) {
    memset(r, 0, sizeof *r);
    int V = df_engine_info(eng)->vocab_size;
    int64_t max_ctx = df_engine_info(eng)->max_context;
    char **texts = NULL;
    int n_texts = 1, rc = DF_OK;
    tokenizer *tok = NULL;
    if (a->prompts_path) {
        rc = read_prompts(a->prompts_path, a->kind, &texts, &n_texts, err);
        if (!rc) rc = tokenizer_load_dir(&tok, a->model_dir, err);
    }
    spec *sp = NULL;
    if (!rc && a->spec.mode != SPEC_OFF) rc = spec_init(&sp, &a->spec, eng, err);
    float *logits = xmalloc((size_t)V * sizeof(float));
    for (int i = 0; !rc && i < n_texts; i++) {
        tok_ids ids = {0};
        if (texts) rc = tokenizer_encode(tok, texts[i], strlen(texts[i]), 0, &ids, err);
        else
            for (int j = 0; j < a->n_random; j++) tok_ids_push(&ids, a->random_prompt[j]);
        int n = (int)DF_MIN((int64_t)a->n, max_ctx - (int64_t)ids.n);
        if (!rc && (ids.n == 0 || n < 1)) {
            df_error_set(err, DF_EINVAL, "prompt %d: %zu tokens leave no room in the context of %lld", i + 1, ids.n,
                         (long long)max_ctx);
            rc = DF_EINVAL;
        }
        df_session_reset(s);
        double t0 = df_now();
        if (!rc) rc = df_session_eval(s, ids.v, (int)ids.n, logits, 0, err);
        r->prefill_s += df_now() - t0;
        r->prompt_tokens += (int)ids.n;
        df_stats st0, st1;
        df_profile p0, p1;
        df_engine_stats(eng, &st0);
        df_engine_profile(eng, &p0);
        gen_result res = {0};
        if (!rc) {
            gen_config gc = {.max_tokens = n, .eos_id = -1, .spec = sp};
            sample_params_default(&gc.sp);
            gc.sp.temperature = 0;
            rc = gen_run(s, &gc, logits, V, NULL, NULL, &res, err);
        }
        df_engine_stats(eng, &st1);
        df_engine_profile(eng, &p1);
        stats_acc(&r->delta, &st0, &st1);
        r->prof.spine_read += p1.spine_read - p0.spine_read;
        r->prof.expert_read += p1.expert_read - p0.expert_read;
        r->prof.attention += p1.attention - p0.attention;
        r->prof.expert_compute += p1.expert_compute - p0.expert_compute;
        r->prof.spine_compute += p1.spine_compute - p0.spine_compute;
        r->prof.lm_head += p1.lm_head - p0.lm_head;
        r->prof.total += p1.total - p0.total;
        r->decode_s += res.decode_s;
        r->passes += res.passes;
        r->drafted += res.drafted;
        r->accepted += res.accepted;
        for (size_t j = 0; j < res.ids.n; j++) tok_ids_push(&r->tokens, res.ids.v[j]);
        r->prompts++;
        tok_ids_free(&res.ids);
        tok_ids_free(&ids);
    }
    free(logits);
    spec_free(sp);
    tokenizer_free(tok);
    for (int i = 0; texts && i < n_texts; i++) free(texts[i]);
    free(texts);
    return rc;
}
