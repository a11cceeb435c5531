/* engine_fixture.h — helpers for tests that run the engine on model folders: the tests' usual engine
 * options, opening an engine, a fixture's prompt and the logits of every row of it, listing the fixtures (or
 * running a check on each), comparing logits, and a temp folder that links a model's files. */
#ifndef DF_ENGINE_FIXTURE_H
#define DF_ENGINE_FIXTURE_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deltafin.h"
#include "common/prompt.h"
#include "common/util.h"
#include "test.h"

/* Defaults on dir with the kernels isa (NULL = this CPU's best) and two threads. */
static inline void ef_opts(df_engine_opts *o, const char *dir, const char *isa) {
    df_engine_opts_default(o);
    o->model_dir = dir;
    o->isa = isa;
    o->n_threads = 2;
}

/* An engine of ef_opts, or NULL with err set. */
static inline df_engine *ef_open(const char *dir, const char *isa, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, isa);
    df_engine *eng = NULL;
    return df_engine_open(&eng, &o, err) ? NULL : eng;
}

/* dir/prompt.json: prefill and decode tokens (caller frees both). */
static inline int ef_read_prompt(const char *dir, int32_t **pre, int *np, int32_t **dec, int *nd, df_error *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/prompt.json", dir);
    return prompt_read_file(path, pre, np, dec, nd, err);
}

/* Every row of logits of pre (as one batch, or two split at `split` when 0 < split < np) then of each decode
 * token, on a fresh engine of o: (np + nd) x *V floats (caller frees), or NULL with err set. stats (if given)
 * receives the engine's counters after the run. */
static inline float *ef_logits(const df_engine_opts *o, const int32_t *pre, int np, int split, const int32_t *dec,
                               int nd, int *V, df_stats *stats, df_error *err) {
    df_engine *eng = NULL;
    df_session *s = NULL;
    float *got = NULL;
    int rc = df_engine_open(&eng, o, err);
    if (!rc) rc = df_session_init(&s, eng, err);
    if (!rc) {
        *V = df_engine_info(eng)->vocab_size;
        got = xmalloc((size_t)(np + nd) * *V * sizeof(float));
        if (split > 0 && split < np) {
            rc = df_session_eval(s, pre, split, got, 1, err);
            if (!rc) rc = df_session_eval(s, pre + split, np - split, got + (int64_t)split * *V, 1, err);
        } else {
            rc = df_session_eval(s, pre, np, got, 1, err);
        }
        for (int i = 0; !rc && i < nd; i++) rc = df_session_eval(s, dec + i, 1, got + (int64_t)(np + i) * *V, 1, err);
        if (stats) df_engine_stats(eng, stats);
    }
    df_session_free(s);
    df_engine_free(eng);
    if (rc) {
        free(got);
        return NULL;
    }
    return got;
}

/* max |a - b| / max(1, max |b|); a NaN difference counts as infinite. */
static inline float ef_rel_diff(const float *a, const float *b, int64_t n) {
    float m = 0.0f, scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
        if (fabsf(b[i]) > scale) scale = fabsf(b[i]);
    }
    return m / scale;
}

enum { EF_MAX_FIXTURES = 64 };

/* The folders under root that hold a file named marker, in directory order (at most EF_MAX_FIXTURES); -1 if
 * root cannot be read. */
static inline int ef_list_fixtures(const char *root, const char *marker, char names[][256]) {
    DIR *d = opendir(root);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < EF_MAX_FIXTURES) {
        char p[2048];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/%s", root, de->d_name, marker);
        if (de->d_name[0] != '.' && !stat(p, &sb)) snprintf(names[n++], 256, "%s", de->d_name);
    }
    closedir(d);
    return n;
}

/* A fixture's prompt.json. */
typedef struct ef_prompt {
    int32_t *pre, *dec;
    int np, nd;
} ef_prompt;

/* Runs fn on each folder under root that holds a file named marker, with its prompt read (a prompt that
 * cannot be read fails a check instead). Returns the number of folders, or -1 if root cannot be read. */
static inline int ef_each_fixture(const char *root, const char *marker,
                                  void (*fn)(const char *dir, const char *name, const ef_prompt *p)) {
    char names[EF_MAX_FIXTURES][256];
    int n = ef_list_fixtures(root, marker, names);
    for (int i = 0; i < n; i++) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        ef_prompt p = {0};
        df_error err = {0};
        if (ef_read_prompt(dir, &p.pre, &p.np, &p.dec, &p.nd, &err))
            CHECK(0, "%s: prompt: %s", names[i], err.msg);
        else
            fn(dir, names[i], &p);
        free(p.pre);
        free(p.dec);
    }
    return n;
}

/* Makes folder dst (its parent must exist) holding symbolic links to model folder src's config.json and
 * model.safetensors; 0 on success. */
static inline int ef_link_model(const char *dst, const char *src) {
    static const char *const files[] = {"config.json", "model.safetensors"};
    char cwd[1024];
    if (!getcwd(cwd, sizeof cwd) || (mkdir(dst, 0755) && access(dst, F_OK))) return -1;
    for (int i = 0; i < 2; i++) {
        char from[3200], to[2100];
        snprintf(from, sizeof from, "%s%s%s/%s", src[0] == '/' ? "" : cwd, src[0] == '/' ? "" : "/", src, files[i]);
        snprintf(to, sizeof to, "%s/%s", dst, files[i]);
        unlink(to);
        if (symlink(from, to)) return -1;
    }
    return 0;
}

#endif
