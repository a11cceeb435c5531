/* moe.c — feed-forward blocks: the dense GLU FFN (SwiGLU or K3's SiTU-GLU), shared experts, and the
 * routed MoE: sigmoid router, correction bias for selection only, group-limited top-k,
 * renormalisation and scaling, optional latent down/up projections with RMSNorm. Experts are applied
 * expert-major: each selected expert's weights are traversed once for all tokens of the batch routed to
 * it, in the order storage delivers them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

static void glu_act(const df_config *c, float *g, const float *u, int64_t n) {
    if (c->use_situ) kern_situ_mul(g, u, (int)n, c->situ_beta, c->situ_lin_beta);
    else kern_silu_mul(g, u, (int)n);
}

/* out[T, dout] = down(act(gate(x)) * up(x)); gate/up [inter, din], down [dout, inter]. */
static void glu_apply(df_fwd *f, const df_tensor *gate, const df_tensor *up, const df_tensor *down, int inter,
                      const float *x, int T, float *out) {
    float *g = xmalloc((size_t)T * inter * sizeof(float)), *u = xmalloc((size_t)T * inter * sizeof(float));
    kern_matmul(f->m->kern, gate, x, T, g);
    kern_matmul(f->m->kern, up, x, T, u);
    glu_act(&f->m->cfg, g, u, (int64_t)T * inter);
    kern_matmul(f->m->kern, down, g, T, out);
    free(g);
    free(u);
}

int ffn_dense_forward(df_fwd *f, const char *prefix, int inter, const float *x, int T, float *out) {
    int64_t d = f->m->cfg.d;
    char n[3][96];
    snprintf(n[0], sizeof n[0], "%sgate_proj.weight", prefix);
    snprintf(n[1], sizeof n[1], "%sup_proj.weight", prefix);
    snprintf(n[2], sizeof n[2], "%sdown_proj.weight", prefix);
    const df_tensor *g, *u, *dn;
    if (!(g = fwd_mat(f, n[0], inter, d)) || !(u = fwd_mat(f, n[1], inter, d)) || !(dn = fwd_mat(f, n[2], d, inter)))
        return f->err->code;
    glu_apply(f, g, u, dn, inter, x, T, out);
    return DF_OK;
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

static int route_batch(df_fwd *f, const float *x, int T, df_routing *r) {
    const df_config *c = &f->m->cfg;
    int E = c->n_experts, k = c->topk;
    const df_tensor *gate = fwd_mat(f, "block_sparse_moe.gate.weight", E, c->d);
    float *bias = gate ? fwd_vec(f, "block_sparse_moe.gate.e_score_correction_bias", E, 1) : NULL;
    if (!bias) return f->err->code;
    float *s = xmalloc((size_t)T * E * sizeof(float)), *choice = xmalloc(E * sizeof(float));
    uint8_t *taken = xmalloc(E), *used = xcalloc(E, 1);
    kern_matmul(f->m->kern, gate, x, T, s);
    r->ids = xmalloc((size_t)T * k * sizeof(int));
    r->wts = xmalloc((size_t)T * k * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *st = s + (int64_t)t * E;
        for (int e = 0; e < E; e++) st[e] = kern_sigmoid(st[e]);
        route_token(c, st, bias, r->ids + t * k, r->wts + t * k, choice, taken);
        for (int j = 0; j < k; j++) used[r->ids[t * k + j]] = 1;
    }
    r->uniq = xmalloc(E * sizeof(int));
    r->n_uniq = 0;
    for (int e = 0; e < E; e++)
        if (used[e]) r->uniq[r->n_uniq++] = e;
    free(s);
    free(choice);
    free(taken);
    free(used);
    free(bias);
    return DF_OK;
}

/* ---- experts ------------------------------------------------------------------------------------- */

static int expert_check(df_fwd *f, int e, const df_expert *ex) {
    const df_config *c = &f->m->cfg;
    int64_t Dz = config_expert_dim(c), I = c->moe_inter;
    char n[3][128];
    snprintf(n[0], sizeof n[0], "model.layers.%d.block_sparse_moe.experts.%d.w1", f->layer, e);
    snprintf(n[1], sizeof n[1], "model.layers.%d.block_sparse_moe.experts.%d.w2", f->layer, e);
    snprintf(n[2], sizeof n[2], "model.layers.%d.block_sparse_moe.experts.%d.w3", f->layer, e);
    int rc = tensor_check_mat(&ex->w1, n[0], I, Dz, f->m->dir, f->err);
    if (!rc) rc = tensor_check_mat(&ex->w2, n[1], Dz, I, f->m->dir, f->err);
    if (!rc) rc = tensor_check_mat(&ex->w3, n[2], I, Dz, f->m->dir, f->err);
    return rc;
}

/* The tokens of the batch routed to one expert of its union, and that expert's weighted output. */
typedef struct {
    int n;
    int *rows;     /* [n] token rows, ascending */
    float *w;      /* [n] routing weights */
    float *out;    /* [n, Dz] weight x expert output; NULL until the expert has run */
} expert_part;

/* Splits the routing by expert: part[u] lists the tokens routed to r->uniq[u]. */
static expert_part *expert_parts(const df_config *c, const df_routing *r, int T) {
    int k = c->topk;
    int *slot = xmalloc(sizeof *slot * (size_t)c->n_experts);
    expert_part *p = xcalloc((size_t)r->n_uniq + 1, sizeof *p);
    for (int u = 0; u < r->n_uniq; u++) slot[r->uniq[u]] = u;
    for (int i = 0; i < T * k; i++) p[slot[r->ids[i]]].n++;
    for (int u = 0; u < r->n_uniq; u++) {
        p[u].rows = xmalloc(sizeof *p[u].rows * (size_t)p[u].n);
        p[u].w = xmalloc(sizeof *p[u].w * (size_t)p[u].n);
        p[u].n = 0;
    }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            expert_part *q = &p[slot[r->ids[t * k + j]]];
            q->rows[q->n] = t;
            q->w[q->n++] = r->wts[t * k + j];
        }
    free(slot);
    return p;
}

