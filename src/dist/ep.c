/* ep.c — expert parallelism (ep.h): rank 0's side (greeting, assigning, dispatching a MoE layer's job, collecting
 * and checking the outputs group by group) and the other ranks' service loop (checking a job, computing their
 * share with the model's own expert code, answering). */
#include "ep.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define EP_VERSION 2
#define MAGIC_HELLO 0x4f4c4548u   /* "HELO" */
#define MAGIC_JOB 0x424f4a44u     /* "DJOB" */
#define MAGIC_REPLY 0x59504552u   /* "REPY" */
enum { KIND_WORK = 0, KIND_CLOSE = 1, KIND_STATS = 2, KIND_SPINE = 3, KIND_HINT = 4 };
/* A job's rows: a pass takes at most a few thousand; this bounds what a rank allocates for a message. */
#define EP_MAX_ROWS (1 << 16)
#define EP_MAX_MSG ((size_t)1 << 30)
/* Greeting: the others open their store before answering (heartbeats show they are alive meanwhile). */
#define EP_HELLO_TIMEOUT_S 600.0
/* A job's answer: the liveness timeout catches a lost rank; this only bounds a rank that is alive but stuck. */
#define EP_REPLY_TIMEOUT_S 600.0

typedef struct ep_hello {
    uint32_t magic, version;
    int32_t n_ranks, n_layers, Dz, topk, moe_inter, n_experts, spine_split, pad;
    uint64_t plan_sum;
    char isa[16];
} ep_hello;

typedef struct ep_hello_reply {
    uint32_t magic;
    int32_t status, cache_slots, pad;
    int64_t held, shared;
    uint64_t cache_bytes, spine_bytes;
    char host[64], folder[512], msg[1024];
} ep_hello_reply;

typedef struct ep_job_head {
    uint32_t magic, seq;
    int32_t kind, layer, T, k, Dz, n_uniq, n_groups, pad;
} ep_job_head;

/* A look-ahead guess of a layer's experts: n ids, then their n confidence ranks. No answer. */
typedef struct ep_hint_head {
    uint32_t magic, seq;
    int32_t kind, layer, n, pad;
} ep_hint_head;

/* Projections of a layer the receiving rank holds, all of one input: n ep_spine_mat, then x [T, cols]; the
 * answer is each one's [T, rows] floats in turn. */
#define EP_SPINE_MAX 8
typedef struct ep_spine_head {
    uint32_t magic, seq;
    int32_t kind, layer, T, cols, n, pad;
} ep_spine_head;

typedef struct ep_spine_mat {
    char key[64];
    int32_t rows, pad;
} ep_spine_mat;

typedef struct ep_reply_head {
    uint32_t magic, seq;
    int32_t kind, layer, group, status;
    int64_t n_floats;           /* floats that follow; with status != 0 the bytes of a message instead */
    double busy_s;              /* from the request's arrival to this reply's sending: the rank's own time */
} ep_reply_head;

typedef struct ep_stats_body {
    uint64_t expert_disk_bytes, expert_hits, expert_misses, lookahead_loads;
} ep_stats_body;

struct dist_ep {
    dist_comm *c;
    df_model *m;
    const rank_plan *plan;
    model_peers peers;
    uint32_t seq;
    ep_rank_info *info;
    dist_buf rx;
    uint8_t *tx;
    size_t tx_cap;
    int *to;                    /* ranks a job goes to */
    double *sent_at;            /* per rank: when the request being answered was sent */
    double link_wait;           /* of the time blocked on replies, what the messages' travel accounts for */
    unsigned *turn;             /* per layer: its passes so far (deals a replicated expert's passes over its holders) */
    atomic_int lost;
    char lost_msg[1024];
};

static void *tx_room(dist_ep *ep, size_t n) {
    if (n > ep->tx_cap) {
        free(ep->tx);
        ep->tx_cap = n + n / 2;
        ep->tx = xmalloc(ep->tx_cap);
    }
    return ep->tx;
}

/* The first loss is kept for /health; the job cannot go on without that rank. */
static int ep_lose(dist_ep *ep, df_error *err) {
    if (!atomic_load(&ep->lost)) {
        snprintf(ep->lost_msg, sizeof ep->lost_msg, "%s", err->msg);
        atomic_store(&ep->lost, 1);
    }
    comm_fail(ep->c);
    return err->code ? err->code : DF_EIO;
}

static int ep_check_alive(dist_ep *ep, df_error *err) {
    if (!atomic_load(&ep->lost)) return DF_OK;
    return df_error_set(err, DF_EIO, "expert parallelism stopped: %s", ep->lost_msg), DF_EIO;
}

/* Sends one buffer to several ranks. */
static int ep_send_to(dist_ep *ep, const int *to, int n, const void *buf, size_t len, int tag, df_error *err) {
    for (int i = 0; i < n; i++) {
        ep->sent_at[to[i]] = df_now();
        int rc = comm_send(ep->c, to[i], tag, buf, len, err);
        if (rc) return ep_lose(ep, err);
    }
    return DF_OK;
}

