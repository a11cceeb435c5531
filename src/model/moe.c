/* moe.c — feed-forward blocks: the dense GLU FFN (SwiGLU or K3's SiTU-GLU), shared experts, and the
 * routed MoE: sigmoid router, correction bias for selection only, group-limited top-k,
 * renormalisation and scaling, optional latent down/up projections with RMSNorm. Experts are applied
 * expert-major: each selected expert's weights are traversed once for all tokens of the batch routed to
 * it, in the order storage delivers them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

static void glu_act(const df_config *c, float *g, const float *u, int64_t n) {
    if (c->use_situ) kern_situ_mul(g, u, (int)n, c->situ_beta, c->situ_lin_beta);
    else kern_silu_mul(g, u, (int)n);
}

/* Rows a GLU takes at once, so that a long prompt through a wide dense layer does not need [rows, inter]
 * intermediates that dwarf its activations. A block is a product of fewer rows, as a shorter pass would take:
 * bit-identical with kernels whose sums do not depend on the row count (test_batch). */
#define GLU_BLOCK_ROWS MODEL_BLOCK_ROWS

size_t glu_scratch_bytes(int inter, int T) {
    return 2 * scratch_size((size_t)DF_MIN(T, GLU_BLOCK_ROWS) * inter, sizeof(float));
}

/* out = x w^T; a spine matrix (dense FFN, shared experts) is made usable first (fwd_matmul), a routed expert's
 * is in memory already. */
static int glu_mul(df_fwd *f, int spine, const df_tensor *w, const float *x, int n, float *out) {
    if (spine) return fwd_matmul(f, w, x, n, out);
    kern_matmul(f->m->kern, w, x, n, out);
    return DF_OK;
}

/* out[T, dout] = down(act(gate(x)) * up(x)); gate/up [inter, din], down [dout, inter]. spine: the matrices are
 * the layer's (dense FFN, shared experts), not a routed expert's. */
static int glu_apply(df_fwd *f, int spine, const df_tensor *gate, const df_tensor *up, const df_tensor *down,
                     int inter, const float *x, int T, float *out) {
    size_t mark = scratch_mark(f->sc);
    int B = DF_MIN(T, GLU_BLOCK_ROWS), rc = DF_OK;
    float *g = SCRATCH_F32(f->sc, (int64_t)B * inter), *u = SCRATCH_F32(f->sc, (int64_t)B * inter);
    for (int t0 = 0; !rc && t0 < T; t0 += B) {
        int n = DF_MIN(B, T - t0);
        const df_tensor *gu[2] = {gate, up};
        float *gu_out[2] = {g, u};
        const float *xt = x + (int64_t)t0 * gate->shape[1];
        if (spine) rc = fwd_matmul_n(f, 2, gu, xt, n, gu_out);
        else if (!(rc = glu_mul(f, spine, gate, xt, n, g))) rc = glu_mul(f, spine, up, xt, n, u);
        if (rc) break;
        glu_act(&f->m->cfg, g, u, (int64_t)n * inter);
        rc = glu_mul(f, spine, down, g, n, out + (int64_t)t0 * down->shape[0]);
    }
    scratch_release(f->sc, mark);
    return rc;
}

int ffn_dense_forward(df_fwd *f, const glu_weights *g, const float *x, int T, float *out) {
    return glu_apply(f, 1, g->gate, g->up, g->down, g->inter, x, T, out);
}

/* ---- routing ------------------------------------------------------------------------------------- */

/* Index of the largest value among n not yet taken; ties go to the lower index. */
static int argmax_free(const float *v, const uint8_t *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* Selects k experts for one token from sigmoid scores s (bias added for selection only); writes ids and
 * final weights. */
static void route_token(const df_config *c, const float *s, const float *bias, int *ids, float *wts,
                        float *choice, uint8_t *taken) {
    int E = c->n_experts, G = c->n_group;
    for (int e = 0; e < E; e++) choice[e] = s[e] + bias[e];
    if (G > 1 && c->topk_group < G) {
        int per = E / G;
        float gs[CONFIG_MAX_EXPERT_GROUPS];
        uint8_t gtaken[CONFIG_MAX_EXPERT_GROUPS] = {0};
        for (int g = 0; g < G; g++) {       /* group score: sum of its two best choices */
            float a = -INFINITY, b = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > a) { b = a; a = choice[e]; }
                else if (choice[e] > b) b = choice[e];
            }
            gs[g] = a + b;
        }
        for (int kept = 0; kept < c->topk_group; kept++) gtaken[argmax_free(gs, gtaken, G)] = 1;
        for (int g = 0; g < G; g++)
            if (!gtaken[g])
                for (int e = g * per; e < (g + 1) * per; e++) choice[e] = -INFINITY;
    }
    memset(taken, 0, E);
    float sum = 0.0f;
    for (int j = 0; j < c->topk; j++) {
        int e = argmax_free(choice, taken, E);
        taken[e] = 1;
        ids[j] = e;
        wts[j] = s[e];
        sum += s[e];
    }
    for (int j = 0; j < c->topk; j++) {
        if (c->renorm) wts[j] /= sum + 1e-20f;
        wts[j] *= c->routed_scale;
    }
}

