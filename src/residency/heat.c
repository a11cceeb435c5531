/* heat.c — per-expert heat (see heat.h): a float per expert, loaded and validated, counted under a mutex, and
 * saved through the disk cache's atomic writer. */
#include "heat.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "install/dcache.h"

#define HEAT_MAGIC "DFHEAT1\n"
/* What one earlier run's heat is worth at the next save: recent use counts more, old habits fade. */
#define HEAT_KEEP 0.75f

struct heat {
    pthread_mutex_t mu;
    int n_layers;
    int *n_experts;
    int64_t *base;
    float *old;          /* loaded from the file */
    float *now;          /* counted by this run */
    int recorded;        /* heat_add was called: a save has something new to write */
};

static uint64_t heat_fnv(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint32_t heat_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void heat_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Fills h->old from the file's bytes; a note and -1 when they are not a valid heat file for this model. */
static int heat_parse(heat *h, const uint8_t *b, size_t len, const char *path, char *note, size_t cap) {
    int64_t n = h->base[h->n_layers];
    size_t want = 8 + 4 + 4 * (size_t)h->n_layers + 4 * (size_t)n + 8;
    const char *why = NULL;
    if (len < 16 || memcmp(b, HEAT_MAGIC, 8)) why = "not a heat file";
    else if (heat_u32(b + 8) != (uint32_t)h->n_layers || len != want)
        why = "made for another model shape, or truncated";
    for (int l = 0; !why && l < h->n_layers; l++)
        if (heat_u32(b + 12 + 4 * (size_t)l) != (uint32_t)h->n_experts[l]) why = "made for another model shape";
    uint64_t sum = 0;
    if (!why) {
        for (int i = 0; i < 8; i++) sum |= (uint64_t)b[want - 8 + (size_t)i] << (8 * i);
        if (sum != heat_fnv(b, want - 8)) why = "checksum mismatch";
    }
    const uint8_t *w = b + 12 + 4 * (size_t)h->n_layers;
    for (int64_t k = 0; !why && k < n; k++) {
        uint32_t u = heat_u32(w + 4 * (size_t)k);
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f) || f < 0) why = "a heat value is negative or not finite";
        else h->old[k] = f;
    }
    if (!why) return 0;
    memset(h->old, 0, sizeof *h->old * (size_t)n);
    snprintf(note, cap, "%s: ignored (%s); heat starts afresh", path, why);
    return -1;
}

heat *heat_load(const char *dir, int n_layers, const int *n_experts, char *note, size_t note_cap) {
    heat *h = xcalloc(1, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    h->n_layers = n_layers;
    h->n_experts = xmalloc(sizeof *h->n_experts * (size_t)(n_layers + 1));
    h->base = xcalloc((size_t)n_layers + 1, sizeof *h->base);
    for (int l = 0; l < n_layers; l++) {
        h->n_experts[l] = n_experts[l];
        h->base[l + 1] = h->base[l] + n_experts[l];
    }
    size_t n = (size_t)h->base[n_layers] + 1;
    h->old = xcalloc(n, sizeof *h->old);
    h->now = xcalloc(n, sizeof *h->now);
    if (note_cap) note[0] = 0;
    char *path = df_path_join(dir, HEAT_FILE);
    if (access(path, F_OK) == 0) {   /* only a regular file of the expected size is read: a FIFO never blocks */
        size_t cap = 16 + 4 * (size_t)n_layers + 4 * n + 8, len = 0;
        df_error e = {0};
        uint8_t *b = (uint8_t *)df_read_file_max(path, cap, &len, &e);
        size_t pl = strlen(path);
        const char *why = strncmp(e.msg, path, pl) || strncmp(e.msg + pl, ": ", 2) ? e.msg : e.msg + pl + 2;
        if (!b) snprintf(note, note_cap, "%s: ignored (%s); heat starts afresh", path, why);
        else heat_parse(h, b, len, path, note, note_cap);
        free(b);
    }
    free(path);
    return h;
}

void heat_free(heat *h) {
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    free(h->n_experts);
    free(h->base);
    free(h->old);
    free(h->now);
    free(h);
}

void heat_add(heat *h, int layer, const int *ids, int n) {
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < n; i++) h->now[h->base[layer] + ids[i]] += 1.0f;
    h->recorded |= n > 0;
    pthread_mutex_unlock(&h->mu);
}