static void ep_assign(void *ctx, moe_job *job) {
    dist_ep *ep = ctx;
    rank_plan_assign(ep->plan, job->layer, job->uniq, job->rows, job->n_uniq, ep->turn[job->layer]++, job->rank);
}

static size_t job_bytes(int64_t T, int64_t k, int64_t Dz, int64_t n_uniq, int64_t n_groups) {
    return sizeof(ep_job_head) + (size_t)(2 * n_uniq + n_groups + T * k) * 4 + (size_t)(T * k + T * Dz) * 4;
}

static int ep_dispatch(void *ctx, const moe_job *job, df_error *err) {
    dist_ep *ep = ctx;
    int rc = ep_check_alive(ep, err), n_to = 0, N = comm_size(ep->c);
    if (rc) return rc;
    ep->seq++;
    for (int r = 1; r < N; r++) {
        int has = 0;
        for (int u = 0; u < job->n_uniq && !has; u++) has = job->rank[u] == r;
        if (has) ep->to[n_to++] = r;
    }
    if (!n_to) return DF_OK;
    int64_t Tk = (int64_t)job->T * job->k;
    size_t len = job_bytes(job->T, job->k, job->Dz, job->n_uniq, job->n_groups);
    uint8_t *b = tx_room(ep, len), *at = b + sizeof(ep_job_head);
    *(ep_job_head *)b = (ep_job_head){MAGIC_JOB, ep->seq, KIND_WORK, job->layer, job->T, job->k, job->Dz,
                                      job->n_uniq, job->n_groups, 0};
#define PUT(src, n) (memcpy(at, (src), (size_t)(n)*4), at += (size_t)(n)*4)
    PUT(job->uniq, job->n_uniq);
    PUT(job->rank, job->n_uniq);
    PUT(job->group_end, job->n_groups);
    PUT(job->ids, Tk);
    PUT(job->wts, Tk);
    PUT(job->z, (int64_t)job->T * job->Dz);
#undef PUT
    return ep_send_to(ep, ep->to, n_to, b, len, DIST_TAG_JOB, err);
}

/* The next reply from rank r for the job in progress: replies to an earlier job that failed part-way are
 * dropped; anything else out of order is a protocol error naming the rank. */
static int ep_recv_reply(dist_ep *ep, int r, int kind, int layer, int group, df_error *err) {
    int tag = kind == KIND_SPINE ? DIST_TAG_SPINE : DIST_TAG_REPLY;
    dist_counters c0, c1;
    comm_counters(ep->c, &c0);
    for (;;) {
        int rc = comm_recv(ep->c, r, tag, &ep->rx, EP_MAX_MSG, EP_REPLY_TIMEOUT_S, err);
        if (rc) return ep_lose(ep, err);
        const ep_reply_head *h = ep->rx.p;
        if (ep->rx.n < sizeof *h || h->magic != MAGIC_REPLY) {
            df_error_set(err, DF_EFORMAT, "rank %d (%s) sent a malformed reply (%zu bytes)", r, ep->info[r].host,
                         ep->rx.n);
            return ep_lose(ep, err);
        }
        if (h->seq != ep->seq && h->kind == KIND_WORK && (int32_t)(ep->seq - h->seq) > 0) continue;   /* stale */
        if (h->seq != ep->seq || h->kind != kind ||
            (kind != KIND_STATS && (h->layer != layer || h->group != group))) {
            df_error_set(err, DF_EFORMAT, "rank %d (%s) answered out of order (job %u kind %d layer %d group %d, "
                         "expected job %u kind %d layer %d group %d)", r, ep->info[r].host, h->seq, h->kind, h->layer,
                         h->group, ep->seq, kind, layer, group);
            return ep_lose(ep, err);
        }
        if (h->status) {   /* the rank is fine, this job failed there (an expert it could not read) */
            size_t n = ep->rx.n - sizeof *h;
            df_error_set(err, h->status < 0 && h->status >= DF_ECANCELLED ? h->status : DF_EIO, "rank %d (%s): %.*s", r,
                         ep->info[r].host, (int)DF_MIN(n, 900), (const char *)(h + 1));
            return err->code;
        }
        /* Blocked time beyond what rank r spent on the request is the messages' travel (both ways, latency and
         * bytes); the rest was rank r still working. Its figure is only trusted within the round trip. */
        comm_counters(ep->c, &c1);
        double trip = df_now() - ep->sent_at[r], own = isfinite(h->busy_s) ? DF_MAX(0.0, DF_MIN(h->busy_s, trip)) : 0;
        ep->link_wait += DF_MIN(c1.wait_s - c0.wait_s, trip - own);
        return DF_OK;
    }
}

double ep_link_wait(const dist_ep *ep) { return ep->link_wait; }

