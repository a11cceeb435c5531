/* cache.c — the expert slot bank (see cache.h). One mutex guards the table; reads run outside it. Victim
 * search is a linear scan, which is cheap next to a 17 MB read for banks of hundreds of slots. */
#include "cache.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/util.h"
#include "policy.h"

enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY, SLOT_ERROR };

typedef struct ec_slot {
    ecache *c;
    int layer, e;
    int state;
    int pins;
    int wanted;          /* prefetched, not yet acquired */
    int warm;            /* read by warming (the next warming read starts when it ends) */
    int guessed;         /* read for a look-ahead hint, not asked for since */
    uint8_t *mem;
    df_expert view;
    df_error err;
} ec_slot;

struct ecache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_layers;
    int64_t *base;       /* first key of each layer */
    int *map;            /* key -> slot or -1 */
    int n_slots;
    size_t slot_bytes;
    uint8_t *mem;
    ec_slot *slots;
    io_pool *pool;
    ecache_load_fn load;
    void *ctx;
    int pq_layer, pq_n, pq_next;
    int pq_requested;    /* the policy has seen the request for pq_ids[pq_next] */
    int *pq_ids;
    int pq_cap;
    int loading;
    uint8_t *hinted;     /* key -> 1 + its rank in the layer's last hint (0: not named) */
    uint8_t *hint_layer; /* layer -> has a hint not yet matched by a prefetch */
    ecache_hint_stats *lh; /* per layer */
    policy *pol;         /* which ready slot to evict (policy.c) */
    int64_t *warm_keys;  /* experts to warm, hottest first; read one at a time into empty slots */
    int warm_n, warm_next, warm_busy;
    ecache_stats st;
    pthread_t populate;  /* faults the bank's pages in ahead of use (ec_populate) */
    pthread_cond_t populate_cv;   /* signalled when bound_hi grows or the bank is freed */
    int populating;      /* the thread was started */
    int populate_stop;
    int bound_hi;        /* slots [0, bound_hi) have been bound at least once */
    int populate_ahead;  /* slots the thread keeps faulted in beyond bound_hi */
    int populate_all;    /* fault in the whole bank now (ecache_populate_wait) */
    int populate_done;   /* the thread has finished */
    double last_use;     /* when the model last asked for an expert, or the bank was made (df_now) */
};

/* Faulting pages in holds the process's memory-map lock, and a thread that maps or unmaps memory (malloc of a
 * large block, a session's state) waits for it and makes every page fault queue behind it: 64 MiB at a time,
 * zeroed at this VM's 1-3 GB/s, stalled opening a session for seconds while the bank was faulted in. */
#define EC_POPULATE_CHUNK ((size_t)2 << 20)
/* Seconds without a request after which the model counts as idle (a server between requests, a benchmark's disk
 * probe, the time before the first prompt) and the whole bank is faulted in. */
#define EC_QUIET_S 0.25

/* A fresh anonymous page costs the kernel a zeroing on first touch (in this VM about a second per GB), and the
 * first touch of a slot is the read into it: on the I/O path, in the middle of a token. A background thread at
 * idle CPU priority faults the bank in ahead of use: while the model is busy, only a bounded distance ahead
 * of the highest slot bound so far (empty slots are taken lowest first), since zeroing the whole bank while a
 * prompt runs made an 8-token run's prompt take three times as long; while it is idle, all of it.
 * MADV_POPULATE_WRITE leaves pages already in place untouched, so it is safe beside reads that have started;
 * where the kernel lacks it (before 5.14) pages fault in on use. */