static void expert_parts_free(expert_part *p, int n) {
    for (int u = 0; p && u < n; u++) {
        free(p[u].rows);
        free(p[u].w);
        free(p[u].out);
    }
    free(p);
}

/* Runs expert e on its tokens, keeping weight x output in p->out. */
static int expert_run(df_fwd *f, int e, const df_expert *ex, expert_part *p, const float *z) {
    const df_config *c = &f->m->cfg;
    int Dz = config_expert_dim(c);
    int rc = expert_check(f, e, ex);
    if (rc) return rc;
    float *xg = xmalloc((size_t)p->n * Dz * sizeof(float));
    p->out = xmalloc((size_t)p->n * Dz * sizeof(float));
    for (int i = 0; i < p->n; i++) memcpy(xg + (int64_t)i * Dz, z + (int64_t)p->rows[i] * Dz, Dz * sizeof(float));
    glu_apply(f, &ex->w1, &ex->w3, &ex->w2, c->moe_inter, xg, p->n, p->out);
    for (int i = 0; i < p->n; i++)
        for (int j = 0; j < Dz; j++) p->out[(int64_t)i * Dz + j] *= p->w[i];
    free(xg);
    return DF_OK;
}

/* Runs the batch's experts in the order storage delivers them (compute on early arrivals overlaps the reads
 * of the rest), then adds their outputs into y [T, Dz] in ascending expert order: float addition is not
 * associative, so a fixed order keeps results independent of arrival order, cache state and read-ahead. */