static int ep_collect(void *ctx, const moe_job *job, int g, float *const *out, df_error *err) {
    dist_ep *ep = ctx;
    int N = comm_size(ep->c), g0 = g ? job->group_end[g - 1] : 0, g1 = job->group_end[g];
    for (int r = 1; r < N; r++) {
        int64_t want = 0;
        for (int u = g0; u < g1; u++)
            if (job->rank[u] == r) want += (int64_t)job->rows[u] * job->Dz;
        if (!want) continue;
        int rc = ep_recv_reply(ep, r, KIND_WORK, job->layer, g, err);
        if (rc) return rc;
        const ep_reply_head *h = ep->rx.p;
        if (h->n_floats != want || ep->rx.n != sizeof *h + (size_t)want * 4) {
            df_error_set(err, DF_EFORMAT, "rank %d (%s) sent %lld floats for group %d of layer %d, expected %lld",
                         r, ep->info[r].host, (long long)h->n_floats, g, job->layer, (long long)want);
            return ep_lose(ep, err);
        }
        const float *src = (const float *)(h + 1);
        for (int u = g0; u < g1; u++)
            if (job->rank[u] == r) {
                size_t n = (size_t)job->rows[u] * job->Dz;
                memcpy(out[u], src, n * sizeof(float));
                src += n;
            }
    }
    return DF_OK;
}

/* The guess goes to every other rank before the layer's attention; a failed send is a lost rank, which the
 * layer's own exchange then reports. */
static void ep_hint(void *ctx, int layer, const int *ids, const int *rank, int n) {
    dist_ep *ep = ctx;
    int N = comm_size(ep->c);
    if (atomic_load(&ep->lost) || n < 1) return;
    size_t len = sizeof(ep_hint_head) + 2 * (size_t)n * sizeof(int32_t);
    uint8_t *b = tx_room(ep, len);
    *(ep_hint_head *)b = (ep_hint_head){MAGIC_JOB, ep->seq, KIND_HINT, layer, n, 0};
    memcpy(b + sizeof(ep_hint_head), ids, (size_t)n * sizeof(int32_t));
    memcpy(b + sizeof(ep_hint_head) + (size_t)n * sizeof(int32_t), rank, (size_t)n * sizeof(int32_t));
    for (int r = 1; r < N; r++) ep->to[r - 1] = r;
    df_error e = {0};
    ep_send_to(ep, ep->to, N - 1, b, len, DIST_TAG_JOB, &e);
}

/* Projections of a layer another rank holds: the input goes there, the answers come back checked. */
static int ep_spine_matmul(void *ctx, int layer, int n, const char *const *keys, const df_tensor *const *w,
                           const float *x, int T, float *const *out, df_error *err) {
    dist_ep *ep = ctx;
    int rc = ep_check_alive(ep, err), r = ep->plan->spine_rank[layer];
    if (rc) return rc;
    DF_ASSERT(n >= 1 && n <= EP_SPINE_MAX);
    int64_t cols = w[0]->shape[1], rows = 0;
    size_t head = sizeof(ep_spine_head) + (size_t)n * sizeof(ep_spine_mat);
    size_t len = head + (size_t)T * (size_t)cols * sizeof(float);
    uint8_t *b = tx_room(ep, len);
    *(ep_spine_head *)b = (ep_spine_head){MAGIC_JOB, ++ep->seq, KIND_SPINE, layer, T, (int32_t)cols, n, 0};
    ep_spine_mat *mats = (ep_spine_mat *)(b + sizeof(ep_spine_head));
    for (int i = 0; i < n; i++) {
        DF_ASSERT(w[i]->shape[1] == cols);
        memset(&mats[i], 0, sizeof mats[i]);
        snprintf(mats[i].key, sizeof mats[i].key, "%s", keys[i]);
        mats[i].rows = (int32_t)w[i]->shape[0];
        rows += w[i]->shape[0];
    }
    memcpy(b + head, x, len - head);
    rc = ep_send_to(ep, &r, 1, b, len, DIST_TAG_JOB, err);
    if (rc) return rc;
    rc = ep_recv_reply(ep, r, KIND_SPINE, layer, 0, err);
    if (rc) return rc;
    const ep_reply_head *a = ep->rx.p;
    if (a->n_floats != (int64_t)T * rows || ep->rx.n != sizeof *a + (size_t)T * (size_t)rows * sizeof(float)) {
        df_error_set(err, DF_EFORMAT, "rank %d (%s) sent %lld floats for %s of layer %d, expected %lld", r,
                     ep->info[r].host, (long long)a->n_floats, keys[0], layer, (long long)T * rows);
        return ep_lose(ep, err);
    }
    const float *src = (const float *)(a + 1);
    for (int i = 0; i < n; i++) {
        size_t m = (size_t)T * (size_t)w[i]->shape[0];
        memcpy(out[i], src, m * sizeof(float));
        src += m;
    }
    return DF_OK;
}

static void hello_fill(ep_hello *h, const df_model *m, const rank_plan *plan, int n_ranks, const char *isa) {
    memset(h, 0, sizeof *h);
    const df_config *c = &m->cfg;
    *h = (ep_hello){MAGIC_HELLO, EP_VERSION, n_ranks, c->n_layers, config_expert_dim(c), c->topk, c->moe_inter,
                    c->n_experts, plan->spine_rank != NULL, 0, plan->checksum, {0}};
    snprintf(h->isa, sizeof h->isa, "%s", isa);
}