int heat_save(heat *h, const char *dir, df_error *err) {
    if (!h->recorded) return DF_OK;   /* a run that asked for nothing (deltafin warm) leaves the heat as it was */
    int64_t n = h->base[h->n_layers];
    size_t len = 8 + 4 + 4 * (size_t)h->n_layers + 4 * (size_t)n + 8;
    uint8_t *b = xmalloc(len);
    memcpy(b, HEAT_MAGIC, 8);
    heat_put_u32(b + 8, (uint32_t)h->n_layers);
    for (int l = 0; l < h->n_layers; l++) heat_put_u32(b + 12 + 4 * (size_t)l, (uint32_t)h->n_experts[l]);
    uint8_t *w = b + 12 + 4 * (size_t)h->n_layers;
    pthread_mutex_lock(&h->mu);
    for (int64_t k = 0; k < n; k++) {
        float f = h->old[k] * HEAT_KEEP + h->now[k];
        uint32_t u;
        memcpy(&u, &f, 4);
        heat_put_u32(w + 4 * (size_t)k, u);
    }
    pthread_mutex_unlock(&h->mu);
    uint64_t sum = heat_fnv(b, len - 8);
    for (int i = 0; i < 8; i++) b[len - 8 + (size_t)i] = (uint8_t)(sum >> (8 * i));
    char *folder = df_path_join(dir, ".deltafin"), *path = df_path_join(dir, HEAT_FILE);
    int rc = df_mkdir_p(folder, err);
    if (!rc) rc = dc_write_atomic(path, 0, b, len, err);
    free(folder);
    free(path);
    free(b);
    return rc;
}

typedef struct heat_entry {
    float w;
    int64_t key;
} heat_entry;

static int heat_cmp_desc(const void *a, const void *b) {
    const heat_entry *x = a, *y = b;
    return x->w < y->w ? 1 : x->w > y->w ? -1 : (x->key > y->key) - (x->key < y->key);
}

/* Every expert with heat, hottest first; *count set. Caller frees. */
static heat_entry *heat_sorted(const heat *h, int64_t *count, double *total) {
    int64_t n = h->base[h->n_layers], m = 0;
    heat_entry *v = xmalloc(sizeof *v * (size_t)(n + 1));
    *total = 0;
    for (int64_t k = 0; k < n; k++) {
        float w = h->old[k] * HEAT_KEEP + h->now[k];
        if (w > 0) v[m++] = (heat_entry){w, k}, *total += w;
    }
    qsort(v, (size_t)m, sizeof *v, heat_cmp_desc);
    *count = m;
    return v;
}

int heat_top(const heat *h, int max, int *layers, int *ids, float *weights) {
    int64_t m;
    double total;
    heat_entry *v = heat_sorted(h, &m, &total);
    int n = (int)DF_MIN((int64_t)max, m), l = 0;
    for (int i = 0; i < n; i++) {
        while (v[i].key >= h->base[l + 1]) l++;
        layers[i] = l;
        ids[i] = (int)(v[i].key - h->base[l]);
        weights[i] = v[i].w;
        l = 0;
    }
    free(v);
    return n;
}

void heat_summary(const heat *h, char *buf, size_t cap) {
    int64_t m;
    double total, top = 0;
    heat_entry *v = heat_sorted(h, &m, &total);
    int64_t n = h->base[h->n_layers], tenth = (n + 9) / 10;
    for (int64_t i = 0; i < DF_MIN(tenth, m); i++) top += v[i].w;
    if (!m) snprintf(buf, cap, "heat: none recorded yet (%s)", HEAT_FILE);
    else
        snprintf(buf, cap, "heat: %.0f requests (older runs decayed) over %lld of %lld experts; the hottest 10%% "
                 "(%lld) take %.1f%% of them", total, (long long)m, (long long)n, (long long)tenth, 100 * top / total);
    free(v);
}
