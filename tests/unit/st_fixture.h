/* st_fixture.h — helpers for storage tests: write small safetensors files (valid or hand-broken), text
 * files and temp folders, so tests need nothing but C. */
#ifndef DF_ST_FIXTURE_H
#define DF_ST_FIXTURE_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/st_write.h"

typedef struct fx_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t bytes;
} fx_tensor;

static inline void fx_write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static inline void fx_write_text(const char *dir, const char *name, const char *text) {
    fx_write_file(dir, name, text, strlen(text));
}

/* A file of an explicit header (length field = hlen, normally strlen(header)) and data region. */
static inline void fx_write_raw(const char *dir, const char *name, uint64_t hlen, const char *header, const void *data,
                         size_t dlen) {
    size_t hl = strlen(header), n = 8 + hl + dlen;
    uint8_t *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (dlen) memcpy(buf + 8 + hl, data, dlen);
    fx_write_file(dir, name, buf, n);
    free(buf);
}

/* A valid file of the tensors, laid out back to back in the given order by the library's writer (st_write.h),
 * the data region starting at a multiple of 8. Returns the header length; offs (if given) receives each
 * tensor's absolute offset. */
static inline uint64_t fx_write_st(const char *dir, const char *name, const fx_tensor *ts, int n, uint64_t *offs) {
    st_write_tensor *wt = calloc((size_t)n + 1, sizeof *wt);
    const void **data = calloc((size_t)n + 1, sizeof *data);
    for (int i = 0; i < n; i++) {
        wt[i] = (st_write_tensor){.name = ts[i].name, .dtype = ts[i].dtype, .ndim = ts[i].ndim, .bytes = ts[i].bytes};
        memcpy(wt[i].shape, ts[i].shape, sizeof ts[i].shape);
        data[i] = ts[i].data;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint8_t *head;
    size_t hlen;
    uint64_t *rel = calloc((size_t)n + 1, sizeof *rel);
    df_error err;
    if (st_write_header(wt, n, meta, 8, &head, &hlen, rel, NULL, &err) ||
        st_write_file(path, wt, data, n, meta, 8, &err)) {
        fprintf(stderr, "fixture %s: %s\n", path, err.msg);
        exit(2);
    }
    for (int i = 0; offs && i < n; i++) offs[i] = hlen + rel[i];
    free(head);
    free(rel);
    free(data);
    free(wt);
    return hlen - 8;
}

static inline void fx_mkdir(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "/tmp/df_%s_XXXXXX", dir);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(2);
    }
}

static inline int fx_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static inline void fx_rmtree(const char *dir) { nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Deterministic filler bytes. */
static inline void fx_fill(void *p, size_t n, uint32_t seed) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

#endif