static void rank_counts(const rank_plan *p, int r, int64_t *held, int64_t *shared) {
    *held = *shared = 0;
    for (int64_t k = 0; k < p->base[p->n_layers]; k++)
        if ((p->holders[k] >> r) & 1) {
            (*held)++;
            *shared += (p->holders[k] & ~(1ull << r)) != 0;
        }
}

void ep_rank_info_counters(ep_rank_info *in, df_store *st) {
    store_stats ss;
    store_get_stats(st, &ss);
    in->cache_slots = ss.cache_slots;
    in->cache_bytes = ss.cache_bytes;
    in->expert_disk_bytes = ss.expert_disk_bytes;
    in->expert_hits = ss.expert_hits;
    in->expert_misses = ss.expert_misses;
    in->lookahead_loads = ss.lookahead_loads;
    in->spine_bytes = ss.spine_bytes;
}

static void own_info(ep_rank_info *in, dist_comm *c, df_model *m, const rank_plan *plan, const char *folder) {
    snprintf(in->host, sizeof in->host, "%s", comm_host(c));
    snprintf(in->folder, sizeof in->folder, "%s", folder ? folder : "");
    rank_counts(plan, comm_rank(c), &in->held, &in->computed);
    ep_rank_info_counters(in, m->store);
}

int ep_leader_open(dist_ep **out, dist_comm *c, df_model *m, const rank_plan *plan, const char *isa, df_error *err) {
    *out = NULL;
    int N = comm_size(c);
    dist_ep *ep = xcalloc(1, sizeof *ep);
    ep->c = c, ep->m = m, ep->plan = plan;
    ep->info = xcalloc((size_t)N, sizeof *ep->info);
    ep->to = xcalloc((size_t)N, sizeof *ep->to);
    ep->sent_at = xcalloc((size_t)N, sizeof *ep->sent_at);
    ep->turn = xcalloc((size_t)m->cfg.n_layers + 1, sizeof *ep->turn);
    ep->peers = (model_peers){ep, ep_assign, ep_dispatch, ep_collect, ep_hint, plan->spine_rank, ep_spine_matmul};
    own_info(&ep->info[0], c, m, plan, plan->folders[0]);
    for (int r = 1; r < N; r++) ep->to[r - 1] = r, snprintf(ep->info[r].host, sizeof ep->info[r].host, "rank %d", r);
    ep_hello h;
    hello_fill(&h, m, plan, N, isa);
    int rc = ep_send_to(ep, ep->to, N - 1, &h, sizeof h, DIST_TAG_HELLO, err);
    for (int r = 1; !rc && r < N; r++) {
        rc = comm_recv(c, r, DIST_TAG_HELLO, &ep->rx, sizeof(ep_hello_reply), EP_HELLO_TIMEOUT_S, err);
        const ep_hello_reply *a = ep->rx.p;
        if (!rc && (ep->rx.n != sizeof *a || a->magic != MAGIC_HELLO))
            rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "rank %d sent a malformed greeting (%zu bytes)", r, ep->rx.n);
        if (!rc && a->status)
            rc = a->status < 0 ? a->status : DF_EIO,
            df_error_set(err, rc, "rank %d (%.63s): %.900s", r, a->host, a->msg);
        if (!rc) {
            ep_rank_info *in = &ep->info[r];
            memcpy(in->host, a->host, sizeof in->host);
            in->host[sizeof in->host - 1] = 0;
            memcpy(in->folder, a->folder, sizeof in->folder);
            in->folder[sizeof in->folder - 1] = 0;
            in->held = a->held, in->computed = a->shared;
            in->cache_slots = a->cache_slots, in->cache_bytes = a->cache_bytes, in->spine_bytes = a->spine_bytes;
        }
    }
    if (rc) {
        ep_lose(ep, err);
        free(ep->info), free(ep->to), free(ep->sent_at), free(ep->turn), dist_buf_free(&ep->rx), free(ep);
        return rc;
    }
    *out = ep;
    return DF_OK;
}

const model_peers *ep_peers(const dist_ep *ep) { return &ep->peers; }
int ep_ranks(const dist_ep *ep) { return comm_size(ep->c); }
const ep_rank_info *ep_rank(const dist_ep *ep, int r) { return &ep->info[r]; }

int ep_health(const dist_ep *ep, char *why, size_t cap) {
    if (!atomic_load(&((dist_ep *)ep)->lost)) return DF_OK;
    snprintf(why, cap, "%s", ep->lost_msg);
    return DF_EIO;
}