typedef struct {
    int *ids;      /* [T, k] */
    float *wts;    /* [T, k] */
    int *uniq;     /* experts used by the batch, ascending */
    int n_uniq;
} df_routing;

/* Routes the batch with w's router (usable here: the caller made it so, or it is on the rank holding the layer);
 * r's arrays are taken from the scratch arena (the caller releases them). */
static int route_batch(df_fwd *f, const moe_weights *w, const float *x, int T, df_routing *r) {
    const df_config *c = &f->m->cfg;
    int E = c->n_experts, k = c->topk;
    r->ids = SCRATCH_NEW(f->sc, int, (int64_t)T * k);
    r->wts = SCRATCH_F32(f->sc, (int64_t)T * k);
    r->uniq = SCRATCH_NEW(f->sc, int, E);
    size_t mark = scratch_mark(f->sc);
    float *s = SCRATCH_F32(f->sc, (int64_t)T * E), *choice = SCRATCH_F32(f->sc, E);
    uint8_t *taken = scratch_alloc(f->sc, E), *used = scratch_zalloc(f->sc, E);
    int rc = DF_OK;
    if (f->remote) rc = fwd_matmul(f, w->gate, x, T, s);
    else kern_matmul(f->m->kern, w->gate, x, T, s);
    for (int t = 0; !rc && t < T; t++) {
        float *st = s + (int64_t)t * E;
        for (int e = 0; e < E; e++) st[e] = kern_sigmoid(st[e]);
        route_token(c, st, w->bias, r->ids + t * k, r->wts + t * k, choice, taken);
        for (int j = 0; j < k; j++) used[r->ids[t * k + j]] = 1;
    }
    r->n_uniq = 0;
    for (int e = 0; e < E; e++)
        if (used[e]) r->uniq[r->n_uniq++] = e;
    scratch_release(f->sc, mark);
    return rc;
}

static size_t route_scratch_bytes(const df_config *c, int T) {
    int E = c->n_experts, k = c->topk;
    return scratch_size((size_t)T * k, sizeof(int)) + scratch_size((size_t)T * k, sizeof(float)) +
           scratch_size(E, sizeof(int)) + scratch_size((size_t)T * E, sizeof(float)) + scratch_size(E, sizeof(float)) +
           2 * scratch_size(E, 1);
}

/* ---- experts ------------------------------------------------------------------------------------- */

/* Storage names every part of an expert it hands out, so only shapes and dtypes can be wrong. */
static int expert_check(df_fwd *f, const df_expert *ex) {
    const df_config *c = &f->m->cfg;
    int64_t Dz = config_expert_dim(c), I = c->moe_inter;
    int rc = tensor_check_mat(&ex->w1, ex->w1.name, I, Dz, f->m->dir, f->err);
    if (!rc) rc = tensor_check_mat(&ex->w2, ex->w2.name, Dz, I, f->m->dir, f->err);
    if (!rc) rc = tensor_check_mat(&ex->w3, ex->w3.name, I, Dz, f->m->dir, f->err);
    return rc;
}

/* The tokens of the batch routed to one expert of its union, and that expert's weighted output. */
typedef struct {
    int n;
    int *rows;     /* [n] token rows, ascending */
    float *w;      /* [n] routing weights */
    float *out;    /* [n, Dz] weight x expert output, once the expert has run (in the output pool) */
} expert_part;

/* Rows of expert output held at once. A decode-sized batch keeps all T x k of them, so every expert of the
 * union can run the moment it arrives; a long prompt would need k activations' worth per token (16 x 28 KiB
 * for K3), so it keeps max(T, 64 k) rows and runs its union in consecutive groups that fit them. */