static int experts_apply(df_fwd *f, const df_routing *r, const float *z, int T, float *y) {
    int Dz = config_expert_dim(&f->m->cfg), rc = DF_OK;
    expert_part *p = expert_parts(&f->m->cfg, r, T);
    uint8_t *done = xcalloc((size_t)r->n_uniq + 1, 1);
    for (int got = 0; !rc && got < r->n_uniq; got++) {
        df_expert ex;
        int u = -1;
        double t0 = df_now();
        rc = store_expert_acquire_next(f->m->store, f->layer, r->uniq, r->n_uniq, done, &u, &ex, f->err);
        t0 = model_clock(&f->m->prof.expert_read, t0);
        if (rc) break;
        rc = expert_run(f, r->uniq[u], &ex, &p[u], z);
        store_expert_release(f->m->store, f->layer, r->uniq[u]);
        model_clock(&f->m->prof.expert_compute, t0);
    }
    for (int u = 0; !rc && u < r->n_uniq; u++)
        for (int i = 0; i < p[u].n; i++) {
            float *dst = y + (int64_t)p[u].rows[i] * Dz;
            const float *src = p[u].out + (int64_t)i * Dz;
            for (int j = 0; j < Dz; j++) dst[j] += src[j];
        }
    free(done);
    expert_parts_free(p, r->n_uniq);
    return rc;
}

/* ---- look-ahead (df_engine_opts.lookahead) -------------------------------------------------------- */

/* Guesses layer i+1's experts while layer i runs and hints storage, which decides whether to read them early
 * (readahead.h) and scores the guess against what layer i+1 asks for. The residual stream changes little
 * across one layer, so layer i+1's router (the same scoring and top-k as route_batch) applied to layer i's MoE
 * input, re-normalised with layer i+1's post-attention norm weight instead of layer i's, names most of what
 * layer i+1 will ask for. It only reads ahead: routing and results are untouched, its failures are ignored
 * (the real pass reports them), and it never waits for layer i+1's spine. Returns 1 when it made a guess or
 * storage wants none. */
static int moe_lookahead(df_fwd *f, const float *x, int T) {
    const df_config *c = &f->m->cfg;
    int next = f->layer + 1, d = c->d;
    if (next >= c->n_layers || c->ffn[next] != FFN_MOE) return 1;
    int plan = store_lookahead_plan(f->m->store, next);
    if (!plan) return 1;
    df_error err = {0};
    df_fwd cur = {f->m, f->L, f->layer, &err}, nf = {f->m, NULL, next, &err};
    store_layer_peek(f->m->store, next, &nf.L);
    if (!nf.L) return 0;
    float *wi = fwd_vec(&cur, "post_attention_layernorm.weight", d, 1);
    float *wn = wi ? fwd_vec(&nf, "post_attention_layernorm.weight", d, 1) : NULL;
    df_routing r = {0};
    if (wn) {
        float *xs = xmalloc((size_t)T * d * sizeof(float));
        for (int64_t i = 0; i < (int64_t)T * d; i++) xs[i] = wi[i % d] != 0.0f ? x[i] / wi[i % d] * wn[i % d] : 0.0f;
        if (route_batch(&nf, xs, T, &r) == DF_OK)
            store_experts_hint(f->m->store, next, r.uniq, r.n_uniq, plan == STORE_LOOKAHEAD_READ);
        free(xs);
    }
    store_layer_release(f->m->store, nf.L);
    free(wi);
    free(wn);
    free(r.ids);
    free(r.wts);
    free(r.uniq);
    return 1;
}

/* Latent projections of K3's MoE (absent for Kimi-Linear). */
typedef struct {
    const df_tensor *down, *up;
    float *norm;
} latent_weights;

static int latent_get(df_fwd *f, latent_weights *lw) {
    const df_config *c = &f->m->cfg;
    memset(lw, 0, sizeof *lw);
    if (!c->latent_dim) return DF_OK;
    if (!(lw->down = fwd_mat(f, "block_sparse_moe.routed_expert_down_proj.weight", c->latent_dim, c->d)) ||
        !(lw->up = fwd_mat(f, "block_sparse_moe.routed_expert_up_proj.weight", c->d, c->latent_dim)))
        return f->err->code;
    if (c->latent_norm && !(lw->norm = fwd_vec(f, "block_sparse_moe.routed_expert_norm.weight", c->latent_dim, 1)))
        return f->err->code;
    return DF_OK;
}

/* Routing first, then the reads are issued; everything that needs no routed expert (the next layer's guess,
 * the shared experts, the latent down-projection) runs while they are in flight, then the routed experts in
 * arrival order. */