static void *ec_populate(void *arg) {
    ecache *c = arg;
    size_t done = 0, n = (size_t)c->n_slots, per = DF_MAX((size_t)1, EC_POPULATE_CHUNK / c->slot_bytes);
#ifdef SCHED_IDLE
    struct sched_param idle = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
#endif
    pthread_mutex_lock(&c->mu);
    while (!c->populate_stop && done < n) {
        double quiet = df_now() - c->last_use;
        size_t want = c->populate_all || quiet >= EC_QUIET_S
                          ? n : (size_t)DF_MIN((int64_t)n, (int64_t)c->bound_hi + c->populate_ahead);
        if (done >= want) {   /* until more slots are bound, or the model has been idle long enough */
            struct timespec until = df_deadline(CLOCK_MONOTONIC, EC_QUIET_S - quiet + 1e-3);
            pthread_cond_timedwait(&c->populate_cv, &c->mu, &until);
            continue;
        }
        size_t end = DF_MIN(want, done + per);
        pthread_mutex_unlock(&c->mu);
        int rc = madvise(c->mem + done * c->slot_bytes, (end - done) * c->slot_bytes, MADV_POPULATE_WRITE);
        pthread_mutex_lock(&c->mu);
        if (rc) break;
        done = end;
        c->st.populated_slots = (int)done;
    }
    c->populate_done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int64_t ec_key(const ecache *c, int layer, int e) { return c->base[layer] + e; }

ecache *ecache_new(int n_layers, const int *n_experts, int n_slots, size_t slot_bytes, size_t populate_ahead,
                   io_pool *pool, ecache_load_fn load, void *ctx) {
    DF_ASSERT(n_slots > 0 && slot_bytes % IO_ALIGN == 0);
    ecache *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->n_layers = n_layers;
    c->base = xcalloc((size_t)n_layers + 1, sizeof *c->base);
    for (int l = 0; l < n_layers; l++) c->base[l + 1] = c->base[l] + n_experts[l];
    c->map = xmalloc(sizeof *c->map * (size_t)(c->base[n_layers] + 1));
    for (int64_t k = 0; k <= c->base[n_layers]; k++) c->map[k] = -1;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    c->mem = io_mem_alloc((size_t)n_slots * slot_bytes);
    c->slots = xcalloc((size_t)n_slots, sizeof *c->slots);
    for (int i = 0; i < n_slots; i++)
        c->slots[i] = (ec_slot){.c = c, .layer = -1, .e = -1, .mem = c->mem + (size_t)i * slot_bytes};
    c->hinted = xcalloc((size_t)c->base[n_layers] + 1, 1);
    c->hint_layer = xcalloc((size_t)n_layers + 1, 1);
    c->lh = xcalloc((size_t)n_layers + 1, sizeof *c->lh);
    c->pool = pool;
    c->load = load;
    c->ctx = ctx;
    c->st.slots = n_slots;
    c->st.slot_bytes = slot_bytes;
    c->pol = policy_new(POLICY_DEFAULT, n_slots, n_layers, c->base);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->populate_cv, &ca);
    pthread_condattr_destroy(&ca);
    c->last_use = df_now();
    c->populate_ahead = (int)DF_MIN((size_t)n_slots, DF_MAX((size_t)1, populate_ahead / slot_bytes));
    c->populating = !pthread_create(&c->populate, NULL, ec_populate, c);
    return c;
}

void ecache_free(ecache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->populate_stop = 1;
    pthread_cond_broadcast(&c->populate_cv);
    pthread_mutex_unlock(&c->mu);
    if (c->populating) pthread_join(c->populate, NULL);
    pthread_mutex_lock(&c->mu);
    c->warm_n = c->warm_next;   /* no further warming reads */
    while (c->loading) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    free(c->warm_keys);
    io_mem_free(c->mem, (size_t)c->n_slots * c->slot_bytes);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->populate_cv);
    free(c->slots);
    free(c->map);
    free(c->base);
    free(c->pq_ids);
    free(c->hinted);
    free(c->hint_layer);
    free(c->lh);
    policy_free(c->pol);
    free(c);
}

typedef struct ec_victim_ctx {
    const ecache *c;
    int any_wanted;
} ec_victim_ctx;

static int ec_may_go(const void *ctx, int i) {
    const ec_victim_ctx *v = ctx;
    const ecache *c = v->c;
    const ec_slot *s = &c->slots[i];
    if (s->state == SLOT_LOADING || s->pins || (s->wanted && !v->any_wanted)) return 0;
    if (v->any_wanted || s->layer != c->pq_layer) return 1;
    for (int j = c->pq_next; j < c->pq_n; j++)   /* named by the prefetch list, not yet reached */
        if (c->pq_ids[j] == s->e) return 0;
    return 1;
}

/* The slot to reuse: empty first, then the one the replacement policy picks among those free to go; -1 if
 * none. With any_wanted, prefetched-but-unused experts may go too (a request outside the prefetch list must
 * progress). */
static int ec_victim(const ecache *c, int any_wanted) {
    ec_victim_ctx v = {c, any_wanted};
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].state == SLOT_EMPTY && ec_may_go(&v, i)) return i;
    return policy_victim(c->pol, ec_may_go, &v);
}