static int64_t expert_pool_rows(const df_config *c, int T) {
    int64_t all = (int64_t)T * c->topk;
    return DF_MIN(all, DF_MAX((int64_t)T, 64 * (int64_t)c->topk));
}

/* Splits the routing by expert: part[u] lists the tokens routed to r->uniq[u]; the parts' rows and weights lie
 * one after another in two scratch arrays. */
static expert_part *expert_parts(df_fwd *f, const df_routing *r, int T) {
    const df_config *c = &f->m->cfg;
    int k = c->topk;
    int *slot = SCRATCH_NEW(f->sc, int, c->n_experts);
    expert_part *p = scratch_zalloc(f->sc, ((size_t)r->n_uniq + 1) * sizeof *p);
    int *rows = SCRATCH_NEW(f->sc, int, (int64_t)T * k);
    float *w = SCRATCH_F32(f->sc, (int64_t)T * k);
    for (int u = 0; u < r->n_uniq; u++) slot[r->uniq[u]] = u;
    for (int i = 0; i < T * k; i++) p[slot[r->ids[i]]].n++;
    for (int u = 0, at = 0; u < r->n_uniq; u++) {
        p[u].rows = rows + at;
        p[u].w = w + at;
        at += p[u].n;
        p[u].n = 0;
    }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            expert_part *q = &p[slot[r->ids[t * k + j]]];
            q->rows[q->n] = t;
            q->w[q->n++] = r->wts[t * k + j];
        }
    return p;
}

/* Runs an expert on its tokens, keeping weight x output in p->out. */
static int expert_run(df_fwd *f, const df_expert *ex, expert_part *p, const float *z) {
    const df_config *c = &f->m->cfg;
    int Dz = config_expert_dim(c);
    int rc = expert_check(f, ex);
    if (rc) return rc;
    size_t mark = scratch_mark(f->sc);
    float *xg = SCRATCH_F32(f->sc, (int64_t)p->n * Dz);
    for (int i = 0; i < p->n; i++) memcpy(xg + (int64_t)i * Dz, z + (int64_t)p->rows[i] * Dz, Dz * sizeof(float));
    glu_apply(f, 0, &ex->w1, &ex->w3, &ex->w2, c->moe_inter, xg, p->n, p->out);
    for (int i = 0; i < p->n; i++)
        for (int j = 0; j < Dz; j++) p->out[(int64_t)i * Dz + j] *= p->w[i];
    scratch_release(f->sc, mark);
    return DF_OK;
}

/* Runs parts [0, n) (their outputs already placed) in the order storage delivers them: compute on early
 * arrivals overlaps the reads of the rest. */
static int experts_run_group(df_fwd *f, const int *ids, expert_part *p, int n, uint8_t *done, const float *z) {
    int rc = DF_OK;
    for (int got = 0; !rc && got < n; got++) {
        df_expert ex;
        int u = -1;
        double t0 = df_now();
        rc = store_expert_acquire_next(f->m->store, f->layer, ids, n, done, &u, &ex, f->err);
        t0 = model_clock(&f->m->prof.expert_read, t0);
        if (rc) break;
        rc = expert_run(f, &ex, &p[u], z);
        store_expert_release(f->m->store, f->layer, ids[u]);
        model_clock(&f->m->prof.expert_compute, t0);
    }
    return rc;
}

int moe_job_groups(const df_config *c, int T, const int *rows, int n_uniq, int *group_end) {
    int64_t cap = expert_pool_rows(c, T);
    int n = 0;
    for (int g0 = 0, g1; g0 < n_uniq; g0 = g1) {
        int64_t used = 0;
        for (g1 = g0; g1 < n_uniq && (g1 == g0 || used + rows[g1] <= cap); g1++) used += rows[g1];
        group_end[n++] = g1;
    }
    return n;
}

/* Of the group's parts [g0, g1), those rank me computes (all of them without a job), with their ids, copied
 * into sub / sub_ids; returns how many. */
static int experts_of_rank(const moe_job *job, int me, const int *uniq, const expert_part *p, int g0, int g1,
                           expert_part *sub, int *sub_ids) {
    int n = 0;
    for (int u = g0; u < g1; u++)
        if (!job || job->rank[u] == me) sub[n] = p[u], sub_ids[n++] = uniq[u];
    return n;
}

