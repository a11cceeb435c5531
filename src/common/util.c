/* util.c — die-on-OOM allocation, errors, timing and whole-file reads shared by every module. */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void df_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("deltafin: fatal: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) df_die("out of memory (%zu bytes)", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) df_die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) df_die("out of memory (%zu bytes)", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void *xaligned_alloc(size_t align, size_t n) {
    void *p = NULL;
    size_t sz = (n + align - 1) / align * align;
    if (posix_memalign(&p, align, sz ? sz : align)) df_die("out of memory (%zu aligned bytes)", n);
    memset(p, 0, sz ? sz : align);
    return p;
}

void df_error_set(df_error *err, int code, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

double df_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

char *df_read_file(const char *path, size_t *len, df_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) {
            if (ferror(f)) {
                df_error_set(err, DF_EIO, "%s: read error", path);
                fclose(f);
                free(buf);
                return NULL;
            }
            break;
        }
        cap *= 2;
        buf = xrealloc(buf, cap);
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *df_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}