static void ec_unbind(ecache *c, ec_slot *s) {
    if (s->layer >= 0) policy_clear(c->pol, (int)(s - c->slots));
    if (s->layer >= 0) c->map[ec_key(c, s->layer, s->e)] = -1;
    s->layer = s->e = -1;
    s->state = SLOT_EMPTY;
    s->wanted = 0;
}

static ec_slot *ec_bind(ecache *c, int i, int layer, int e) {
    ec_slot *s = &c->slots[i];
    if (s->state == SLOT_READY) c->st.evictions++;
    ec_unbind(c, s);
    s->layer = layer;
    s->e = e;
    s->guessed = 0;
    s->state = SLOT_LOADING;
    c->map[ec_key(c, layer, e)] = i;
    policy_fill(c->pol, i, ec_key(c, layer, e));
    c->st.loads++;
    c->loading++;
    if (i >= c->bound_hi) {
        c->bound_hi = i + 1;
        pthread_cond_signal(&c->populate_cv);
    }
    return s;
}

/* Lock held. A request served by a slot already holding the expert; hits owed to look-ahead are counted apart
 * too, so the hit rate the cache would have without it can be told. */
static void ec_hit(ecache *c, ec_slot *s) {
    c->st.hits++;
    c->st.lookahead_hits += s->guessed != 0;
    s->guessed = 0;
}

/* Lock held. Records the outcome of a read and wakes waiters. */
static void ec_finish(ecache *c, ec_slot *s, int rc) {
    s->state = rc ? SLOT_ERROR : SLOT_READY;
    policy_touch(c->pol, (int)(s - c->slots));
    c->loading--;
    pthread_cond_broadcast(&c->cv);
}

static void ec_warm_next(ecache *c);