/* Runs the batch's experts group by group (all of them in one group unless the batch is a long prompt), and
 * adds their outputs into y [T, Dz] in ascending expert order: float addition is not associative, so a fixed
 * order keeps results independent of arrival order, grouping, cache state, read-ahead and of which rank
 * computed which expert. With a job (expert parallelism), rank 0 runs its own share of each group while the
 * other ranks run theirs, then takes their outputs into the pool before adding. */
static int experts_apply(df_fwd *f, const df_routing *r, expert_part *p, const moe_job *job, const float *z, int T,
                         float *y) {
    const df_config *c = &f->m->cfg;
    int Dz = config_expert_dim(c), rc = DF_OK, nu = r->n_uniq;
    size_t mark = scratch_mark(f->sc);
    uint8_t *done = scratch_zalloc(f->sc, (size_t)nu + 1);
    int *rows = SCRATCH_NEW(f->sc, int, nu + 1), *ends = SCRATCH_NEW(f->sc, int, nu + 1);
    int *sub_ids = SCRATCH_NEW(f->sc, int, nu + 1);
    expert_part *sub = SCRATCH_NEW(f->sc, expert_part, nu + 1);
    float **remote = SCRATCH_NEW(f->sc, float *, nu + 1);
    for (int u = 0; u < nu; u++) rows[u] = p[u].n;
    int n_groups = job ? job->n_groups : moe_job_groups(c, T, rows, nu, ends);
    const int *group_end = job ? job->group_end : ends;
    float *pool = SCRATCH_F32(f->sc, expert_pool_rows(c, T) * Dz);
    for (int g = 0, g0 = 0; !rc && g < n_groups; g0 = group_end[g++]) {
        int g1 = group_end[g];
        for (int u = g0, at = 0; u < g1; at += p[u++].n) {
            p[u].out = pool + (int64_t)at * Dz;
            remote[u] = job && job->rank[u] != 0 ? p[u].out : NULL;
        }
        int n = experts_of_rank(job, 0, r->uniq, p, g0, g1, sub, sub_ids);
        rc = experts_run_group(f, sub_ids, sub, n, done + g0, z);
        if (!rc && job) {
            double t0 = df_now();
            rc = f->m->peers->collect(f->m->peers->ctx, job, g, remote, f->err);
            model_clock(&f->m->prof.expert_read, t0);
        }
        for (int u = g0; !rc && u < g1; u++)
            for (int i = 0; i < p[u].n; i++) {
                float *dst = y + (int64_t)p[u].rows[i] * Dz;
                const float *src = p[u].out + (int64_t)i * Dz;
                for (int j = 0; j < Dz; j++) dst[j] += src[j];
            }
    }
    scratch_release(f->sc, mark);
    return rc;
}

int moe_job_serve(df_model *m, const moe_job *job, int me, int g, float *out, df_error *err) {
    df_fwd f = {.m = m, .layer = job->layer, .sc = &m->sc, .err = err, .w = &m->w.layers[job->layer]};
    size_t mark = scratch_mark(f.sc);
    df_routing r = {(int *)job->ids, (float *)job->wts, (int *)job->uniq, job->n_uniq};
    expert_part *p = expert_parts(&f, &r, job->T);
    int nu = job->n_uniq, rc = DF_OK;
    int *sub_ids = SCRATCH_NEW(f.sc, int, nu + 1);
    expert_part *sub = SCRATCH_NEW(f.sc, expert_part, nu + 1);
    if (g == 0) {
        int n = experts_of_rank(job, me, job->uniq, p, 0, nu, sub, sub_ids);
        rc = store_experts_prefetch(m->store, job->layer, sub_ids, n, err);
    }
    int g0 = g ? job->group_end[g - 1] : 0, at = 0;
    int n = experts_of_rank(job, me, job->uniq, p, g0, job->group_end[g], sub, sub_ids);
    for (int i = 0; i < n; at += sub[i++].n) sub[i].out = out + (int64_t)at * job->Dz;
    uint8_t *done = scratch_zalloc(f.sc, (size_t)n + 1);
    if (!rc) rc = experts_run_group(&f, sub_ids, sub, n, done, job->z);
    scratch_release(f.sc, mark);
    return rc;
}

/* ---- look-ahead (df_engine_opts.lookahead) -------------------------------------------------------- */

/* The guess most confident first: each expert at the best rank a token chose it at (0 = a top choice), so
 * storage can read just the surest part of it. Returns how many experts it names. */
