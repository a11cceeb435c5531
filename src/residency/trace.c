/* trace.c — routing traces (see trace.h): a line-buffered text writer behind a mutex, and a validating
 * reader that flattens records into cache keys. */
#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define RTRACE_MAGIC "deltafin-routing-trace 1"
#define RTRACE_MAX_LAYERS 4096
#define RTRACE_MAX_EXPERTS 65536

struct rtrace_writer {
    pthread_mutex_t mu;
    FILE *f;
    char *path;
    int n_layers;
    int failed;
};

int rtrace_writer_open(rtrace_writer **out, const char *path, int n_layers, const int *n_experts, df_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "a");
    if (!f) return df_error_set(err, DF_EIO, "%s: cannot open the routing trace: %s", path, strerror(errno)), DF_EIO;
    rtrace_writer *w = xcalloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->f = f;
    w->path = xstrdup(path);
    w->n_layers = n_layers;
    fprintf(f, RTRACE_MAGIC "\nexperts");
    for (int l = 0; l < n_layers; l++) fprintf(f, " %d", n_experts[l]);
    if (fprintf(f, "\n") < 0) w->failed = errno ? errno : EIO;
    *out = w;
    return DF_OK;
}

int rtrace_writer_record(rtrace_writer *w, int layer, const int *ids, int n, df_error *err) {
    pthread_mutex_lock(&w->mu);
    errno = 0;
    int rc = fprintf(w->f, "%d", layer);
    for (int i = 0; i < n && rc >= 0; i++) rc = fprintf(w->f, " %d", ids[i]);
    if (rc >= 0) rc = fputc('\n', w->f);
    if (rc >= 0) rc = fflush(w->f);
    if (rc < 0 && !w->failed) w->failed = errno ? errno : EIO;
    int failed = w->failed;
    pthread_mutex_unlock(&w->mu);
    if (!failed) return DF_OK;
    return df_error_set(err, DF_EIO, "%s: writing the routing trace failed: %s", w->path, strerror(failed)), DF_EIO;
}

int rtrace_writer_close(rtrace_writer *w, df_error *err) {
    if (!w) return DF_OK;
    int failed = w->failed;
    if (fclose(w->f) && !failed) failed = errno ? errno : EIO;
    int rc = DF_OK;
    if (failed) rc = DF_EIO, df_error_set(err, DF_EIO, "%s: writing the routing trace failed: %s", w->path, strerror(failed));
    pthread_mutex_destroy(&w->mu);
    free(w->path);
    free(w);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------------------------- */

/* Parses the "experts ..." header line into t (first header) or checks it against t (later ones). */
static int rtrace_header(rtrace *t, char *line, const char *path, long lineno, df_error *err) {
    if (strncmp(line, "experts", 7))
        return df_error_set(err, DF_EFORMAT, "%s:%ld: expected an 'experts' line after the header", path, lineno),
               DF_EFORMAT;
    int n = 0, cap = 16, *e = xmalloc(sizeof *e * (size_t)cap);
    char *p = line + 7, *end;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p || *p == '\n') break;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > RTRACE_MAX_EXPERTS || n >= RTRACE_MAX_LAYERS) {
            free(e);
            return df_error_set(err, DF_EFORMAT, "%s:%ld: bad expert count in the header", path, lineno), DF_EFORMAT;
        }
        if (n == cap) e = xrealloc(e, sizeof *e * (size_t)(cap *= 2));
        e[n++] = (int)v;
        p = end;
    }
    if (!n) {
        free(e);
        return df_error_set(err, DF_EFORMAT, "%s:%ld: the header names no layers", path, lineno), DF_EFORMAT;
    }
    if (t->n_experts) {
        int same = n == t->n_layers && !memcmp(e, t->n_experts, sizeof *e * (size_t)n);
        free(e);
        return same ? DF_OK
                    : (df_error_set(err, DF_EFORMAT, "%s:%ld: this run's header describes another model than the "
                                    "first one", path, lineno), DF_EFORMAT);
    }
    t->n_layers = n;
    t->n_experts = e;
    t->base = xcalloc((size_t)n + 1, sizeof *t->base);
    for (int l = 0; l < n; l++) t->base[l + 1] = t->base[l] + e[l];
    return DF_OK;
}

static int rtrace_record(rtrace *t, int64_t *cap, int64_t *rcap, char *line, const char *path, long lineno,
                         df_error *err) {
    char *p = line, *end;
    errno = 0;
    long layer = strtol(p, &end, 10);
    if (end == p || errno || layer < 0 || layer >= t->n_layers || !t->n_experts[layer])
        return df_error_set(err, DF_EFORMAT, "%s:%ld: bad layer (the model has %d layers)", path, lineno,
                            t->n_layers), DF_EFORMAT;
    p = end;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p || *p == '\n') break;
        errno = 0;
        long e = strtol(p, &end, 10);
        if (end == p || errno || e < 0 || e >= t->n_experts[layer])
            return df_error_set(err, DF_EFORMAT, "%s:%ld: bad expert id for layer %ld (%d experts)", path, lineno,
                                layer, t->n_experts[layer]), DF_EFORMAT;
        if (t->n_access == *cap) t->keys = xrealloc(t->keys, sizeof *t->keys * (size_t)(*cap = *cap ? 2 * *cap : 4096));
        t->keys[t->n_access++] = t->base[layer] + e;
        p = end;
    }
    if (t->n_records + 2 > *rcap) t->rec = xrealloc(t->rec, sizeof *t->rec * (size_t)(*rcap = 2 * *rcap + 1024));
    t->rec[++t->n_records] = t->n_access;
    return DF_OK;
}

int rtrace_read(rtrace *t, const char *path, df_error *err) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) return df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno)), DF_EIO;
    char *line = NULL;
    size_t lcap = 0;
    int64_t cap = 0, rcap = 1024;
    t->rec = xcalloc((size_t)rcap, sizeof *t->rec);
    long lineno = 0;
    int rc = DF_OK, want_header = 0;
    while (!rc && getline(&line, &lcap, f) >= 0) {
        lineno++;
        if (!strncmp(line, RTRACE_MAGIC, strlen(RTRACE_MAGIC))) want_header = 1;
        else if (want_header) rc = rtrace_header(t, line, path, lineno, err), want_header = 0;
        else if (!t->n_experts) rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "%s:%ld: not a routing trace (no '"
                                                              RTRACE_MAGIC "' header)", path, lineno);
        else rc = rtrace_record(t, &cap, &rcap, line, path, lineno, err);
    }
    if (!rc && ferror(f)) rc = DF_EIO, df_error_set(err, DF_EIO, "%s: read error", path);
    if (!rc && !t->n_experts) rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "%s: empty routing trace", path);
    free(line);
    fclose(f);
    if (rc) rtrace_free(t);
    return rc;
}

void rtrace_free(rtrace *t) {
    free(t->n_experts);
    free(t->base);
    free(t->keys);
    free(t->rec);
    memset(t, 0, sizeof *t);
}
