/* pool.c — the kernels' thread pool: n-1 pthread workers started once, woken per job; the calling thread
 * works too.
 *
 * A job is published as one 64-bit ticket (job number, task count, next task), and a task is claimed by a
 * compare-and-swap on it, so a worker only ever runs tasks of the job whose ticket it claimed from, and the
 * caller waits for tasks to be finished, not for workers to check in: a worker that is asleep or descheduled
 * (an oversubscribed machine) costs nothing when the others take its share. Workers spin briefly before
 * sleeping because decode issues thousands of small matmuls per token and a futex wake-up per call would
 * dominate them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "kernels.h"
#include "common/util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

enum { POOL_SPIN = 20000 };   /* pause loops before sleeping: well under a millisecond */

/* ticket = job (16 bits) | n_tasks (24 bits) | next (24 bits) */
#define TICKET_JOB(t) ((uint32_t)((t) >> 48))
#define TICKET_N(t) ((uint32_t)((t) >> 24) & 0xffffffu)
#define TICKET_NEXT(t) ((uint32_t)(t) & 0xffffffu)

typedef struct {
    df_pool *pool;
    int index;   /* thread index: the caller is 0, workers 1..n-1 */
} pool_worker;

struct df_pool {
    int n_threads;
    pthread_t *threads;
    pool_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    _Atomic uint64_t ticket;
    atomic_int done;       /* tasks of the current job finished */
    atomic_int busy;       /* a job is in flight: nested calls run inline */
    atomic_int sleepers;   /* workers asleep on cv_start */
    atomic_int waiting;    /* the caller is asleep on cv_done */
    atomic_int stop;
    uint32_t job;          /* caller-side job counter */
    void (*fn)(void *ctx, int task, int thread);
    void *ctx;
};

/* Claims and runs tasks of the current job until none are left; returns the job number it saw last. */
static uint32_t pool_work(df_pool *p, int thread) {
    uint64_t t = atomic_load(&p->ticket);
    for (;;) {
        if (TICKET_NEXT(t) >= TICKET_N(t)) return TICKET_JOB(t);
        if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1)) continue;
        int n = (int)TICKET_N(t);
        p->fn(p->ctx, (int)TICKET_NEXT(t), thread);
        if (atomic_fetch_add(&p->done, 1) + 1 == n && atomic_load(&p->waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
        t = atomic_load(&p->ticket);
    }
}

static void *pool_main(void *arg) {
    pool_worker *w = arg;
    df_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && TICKET_JOB(atomic_load_explicit(&p->ticket, memory_order_relaxed)) == seen; i++)
            cpu_relax();
        if (TICKET_JOB(atomic_load(&p->ticket)) == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (TICKET_JOB(atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = pool_work(p, w->index);
    }
}

df_pool *pool_new(int n_threads) {
    df_pool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads > 0 ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->waiting, 0);
    atomic_init(&p->stop, 0);
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
    atomic_store(&p->stop, 1);
    atomic_store(&p->ticket, (uint64_t)((p->job + 1) & 0xffff) << 48);   /* wakes the spinners */
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
    DF_ASSERT(n_tasks >= 0 && n_tasks < (1 << 24));
    if (atomic_exchange(&p->busy, 1)) return -1;
    p->fn = fn;
    p->ctx = ctx;
    p->job = (p->job + 1) & 0xffff;
    atomic_store(&p->done, 0);
    atomic_store(&p->ticket, (uint64_t)p->job << 48 | (uint64_t)n_tasks << 24);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    pool_work(p, 0);
    for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++)
        cpu_relax();
    if (atomic_load(&p->done) < n_tasks) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->waiting, 1);
        while (atomic_load(&p->done) < n_tasks) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->waiting, 0);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store(&p->busy, 0);
    return 0;
}

int pool_busy(df_pool *p) { return atomic_load(&p->busy); }