static int guess_rank(const df_config *c, const df_routing *r, int T, int *best, int *ids, int *rank) {
    int E = c->n_experts, k = c->topk, n = 0;
    for (int e = 0; e < E; e++) best[e] = k;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) best[r->ids[t * k + j]] = DF_MIN(best[r->ids[t * k + j]], j);
    for (int j = 0; j < k; j++)
        for (int e = 0; e < E; e++)
            if (best[e] == j) ids[n] = e, rank[n++] = j;
    return n;
}

/* Rows a guess routes: a long prompt asks for nearly every expert anyway, and routing all its rows twice would
 * double the router's cost; evenly spaced rows name the experts it surely needs. */
#define MOE_GUESS_ROWS 32

/* Before the layer's attention: the layer's router (the same scoring and top-k as route_batch) applied to the
 * layer's input h, normalised with the post-attention norm, names most of what the layer will ask for once
 * attention has added its part; storage decides whether to read the guess (readahead.h), so its reads fill
 * the time attention leaves the disk idle, and scores it against what the layer asks for. With other ranks the
 * guess goes to them too, each reading ahead of its own share as its own storage decides. It only reads ahead:
 * routing and results are untouched, and it never waits for the spine (the router matrix is used only when it
 * is in memory already). */
void moe_guess(df_fwd *f, const float *h, int T) {
    const df_config *c = &f->m->cfg;
    const moe_weights *w = &f->w->moe;
    int read_ranks, d = c->d, G = DF_MIN(T, MOE_GUESS_ROWS);
    if (c->ffn[f->layer] != FFN_MOE || f->remote || !store_layer_ready(f->m->store, f->L, w->gate)) return;
    int plan = store_lookahead_plan(f->m->store, f->layer, &read_ranks);
    const model_peers *peers = f->m->peers;
    if (!plan && !peers) return;
    size_t mark = scratch_mark(f->sc);
    float *xn = SCRATCH_F32(f->sc, (int64_t)G * d);
    for (int g = 0; g < G; g++)
        kern_rmsnorm(xn + (int64_t)g * d, h + (int64_t)g * T / G * d, f->w->ffn_norm, d, c->eps);
    df_routing r;
    route_batch(f, w, xn, G, &r);
    int *best = SCRATCH_NEW(f->sc, int, c->n_experts), *ids = SCRATCH_NEW(f->sc, int, c->n_experts),
        *rank = SCRATCH_NEW(f->sc, int, c->n_experts);
    int n = guess_rank(c, &r, G, best, ids, rank);
    if (plan) store_experts_hint(f->m->store, f->layer, ids, rank, n, plan == STORE_LOOKAHEAD_READ ? read_ranks : 0);
    if (peers) peers->hint(peers->ctx, f->layer, ids, rank, n);
    scratch_release(f->sc, mark);
}

size_t moe_guess_scratch_bytes(const df_config *c, int T) {
    int G = DF_MIN(T, MOE_GUESS_ROWS);
    return scratch_size((size_t)G * c->d, sizeof(float)) + route_scratch_bytes(c, G) +
           3 * scratch_size(c->n_experts, sizeof(int));
}

/* With other ranks (expert parallelism): who computes each expert of the union, and the job they get. Storage
 * counts the whole union (heat, traces) but reads only rank 0's share. The job is sent later (moe_job_send). */
static int moe_job_start(df_fwd *f, const df_routing *r, const expert_part *p, const float *z, int T, moe_job *job) {
    const df_config *c = &f->m->cfg;
    int nu = r->n_uniq;
    int *rows = SCRATCH_NEW(f->sc, int, nu + 1), *ends = SCRATCH_NEW(f->sc, int, nu + 1);
    int *rank = SCRATCH_NEW(f->sc, int, nu + 1), *mine = SCRATCH_NEW(f->sc, int, nu + 1), n = 0;
    for (int u = 0; u < nu; u++) rows[u] = p[u].n;
    *job = (moe_job){f->layer, T, c->topk, config_expert_dim(c), r->ids, r->wts, z, nu, r->uniq, rows, rank,
                     moe_job_groups(c, T, rows, nu, ends), ends};
    f->m->peers->assign(f->m->peers->ctx, job);
    for (int u = 0; u < nu; u++)
        if (!rank[u]) mine[n++] = r->uniq[u];
    int rc = store_experts_note(f->m->store, f->layer, r->uniq, nu, f->err);
    if (!rc) rc = store_experts_read(f->m->store, f->layer, mine, n, f->err);
    return rc;
}