int ep_refresh_stats(dist_ep *ep, df_error *err) {
    int rc = ep_check_alive(ep, err), N = comm_size(ep->c);
    if (rc) return rc;
    own_info(&ep->info[0], ep->c, ep->m, ep->plan, ep->plan->folders[0]);
    ep->seq++;
    ep_job_head h = {MAGIC_JOB, ep->seq, KIND_STATS, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 1; r < N; r++) ep->to[r - 1] = r;
    rc = ep_send_to(ep, ep->to, N - 1, &h, sizeof h, DIST_TAG_JOB, err);
    for (int r = 1; !rc && r < N; r++) {
        rc = ep_recv_reply(ep, r, KIND_STATS, 0, 0, err);
        const ep_reply_head *a = ep->rx.p;
        if (!rc && ep->rx.n != sizeof *a + sizeof(ep_stats_body)) {
            df_error_set(err, DF_EFORMAT, "rank %d (%s) sent malformed counters", r, ep->info[r].host);
            rc = ep_lose(ep, err);
        }
        if (!rc) {
            const ep_stats_body *s = (const ep_stats_body *)(a + 1);
            ep->info[r].expert_disk_bytes = s->expert_disk_bytes;
            ep->info[r].expert_hits = s->expert_hits;
            ep->info[r].expert_misses = s->expert_misses;
            ep->info[r].lookahead_loads = s->lookahead_loads;
        }
    }
    return rc;
}

void ep_leader_close(dist_ep *ep) {
    if (!ep) return;
    if (!atomic_load(&ep->lost) && !comm_failed(ep->c)) {
        int N = comm_size(ep->c);
        ep_job_head h = {MAGIC_JOB, ++ep->seq, KIND_CLOSE, 0, 0, 0, 0, 0, 0, 0};
        df_error e = {0};
        for (int r = 1; r < N; r++) ep->to[r - 1] = r;
        ep_send_to(ep, ep->to, N - 1, &h, sizeof h, DIST_TAG_JOB, &e);
    }
    free(ep->info);
    free(ep->to);
    free(ep->sent_at);
    free(ep->turn);
    free(ep->tx);
    dist_buf_free(&ep->rx);
    free(ep);
}

/* ---- the other ranks ------------------------------------------------------------------------------ */

typedef struct ep_server {
    dist_comm *c;
    df_model *m;
    const rank_plan *plan;
    int me;
    dist_buf rx;
    uint8_t *tx;
    size_t tx_cap;
    int *rows;                  /* [E] rows per uniq, counted from the routing */
    uint8_t *seen;              /* [E] */
    double got_at;              /* when the request being served arrived */
    const df_store_layer *L;    /* spine split: the layer of the last projection asked for, kept acquired */
    int L_index;
} ep_server;

/* Makes s->tx hold at least n bytes (its old contents are not kept). */
static void srv_tx_room(ep_server *s, size_t n) {
    if (n <= s->tx_cap) return;
    free(s->tx);
    s->tx_cap = n + n / 2;
    s->tx = xmalloc(s->tx_cap);
}

/* Sends the reply in s->tx, stamped with this rank's time on the request. */
static int reply_post(ep_server *s, int tag, size_t len, df_error *err) {
    ((ep_reply_head *)s->tx)->busy_s = df_now() - s->got_at;
    return comm_send(s->c, 0, tag, s->tx, len, err);
}

static int reply_send(ep_server *s, int tag, const ep_reply_head *h, const void *body, size_t n, df_error *err) {
    size_t len = sizeof *h + n;
    srv_tx_room(s, len);
    memcpy(s->tx, h, sizeof *h);
    if (n) memcpy(s->tx + sizeof *h, body, n);
    return reply_post(s, tag, len, err);
}

static int reply_error(ep_server *s, const ep_job_head *j, int group, const df_error *why, df_error *err) {
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s", why->msg);
    ep_reply_head h = {MAGIC_REPLY, j->seq, j->kind, j->layer, group, why->code ? why->code : DF_EIO,
                       DF_MIN(n, (int)sizeof msg - 1), 0};
    return reply_send(s, DIST_TAG_REPLY, &h, msg, (size_t)h.n_floats, err);
}