static void ec_load_job(void *arg) {
    ec_slot *s = arg;
    ecache *c = s->c;
    df_error err = {0};
    int rc = c->load(c->ctx, s->layer, s->e, s->mem, &s->view, &err);
    pthread_mutex_lock(&c->mu);
    s->err = err;
    if (s->warm) {
        s->warm = 0;
        c->warm_busy = 0;
        if (rc) ec_unbind(c, s), c->loading--, pthread_cond_broadcast(&c->cv);   /* a failed guess is forgotten */
        else ec_finish(c, s, rc);
        ec_warm_next(c);
    } else {
        ec_finish(c, s, rc);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Lock held. Starts the next warming read into an empty slot, if one is left and warming is not done. */
static void ec_warm_next(ecache *c) {
    while (!c->warm_busy && c->warm_next < c->warm_n) {
        int64_t key = c->warm_keys[c->warm_next++];
        if (c->map[key] >= 0) continue;
        int v = -1;
        for (int i = 0; i < c->n_slots && v < 0; i++)
            if (c->slots[i].state == SLOT_EMPTY) v = i;
        if (v < 0) {
            c->warm_next = c->warm_n;   /* the bank is full: warming is over */
            break;
        }
        int layer = 0;
        while (key >= c->base[layer + 1]) layer++;
        ec_slot *s = ec_bind(c, v, layer, (int)(key - c->base[layer]));
        s->warm = 1;
        c->warm_busy = 1;
        c->st.warm_loads++;
        io_pool_submit(c->pool, IO_PRIO_GUESS, ec_load_job, s);
    }
    if (!c->warm_busy) pthread_cond_broadcast(&c->cv);
}

/* Lock held. Starts reads for the prefetch list as far as free slots allow. */
static void ec_top_up(ecache *c) {
    while (c->pq_next < c->pq_n) {
        int e = c->pq_ids[c->pq_next];
        int i = c->map[ec_key(c, c->pq_layer, e)];
        if (!c->pq_requested) policy_request(c->pol, ec_key(c, c->pq_layer, e));
        c->pq_requested = 1;
        if (i >= 0) {
            if (!c->slots[i].wanted && c->slots[i].state != SLOT_ERROR) ec_hit(c, &c->slots[i]);
            c->slots[i].wanted = 1;
            c->pq_next++;
            c->pq_requested = 0;
            continue;
        }
        int v = ec_victim(c, 0);
        if (v < 0) break;
        ec_slot *s = ec_bind(c, v, c->pq_layer, e);
        s->wanted = 1;
        c->st.misses++;
        c->pq_next++;
        c->pq_requested = 0;
        io_pool_submit(c->pool, IO_PRIO_HIGH, ec_load_job, s);
    }
}

/* Lock held. Scores a layer's hint against what the layer really asks for, then forgets it. */
static void ec_hint_score(ecache *c, int layer, const int *ids, int n) {
    if (!c->hint_layer[layer]) return;
    c->hint_layer[layer] = 0;
    c->lh[layer].scored++;
    c->st.lookahead_requests += (uint64_t)n;
    c->lh[layer].requests += (uint64_t)n;
    for (int i = 0; i < n; i++) {
        uint8_t named = c->hinted[ec_key(c, layer, ids[i])];
        if (!named) continue;
        c->st.lookahead_recalled++;
        c->lh[layer].recalled++;
        c->lh[layer].recalled_rank[named - 1]++;
    }
    for (int64_t k = c->base[layer]; k < c->base[layer + 1]; k++)
        if (c->hinted[k]) c->lh[layer].guessed_rank[c->hinted[k] - 1]++;
    memset(c->hinted + c->base[layer], 0, (size_t)(c->base[layer + 1] - c->base[layer]));
}

void ecache_hint(ecache *c, int layer, const int *ids, const int *rank, int n, int read_ranks) {
    pthread_mutex_lock(&c->mu);
    memset(c->hinted + c->base[layer], 0, (size_t)(c->base[layer + 1] - c->base[layer]));
    c->hint_layer[layer] = 1;
    for (int i = 0; i < n; i++) c->hinted[ec_key(c, layer, ids[i])] = (uint8_t)(1 + DF_MIN(rank[i], DF_LOOKAHEAD_RANKS - 1));
    c->lh[layer].read_hints += read_ranks > 0;
    for (int i = 0; i < n && rank[i] < read_ranks; i++) {
        if (c->map[ec_key(c, layer, ids[i])] >= 0) continue;
        int v = ec_victim(c, 0);
        if (v < 0) break;
        ec_slot *s = ec_bind(c, v, layer, ids[i]);
        s->guessed = 1;
        c->st.lookahead_loads++;
        c->lh[layer].loads++;
        io_pool_submit(c->pool, IO_PRIO_GUESS, ec_load_job, s);
    }
    pthread_mutex_unlock(&c->mu);
}

void ecache_prefetch(ecache *c, int layer, const int *ids, int n) {
    pthread_mutex_lock(&c->mu);
    c->last_use = df_now();
    ec_hint_score(c, layer, ids, n);
    c->lh[layer].passes++;
    for (int i = 0; i < c->n_slots; i++) c->slots[i].wanted = 0;
    if (n > c->pq_cap) {
        c->pq_cap = n;
        c->pq_ids = xrealloc(c->pq_ids, sizeof *c->pq_ids * (size_t)n);
    }
    memcpy(c->pq_ids, ids, sizeof *ids * (size_t)n);
    c->pq_layer = layer;
    c->pq_n = n;
    c->pq_next = 0;
    c->pq_requested = 0;
    ec_top_up(c);
    pthread_mutex_unlock(&c->mu);
}

int ecache_acquire(ecache *c, int layer, int e, df_expert *out, df_error *err) {
    pthread_mutex_lock(&c->mu);
    c->last_use = df_now();
    int waited = 0;
    {
        int i = c->map[ec_key(c, layer, e)];
        if (i < 0 || !c->slots[i].wanted) policy_request(c->pol, ec_key(c, layer, e));   /* not prefetched */
    }
    for (;;) {
        int i = c->map[ec_key(c, layer, e)];
        ec_slot *s = i >= 0 ? &c->slots[i] : NULL;
        if (s && s->state == SLOT_LOADING) {
            if (!waited++) c->st.waits++;
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        if (s && s->state == SLOT_ERROR) {
            int code = s->err.code;
            *err = s->err;
            ec_unbind(c, s);
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            return code;
        }
        if (s) {   /* ready */
            if (!s->wanted && !waited) ec_hit(c, s);
            s->wanted = s->guessed = 0;
            s->pins++;
            policy_touch(c->pol, i);
            *out = s->view;
            pthread_mutex_unlock(&c->mu);
            return DF_OK;
        }
        int v = ec_victim(c, 0);
        if (v < 0) v = ec_victim(c, 1);
        if (v < 0) {   /* every slot pinned or in flight: wait for a release */
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        s = ec_bind(c, v, layer, e);
        c->st.misses++;
        pthread_mutex_unlock(&c->mu);
        df_error lerr = {0};
        int rc = c->load(c->ctx, layer, e, s->mem, &s->view, &lerr);
        pthread_mutex_lock(&c->mu);
        s->err = lerr;
        ec_finish(c, s, rc);
        waited = 1;   /* counted as a miss; the loop hands out the result */
    }
}

int ecache_acquire_next(ecache *c, int layer, const int *ids, int n, uint8_t *done, int *which, df_expert *out,
                        df_error *err) {
    pthread_mutex_lock(&c->mu);
    c->last_use = df_now();
    int waited = 0;
    for (;;) {
        int loading = 0, unbound = -1;
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            int k = c->map[ec_key(c, layer, ids[i])];
            ec_slot *s = k >= 0 ? &c->slots[k] : NULL;
            if (!s) {
                if (unbound < 0) unbound = i;
                continue;
            }
            if (s->state == SLOT_LOADING) {
                loading++;
                continue;
            }
            done[i] = 1;
            *which = i;
            if (s->state == SLOT_ERROR) {
                int code = s->err.code;
                *err = s->err;
                ec_unbind(c, s);
                pthread_cond_broadcast(&c->cv);
                pthread_mutex_unlock(&c->mu);
                return code;
            }
            if (!s->wanted && !waited) ec_hit(c, s);
            s->wanted = s->guessed = 0;
            s->pins++;
            policy_touch(c->pol, k);
            *out = s->view;
            pthread_mutex_unlock(&c->mu);
            return DF_OK;
        }
        double t0 = df_now();
        if (!loading) {   /* nothing on its way (not prefetched, or evicted): read one here */
            pthread_mutex_unlock(&c->mu);
            DF_ASSERT(unbound >= 0);
            done[unbound] = 1;
            *which = unbound;
            int rc = ecache_acquire(c, layer, ids[unbound], out, err);
            pthread_mutex_lock(&c->mu);
            c->lh[layer].wait_s += df_now() - t0;
            pthread_mutex_unlock(&c->mu);
            return rc;
        }
        if (!waited++) c->st.waits++;
        pthread_cond_wait(&c->cv, &c->mu);
        c->lh[layer].wait_s += df_now() - t0;
    }
}

void ecache_release(ecache *c, int layer, int e) {
    pthread_mutex_lock(&c->mu);
    int i = c->map[ec_key(c, layer, e)];
    DF_ASSERT(i >= 0 && c->slots[i].pins > 0);
    c->slots[i].pins--;
    ec_top_up(c);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void ecache_hint_layer(ecache *c, int layer, ecache_hint_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->lh[layer];
    pthread_mutex_unlock(&c->mu);
}

void ecache_warm(ecache *c, int n, const int *layers, const int *ids, const float *heat) {
    pthread_mutex_lock(&c->mu);
    c->warm_keys = xrealloc(c->warm_keys, sizeof *c->warm_keys * ((size_t)n + 1));
    for (int i = 0; i < n; i++) {
        c->warm_keys[i] = ec_key(c, layers[i], ids[i]);
        policy_seed(c->pol, c->warm_keys[i], heat[i]);
    }
    c->warm_n = n;
    c->warm_next = 0;
    ec_warm_next(c);
    pthread_mutex_unlock(&c->mu);
}

void ecache_populate_wait(ecache *c) {
    pthread_mutex_lock(&c->mu);
    c->populate_all = 1;
    pthread_cond_broadcast(&c->populate_cv);
    while (c->populating && !c->populate_done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void ecache_warm_wait(ecache *c) {
    pthread_mutex_lock(&c->mu);
    while (c->warm_busy || c->warm_next < c->warm_n) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void ecache_set_policy(ecache *c, int kind) {
    pthread_mutex_lock(&c->mu);
    policy *p = policy_new(kind, c->n_slots, c->n_layers, c->base);
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].layer >= 0) policy_fill(p, i, ec_key(c, c->slots[i].layer, c->slots[i].e));
    policy_free(c->pol);
    c->pol = p;
    pthread_mutex_unlock(&c->mu);
}

void ecache_get_stats(ecache *c, ecache_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