static int moe_job_send(df_fwd *f, const moe_job *job) { return f->m->peers->dispatch(f->m->peers->ctx, job, f->err); }

/* Routing first, then the reads are issued; everything that needs no routed expert (the shared experts, the
 * latent down-projection) runs while they are in flight, then the routed experts in arrival order. With other
 * ranks the latent rows come first, since their share needs them; when another rank holds this layer's spine,
 * the job goes out after the shared experts, which that rank computes first, so that rank 0 does not wait
 * for them behind that rank's share of the experts. */
int moe_forward(df_fwd *f, const float *x, int T, float *out) {
    const df_config *c = &f->m->cfg;
    const moe_weights *w = &f->w->moe;
    int Dz = config_expert_dim(c);
    int rc = fwd_need(f, w->gate);
    if (rc) return rc;
    size_t mark = scratch_mark(f->sc);
    df_routing r;
    rc = route_batch(f, w, x, T, &r);
    if (rc) {
        scratch_release(f->sc, mark);
        return rc;
    }
    expert_part *p = expert_parts(f, &r, T);
    moe_job job, *jp = f->m->peers ? &job : NULL;
    float *z = NULL, *y = NULL, *sh = NULL;
    if (!jp) rc = store_experts_prefetch(f->m->store, f->layer, r.uniq, r.n_uniq, f->err);
    if (!rc && jp && w->latent_down) {
        z = SCRATCH_F32(f->sc, (int64_t)T * Dz);
        rc = fwd_matmul(f, w->latent_down, x, T, z);
    }
    if (!rc && jp) rc = moe_job_start(f, &r, p, z ? z : x, T, jp);
    if (!rc && jp && !f->remote) rc = moe_job_send(f, jp);
    if (!rc && w->shared.gate) {
        sh = SCRATCH_F32(f->sc, (int64_t)T * c->d);
        rc = ffn_dense_forward(f, &w->shared, x, T, sh);
    }
    if (!rc && jp && f->remote) rc = moe_job_send(f, jp);
    if (!rc && !jp && w->latent_down) {
        z = SCRATCH_F32(f->sc, (int64_t)T * Dz);
        rc = fwd_matmul(f, w->latent_down, x, T, z);
    }
    if (!rc) {
        y = scratch_zalloc(f->sc, (size_t)T * Dz * sizeof(float));
        rc = experts_apply(f, &r, p, jp, z ? z : x, T, y);
    }
    if (!rc && w->latent_up) {
        for (int t = 0; w->latent_norm && t < T; t++)
            kern_rmsnorm(y + (int64_t)t * Dz, y + (int64_t)t * Dz, w->latent_norm, Dz, c->eps);
        rc = fwd_matmul(f, w->latent_up, y, T, out);
    } else if (!rc) {
        memcpy(out, y, (size_t)T * c->d * sizeof(float));
    }
    for (int64_t i = 0; !rc && sh && i < (int64_t)T * c->d; i++) out[i] += sh[i];
    scratch_release(f->sc, mark);
    return rc;
}

size_t moe_scratch_bytes(const df_config *c, int T) {
    int E = c->n_experts, k = c->topk, Dz = config_expert_dim(c);
    size_t td = scratch_size((size_t)T * c->d, sizeof(float)), tz = scratch_size((size_t)T * Dz, sizeof(float));
    size_t route = route_scratch_bytes(c, T);
    size_t shared = c->n_shared > 0 ? td + glu_scratch_bytes(c->moe_inter * c->n_shared, T) : 0;
    size_t parts = scratch_size(E, sizeof(int)) + scratch_size((size_t)E + 1, sizeof(expert_part)) +
                   scratch_size((size_t)T * k, sizeof(int)) + scratch_size((size_t)T * k, sizeof(float)) +
                   scratch_size((size_t)expert_pool_rows(c, T) * Dz, sizeof(float)) + scratch_size((size_t)E + 1, 1);
    size_t run = tz + glu_scratch_bytes(c->moe_inter, T);
    size_t apply = 3 * scratch_size((size_t)E + 1, sizeof(int)) + scratch_size((size_t)E + 1, sizeof(expert_part)) +
                   scratch_size((size_t)E + 1, sizeof(float *));
    size_t job = 4 * scratch_size((size_t)E + 1, sizeof(int));
    return route + shared + 2 * tz + parts + run + apply + job;
}
