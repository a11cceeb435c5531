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

typedef struct fx_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t bytes;
} fx_tensor;

static void fx_write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static void fx_write_text(const char *dir, const char *name, const char *text) {
    fx_write_file(dir, name, text, strlen(text));
}

/* A file of an explicit header (length field = hlen, normally strlen(header)) and data region. */
static void fx_write_raw(const char *dir, const char *name, uint64_t hlen, const char *header, const void *data,
                         size_t dlen) {
    size_t hl = strlen(header), n = 8 + hl + dlen;
    uint8_t *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (dlen) memcpy(buf + 8 + hl, data, dlen);
    fx_write_file(dir, name, buf, n);
    free(buf);
}

/* A valid file of the tensors, laid out back to back in the given order; header padded with spaces to a
 * multiple of 8. Returns the header length; offs (if given) receives each tensor's absolute offset. */
static uint64_t fx_write_st(const char *dir, const char *name, const fx_tensor *ts, int n, uint64_t *offs) {
    size_t cap = 256 + (size_t)n * 256, len = 0, dlen = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)ts[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", dlen, dlen + ts[i].bytes);
        dlen += ts[i].bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    h[len] = 0;
    uint8_t *data = malloc(dlen ? dlen : 1);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (offs) offs[i] = 8 + len + o;
        if (ts[i].bytes) memcpy(data + o, ts[i].data, ts[i].bytes);
        o += ts[i].bytes;
    }
    fx_write_raw(dir, name, len, h, data, dlen);
    free(data);
    free(h);
    return len;
}

static void fx_mkdir(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "/tmp/df_%s_XXXXXX", dir);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(2);
    }
}

static int fx_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void fx_rmtree(const char *dir) { nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Deterministic filler bytes. */
static void fx_fill(void *p, size_t n, uint32_t seed) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

#endif
