/* pool.c — the kernels' thread pool: n-1 pthread workers started once, woken per call, tasks handed out by an
 * atomic counter; the calling thread works too. Workers spin briefly before sleeping on a condition variable,
 * because decode issues thousands of small matmuls per token and a futex wake per call would dominate them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "kernels.h"
#include "../common/util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

enum { POOL_SPIN = 20000 };   /* ~50-100 µs of pause before a worker sleeps */

typedef struct {
    df_pool *pool;
    int index;                /* thread index: the caller is 0, workers 1..n-1 */
} pool_worker;

struct df_pool {
    int n_threads;
    pthread_t *threads;
    pool_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_fast64_t gen;  /* bumped (under mu) to start a job */
    atomic_int busy;           /* a job is in flight: nested calls run inline */
    atomic_int next;           /* next task index to hand out */
    atomic_int active;         /* workers still in the current job */
    int stop;
    int n_tasks;
    void (*fn)(void *ctx, int task, int thread);
    void *ctx;
};

static void pool_work(df_pool *p, int thread) {
    int t;
    while ((t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->n_tasks)
        p->fn(p->ctx, t, thread);
}

static void *pool_main(void *arg) {
    pool_worker *w = arg;
    df_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->gen, memory_order_acquire) == seen; i++)
            cpu_relax();
        if (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (p->stop) return NULL;
        pool_work(p, w->index);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

df_pool *pool_new(int n_threads) {
    df_pool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads > 0 ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->active, 0);
    int nw = p->n_threads - 1;
    p->threads = xcalloc(nw > 0 ? nw : 1, sizeof *p->threads);
    p->workers = xcalloc(nw > 0 ? nw : 1, sizeof *p->workers);
    for (int i = 0; i < nw; i++) {
        p->workers[i] = (pool_worker){p, i + 1};
        if (pthread_create(&p->threads[i], NULL, pool_main, &p->workers[i]))
            df_die("pool: cannot start worker thread %d of %d", i + 1, nw);
    }
    return p;
}

void pool_free(df_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p->workers);
    free(p);
}

int pool_run(df_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int thread), void *ctx) {
    if (atomic_exchange_explicit(&p->busy, 1, memory_order_acquire)) return -1;
    int nw = p->n_threads - 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, nw, memory_order_relaxed);
    if (nw > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    pool_work(p, 0);
    for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->active, memory_order_acquire) > 0; i++)
        cpu_relax();
    if (atomic_load_explicit(&p->active, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->active, memory_order_acquire) > 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
    return 0;
}