/* Everything rank 0 sent, checked against this rank's model and plan before any of it is used. */
static int job_check(ep_server *s, moe_job *job, df_error *err) {
    const df_config *c = &s->m->cfg;
    const ep_job_head *h = s->rx.p;
    int E = c->n_experts;
    if (h->layer < 0 || h->layer >= c->n_layers || c->ffn[h->layer] != FFN_MOE || h->T < 1 || h->T > EP_MAX_ROWS ||
        h->k != c->topk || h->Dz != config_expert_dim(c) || h->n_uniq < 1 || h->n_uniq > E || h->n_groups < 1 ||
        h->n_groups > h->n_uniq || s->rx.n != job_bytes(h->T, h->k, h->Dz, h->n_uniq, h->n_groups))
        return df_error_set(err, DF_EFORMAT, "rank %d: malformed job from rank 0 (layer %d, %d rows, k %d, width %d, "
                            "%d experts, %d groups, %zu bytes)", s->me, h->layer, h->T, h->k, h->Dz, h->n_uniq,
                            h->n_groups, s->rx.n), DF_EFORMAT;
    const int32_t *at = (const int32_t *)(h + 1);
    int nu = h->n_uniq, Tk = h->T * h->k;
    *job = (moe_job){h->layer, h->T, h->k, h->Dz, at + 2 * nu + h->n_groups, (const float *)(at + 2 * nu + h->n_groups + Tk),
                     (const float *)(at + 2 * nu + h->n_groups + 2 * Tk), nu, at, s->rows, (int *)(at + nu),
                     h->n_groups, at + 2 * nu};
    memset(s->seen, 0, (size_t)E);
    for (int i = 0; i < Tk; i++) {
        if (job->ids[i] < 0 || job->ids[i] >= E || !isfinite(job->wts[i]))
            return df_error_set(err, DF_EFORMAT, "rank %d: job from rank 0: routing entry %d (expert %d) is invalid",
                                s->me, i, job->ids[i]), DF_EFORMAT;
        s->seen[job->ids[i]] = 1;
    }
    for (int u = 0, e = 0; u < nu; u++, e++) {   /* uniq must be exactly the routing's experts, ascending */
        while (e < E && !s->seen[e]) e++;
        if (e >= E || job->uniq[u] != e)
            return df_error_set(err, DF_EFORMAT, "rank %d: job from rank 0: its expert list does not match its routing",
                                s->me), DF_EFORMAT;
    }
    for (int u = 0; u < nu; u++) s->rows[u] = 0;
    for (int i = 0, u = 0; i < Tk; i++) {   /* rows per expert, by binary search in uniq */
        int lo = 0, hi = nu - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (job->uniq[mid] < job->ids[i]) lo = mid + 1;
            else hi = mid;
        }
        s->rows[lo]++;
        (void)u;
    }
    for (int u = 0; u < nu; u++) {
        int r = job->rank[u];
        if (r < 0 || r >= s->plan->n_ranks || (r == s->me && !rank_plan_holds(s->plan, s->me, h->layer, job->uniq[u])))
            return df_error_set(err, DF_EINVAL, "rank %d: rank 0 asks it for expert %d of layer %d, which it does not "
                                "hold (rank plans differ?)", s->me, job->uniq[u], h->layer), DF_EINVAL;
    }
    for (int g = 0; g < h->n_groups; g++)
        if (job->group_end[g] <= (g ? job->group_end[g - 1] : 0) || job->group_end[g] > nu ||
            (g == h->n_groups - 1 && job->group_end[g] != nu))
            return df_error_set(err, DF_EFORMAT, "rank %d: job from rank 0: bad group bounds", s->me), DF_EFORMAT;
    return DF_OK;
}

static int serve_job(ep_server *s, df_error *err) {
    const ep_job_head h = *(const ep_job_head *)s->rx.p;
    moe_job job;
    df_error why = {0};
    int rc = job_check(s, &job, &why);
    if (rc) {   /* rank 0 sent something this rank cannot trust: tell it, and stop */
        reply_error(s, &h, 0, &why, err);
        *err = why;
        return rc;
    }
    for (int g = 0; g < job.n_groups; g++) {
        int g0 = g ? job.group_end[g - 1] : 0;
        int64_t n = 0;
        for (int u = g0; u < job.group_end[g]; u++)
            if (job.rank[u] == s->me) n += (int64_t)job.rows[u] * job.Dz;
        if (!n) continue;
        size_t len = sizeof(ep_reply_head) + (size_t)n * sizeof(float);
        srv_tx_room(s, len);
        rc = moe_job_serve(s->m, &job, s->me, g, (float *)(s->tx + sizeof(ep_reply_head)), &why);
        if (rc) {   /* this job fails on rank 0 with this rank's message; the next may work */
            scratch_end_pass(&s->m->sc);
            return reply_error(s, &h, g, &why, err);
        }
        *(ep_reply_head *)s->tx = (ep_reply_head){MAGIC_REPLY, h.seq, KIND_WORK, h.layer, g, 0, n, 0};
        if ((rc = reply_post(s, DIST_TAG_REPLY, len, err))) break;
    }
    scratch_end_pass(&s->m->sc);
    return rc;
}

/* A guess of a layer's experts: checked, then this rank's store reads ahead of those it holds as its own
 * look-ahead decides (store_experts_hint skips the others). A malformed guess is a protocol error. */
static int serve_hint(ep_server *s, df_error *err) {
    const df_config *c = &s->m->cfg;
    const ep_hint_head *h = s->rx.p;
    if (s->rx.n < sizeof *h || h->layer < 0 || h->layer >= c->n_layers || c->ffn[h->layer] != FFN_MOE || h->n < 1 ||
        h->n > c->n_experts || s->rx.n != sizeof *h + 2 * (size_t)h->n * sizeof(int32_t))
        return df_error_set(err, DF_EFORMAT, "rank %d: malformed look-ahead guess from rank 0 (%zu bytes)", s->me,
                            s->rx.n), DF_EFORMAT;
    const int32_t *ids = (const int32_t *)(h + 1), *rank = ids + h->n;
    for (int i = 0; i < h->n; i++)
        if (ids[i] < 0 || ids[i] >= c->n_experts || rank[i] < 0 || rank[i] > c->topk || (i && rank[i] < rank[i - 1]))
            return df_error_set(err, DF_EFORMAT, "rank %d: look-ahead guess from rank 0: entry %d (expert %d, "
                                "rank %d) is invalid", s->me, i, ids[i], rank[i]), DF_EFORMAT;
    int read_ranks, plan = store_lookahead_plan(s->m->store, h->layer, &read_ranks);
    if (plan)
        store_experts_hint(s->m->store, h->layer, ids, rank, h->n, plan == STORE_LOOKAHEAD_READ ? read_ranks : 0);
    return DF_OK;
}

