/* spine_warm.c — the mapped spine read ahead of the model (spine_warm.h). The ranges are cut into chunks; the
 * thread maps one chunk at a time (MADV_POPULATE_READ, which waits for its reads) while the WARM_AHEAD chunks
 * after it are asked for (MADV_WILLNEED starts their reads without waiting), so the disk always has work queued
 * but the queue stays short enough for an expert read the model issues meanwhile to get its turn. Kernels
 * before 5.14 lack MADV_POPULATE_READ: the chunks are then only asked for, and the model's faults find them
 * read or in flight. */
#include "spine_warm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/util.h"

#define WARM_CHUNK ((size_t)16 << 20)
#define WARM_AHEAD 4

struct spine_warm {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    warm_range *chunk;   /* page-aligned pieces of the ranges, in order */
    int n;
    atomic_int stop;
    int finished;
    atomic_uint_fast64_t done;
};

static void *warm_main(void *arg) {
    spine_warm *w = arg;
    int asked = 0, populate = 1;
    for (int i = 0; i < w->n && !atomic_load(&w->stop); i++) {
        for (; asked < w->n && asked <= i + WARM_AHEAD; asked++)
            madvise((void *)w->chunk[asked].p, w->chunk[asked].n, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
        if (populate && madvise((void *)w->chunk[i].p, w->chunk[i].n, MADV_POPULATE_READ)) populate = 0;
#else
        populate = 0;
#endif
        atomic_fetch_add(&w->done, w->chunk[i].n);
    }
    pthread_mutex_lock(&w->mu);
    w->finished = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Cuts the ranges into page-aligned chunks of at most WARM_CHUNK. */
static int warm_cut(const warm_range *r, int n, warm_range **out) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t cap = 0;
    for (int i = 0; i < n; i++) cap += r[i].n / WARM_CHUNK + 2;
    warm_range *c = xmalloc(sizeof *c * (cap ? cap : 1));
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].p || !r[i].n) continue;
        uintptr_t a = (uintptr_t)r[i].p & ~(page - 1), end = ((uintptr_t)r[i].p + r[i].n + page - 1) & ~(page - 1);
        for (; a < end; a += WARM_CHUNK) c[k++] = (warm_range){(const uint8_t *)a, DF_MIN(WARM_CHUNK, end - a)};
    }
    *out = c;
    return k;
}

spine_warm *spine_warm_start(const warm_range *r, int n) {
    spine_warm *w = xcalloc(1, sizeof *w);
    w->n = warm_cut(r, n, &w->chunk);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (!w->n || pthread_create(&w->thread, NULL, warm_main, w)) {
        w->n = 0;
        spine_warm_free(w);
        return NULL;
    }
    return w;
}

void spine_warm_wait(spine_warm *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    while (!w->finished) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

uint64_t spine_warm_done(spine_warm *w) { return w ? atomic_load(&w->done) : 0; }

void spine_warm_free(spine_warm *w) {
    if (!w) return;
    if (w->n) {
        atomic_store(&w->stop, 1);
        pthread_join(w->thread, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->chunk);
    free(w);
}