int moe_forward(df_fwd *f, const float *x, int T, float *out) {
    const df_config *c = &f->m->cfg;
    int Dz = config_expert_dim(c);
    df_routing r = {0};
    latent_weights lw;
    int rc = latent_get(f, &lw);
    if (!rc) rc = route_batch(f, x, T, &r);
    if (!rc) rc = store_experts_prefetch(f->m->store, f->layer, r.uniq, r.n_uniq, f->err);
    int guessed = 0;
    if (!rc) guessed = moe_lookahead(f, x, T);
    float *z = NULL, *y = NULL, *sh = NULL;
    if (!rc && c->n_shared > 0) {
        sh = xmalloc((size_t)T * c->d * sizeof(float));
        rc = ffn_dense_forward(f, "block_sparse_moe.shared_experts.", c->moe_inter * c->n_shared, x, T, sh);
    }
    if (!rc && lw.down) {
        z = xmalloc((size_t)T * Dz * sizeof(float));
        kern_matmul(f->m->kern, lw.down, x, T, z);
    }
    if (!rc) {
        y = xcalloc((size_t)T * Dz, sizeof(float));
        rc = experts_apply(f, &r, z ? z : x, T, y);
    }
    if (!rc && !guessed) moe_lookahead(f, x, T);   /* the next layer's spine may have arrived meanwhile */
    if (!rc && lw.up) {
        for (int t = 0; lw.norm && t < T; t++) kern_rmsnorm(y + (int64_t)t * Dz, y + (int64_t)t * Dz, lw.norm, Dz, c->eps);
        kern_matmul(f->m->kern, lw.up, y, T, out);
    } else if (!rc) {
        memcpy(out, y, (size_t)T * c->d * sizeof(float));
    }
    for (int64_t i = 0; !rc && sh && i < (int64_t)T * c->d; i++) out[i] += sh[i];
    free(sh);
    free(z);
    free(y);
    free(lw.norm);
    free(r.ids);
    free(r.wts);
    free(r.uniq);
    return rc;
}

int moe_check(df_fwd *f) {
    const df_config *c = &f->m->cfg;
    latent_weights lw;
    int rc = latent_get(f, &lw);
    free(lw.norm);
    if (rc) return rc;
    const df_tensor *gate = fwd_mat(f, "block_sparse_moe.gate.weight", c->n_experts, c->d);
    float *bias = gate ? fwd_vec(f, "block_sparse_moe.gate.e_score_correction_bias", c->n_experts, 1) : NULL;
    if (!bias) return f->err->code;
    free(bias);
    int have = store_expert_count(f->m->store, f->layer);
    if (have != c->n_experts) {
        df_error_set(f->err, DF_EFORMAT, "%s: layer %d has %d routed experts in the checkpoint, config says %d",
                     f->m->dir, f->layer, have, c->n_experts);
        return DF_EFORMAT;
    }
    if (c->n_shared > 0) {
        int64_t I = (int64_t)c->moe_inter * c->n_shared;
        if (!fwd_mat(f, "block_sparse_moe.shared_experts.gate_proj.weight", I, c->d) ||
            !fwd_mat(f, "block_sparse_moe.shared_experts.up_proj.weight", I, c->d) ||
            !fwd_mat(f, "block_sparse_moe.shared_experts.down_proj.weight", c->d, I))
            return f->err->code;
    }
    return DF_OK;
}

int ffn_dense_check(df_fwd *f) {
    const df_config *c = &f->m->cfg;
    const char *p = store_layer_tensor(f->L, "mlp.gate_proj.weight") ? "mlp." : "block_sparse_moe.";
    char n[3][96];
    snprintf(n[0], sizeof n[0], "%sgate_proj.weight", p);
    snprintf(n[1], sizeof n[1], "%sup_proj.weight", p);
    snprintf(n[2], sizeof n[2], "%sdown_proj.weight", p);
    if (!fwd_mat(f, n[0], c->dense_inter, c->d) || !fwd_mat(f, n[1], c->dense_inter, c->d) ||
        !fwd_mat(f, n[2], c->d, c->dense_inter))
        return f->err->code;
    return DF_OK;
}