static int spine_fail(ep_server *s, const ep_spine_head *h, const df_error *why, df_error *err) {
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s", why->msg);
    ep_reply_head a = {MAGIC_REPLY, h->seq, KIND_SPINE, h->layer, 0, why->code ? why->code : DF_EIO,
                       DF_MIN(n, (int)sizeof msg - 1), 0};
    return reply_send(s, DIST_TAG_SPINE, &a, msg, (size_t)a.n_floats, err);
}

/* Projections of one of this rank's layers: checked against the plan and the layer's table, computed with the
 * kernels rank 0 would have used. A request this rank cannot trust ends the service, like a bad job; a part it
 * cannot read fails only this request. */
static int serve_spine(ep_server *s, df_error *err) {
    ep_spine_head h = {0};
    df_error why = {0};
    const df_config *c = &s->m->cfg;
    if (s->rx.n >= sizeof h) memcpy(&h, s->rx.p, sizeof h);
    size_t head = sizeof h + (size_t)DF_MAX(h.n, 0) * sizeof(ep_spine_mat);
    int bad = s->rx.n < sizeof h || h.n < 1 || h.n > EP_SPINE_MAX || h.layer < 0 || h.layer >= c->n_layers ||
              !s->plan->spine_rank || s->plan->spine_rank[h.layer] != s->me || h.T < 1 || h.T > EP_MAX_ROWS ||
              h.cols < 1 || s->rx.n != head + (size_t)h.T * (size_t)h.cols * sizeof(float);
    if (bad) {
        df_error_set(&why, DF_EFORMAT, "rank %d: malformed projection request from rank 0 (layer %d, %d projections "
                     "of %d rows of width %d, %zu bytes), or for a layer it does not hold", s->me, h.layer, h.n, h.T,
                     h.cols, s->rx.n);
        spine_fail(s, &h, &why, err);
        *err = why;
        return DF_EFORMAT;
    }
    const ep_spine_mat *mats = (const ep_spine_mat *)((const uint8_t *)s->rx.p + sizeof h);
    const float *x = (const float *)((const uint8_t *)s->rx.p + head);
    int rc = DF_OK;
    if (s->L && s->L_index != h.layer) store_layer_release(s->m->store, s->L), s->L = NULL;
    if (!s->L) rc = store_layer_acquire(s->m->store, s->L_index = h.layer, &s->L, &why);
    if (rc) return spine_fail(s, &h, &why, err);
    const df_tensor *w[EP_SPINE_MAX];
    size_t n = 0;
    for (int i = 0; i < h.n; i++) {
        const ep_spine_mat *q = &mats[i];
        w[i] = memchr(q->key, 0, sizeof q->key) ? store_layer_tensor(s->L, q->key) : NULL;
        if (!w[i] || w[i]->ndim != 2 || w[i]->shape[1] != h.cols || w[i]->shape[0] != q->rows ||
            !store_layer_holds(s->L, w[i])) {
            df_error_set(&why, DF_EINVAL, "rank %d: rank 0 asks for %.63s [%d, %d] of layer %d, which it does not "
                         "hold as such (do the ranks run the same checkpoint?)", s->me, q->key, q->rows, h.cols,
                         h.layer);
            spine_fail(s, &h, &why, err);
            *err = why;
            return DF_EINVAL;
        }
        n += (size_t)h.T * (size_t)q->rows;
    }
    size_t len = sizeof(ep_reply_head) + n * sizeof(float);
    srv_tx_room(s, len);
    float *out = (float *)(s->tx + sizeof(ep_reply_head));
    for (int i = 0; i < h.n; out += (size_t)h.T * (size_t)mats[i++].rows) {
        if ((rc = store_layer_need(s->m->store, s->L, w[i], &why))) return spine_fail(s, &h, &why, err);
        kern_matmul(s->m->kern, w[i], x, h.T, out);
    }
    *(ep_reply_head *)s->tx = (ep_reply_head){MAGIC_REPLY, h.seq, KIND_SPINE, h.layer, 0, 0, (int64_t)n, 0};
    return reply_post(s, DIST_TAG_SPINE, len, err);
}

int ep_serve(dist_comm *c, df_model *m, const rank_plan *plan, const char *isa, const char *folder,
             const df_error *open_err, df_error *err) {
    ep_server s = {.c = c, .m = m, .plan = plan, .me = comm_rank(c)};
    int rc = comm_recv(c, 0, DIST_TAG_HELLO, &s.rx, sizeof(ep_hello), 1e9, err);
    if (rc) return rc;
    const ep_hello *h = s.rx.p;
    ep_hello_reply a;
    memset(&a, 0, sizeof a);
    a.magic = MAGIC_HELLO;
    snprintf(a.host, sizeof a.host, "%s", comm_host(c));
    snprintf(a.folder, sizeof a.folder, "%s", folder ? folder : "");
    if (s.rx.n != sizeof *h || h->magic != MAGIC_HELLO || h->version != EP_VERSION)
        a.status = DF_EFORMAT, snprintf(a.msg, sizeof a.msg, "rank %d: rank 0's greeting is malformed or of another "
                                        "version (%zu bytes)", s.me, s.rx.n);
    else if (open_err)
        a.status = open_err->code ? open_err->code : DF_EIO, snprintf(a.msg, sizeof a.msg, "%s", open_err->msg);
    if (!a.status) {
        ep_hello mine;
        hello_fill(&mine, m, plan, comm_size(c), isa);
        if (h->n_ranks != mine.n_ranks || h->n_layers != mine.n_layers || h->Dz != mine.Dz || h->topk != mine.topk ||
            h->moe_inter != mine.moe_inter || h->n_experts != mine.n_experts)
            a.status = DF_EINVAL, snprintf(a.msg, sizeof a.msg, "rank %d: its model (%d layers, %d experts of width "
                                           "%d, top %d) is not rank 0's (%d layers, %d experts of width %d, top %d)",
                                           s.me, mine.n_layers, mine.n_experts, mine.Dz, mine.topk, h->n_layers,
                                           h->n_experts, h->Dz, h->topk);
        else if (h->spine_split != mine.spine_split)
            a.status = DF_EINVAL, snprintf(a.msg, sizeof a.msg, "rank %d %s the spine over the ranks and rank 0 %s "
                                           "(give every rank the same --spine-split, or the same --mem)", s.me,
                                           mine.spine_split ? "splits" : "does not split",
                                           h->spine_split ? "does" : "does not");
        else if (h->plan_sum != mine.plan_sum)
            a.status = DF_EINVAL, snprintf(a.msg, sizeof a.msg, "rank %d: its rank plan (%s) differs from rank 0's",
                                           s.me, plan->from_file ? RANK_PLAN_FILE : "experts dealt e mod N");
        else if (strncmp(h->isa, mine.isa, sizeof h->isa))
            a.status = DF_EUNSUPPORTED, snprintf(a.msg, sizeof a.msg, "rank %d runs %s kernels, rank 0 %.15s: results "
                                                 "would not be bit-identical (set DELTAFIN_ISA=%.15s on every rank)",
                                                 s.me, mine.isa, h->isa, h->isa);
    }
    if (!a.status) {
        ep_rank_info in;
        own_info(&in, c, m, plan, folder);
        a.held = in.held, a.shared = in.computed, a.cache_slots = in.cache_slots, a.cache_bytes = in.cache_bytes;
        a.spine_bytes = in.spine_bytes;
    }
    rc = comm_send(c, 0, DIST_TAG_HELLO, &a, sizeof a, err);
    if (!rc && a.status) rc = a.status, df_error_set(err, a.status, "%s", a.msg);
    if (!rc) {
        s.rows = xcalloc((size_t)m->cfg.n_experts + 1, sizeof *s.rows);
        s.seen = xcalloc((size_t)m->cfg.n_experts + 1, 1);
    }
    while (!rc) {
        rc = comm_recv(c, 0, DIST_TAG_JOB, &s.rx, EP_MAX_MSG, 1e9, err);
        if (rc) break;
        s.got_at = df_now();
        const ep_job_head *j = s.rx.p;
        /* every message starts with magic, sequence and kind; each kind checks its own size */
        int32_t kind = s.rx.n >= 3 * sizeof(uint32_t) ? j->kind : -1;
        if (kind < 0 || j->magic != MAGIC_JOB ||
            ((kind == KIND_WORK || kind == KIND_STATS || kind == KIND_CLOSE) && s.rx.n < sizeof *j)) {
            rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "rank %d: malformed message from rank 0 (%zu bytes)", s.me,
                                          s.rx.n);
        } else if (j->kind == KIND_CLOSE) {
            break;
        } else if (j->kind == KIND_STATS) {
            store_stats ss;
            store_get_stats(m->store, &ss);
            ep_stats_body b = {ss.expert_disk_bytes, ss.expert_hits, ss.expert_misses, ss.lookahead_loads};
            ep_reply_head rh = {MAGIC_REPLY, j->seq, KIND_STATS, 0, 0, 0, 0, 0};
            rc = reply_send(&s, DIST_TAG_REPLY, &rh, &b, sizeof b, err);
        } else if (j->kind == KIND_WORK) {
            rc = serve_job(&s, err);
        } else if (j->kind == KIND_SPINE) {
            rc = serve_spine(&s, err);
        } else if (j->kind == KIND_HINT) {
            rc = serve_hint(&s, err);
        } else {
            rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "rank %d: unknown message kind %d from rank 0", s.me,
                                          j->kind);
        }
    }
    if (s.L) store_layer_release(m->store, s.L);
    free(s.rows);
    free(s.seen);
    free(s.tx);
    dist_buf_free(&s.rx);
    return rc;
}
