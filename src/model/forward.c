/* forward.c — the decoder: embedding, the layer loop (ordinary or block-attention residuals), final norm
 * and lm_head; opening the model (bound weights, scratch arena); and the per-conversation state. Layer bodies
 * live in kda.c, mla.c, moe.c and attn_res.c. Activations are fp32 throughout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layer.h"
#include "common/util.h"

double model_clock(double *phase, double t0) {
    double t = df_now();
    *phase += t - t0;
    return t;
}

/* ---- state ----------------------------------------------------------------------------------------- */

/* The layers' memory is the backend's (model_ops.mem_*): host memory for the CPU, device memory for a GPU. */
static size_t kda_S_bytes(const df_config *c) { return (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float); }
static size_t kda_conv_bytes(const df_config *c) {
    return (size_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim * sizeof(float);
}

df_state *state_new(df_model *m) {
    const df_config *c = &m->cfg;
    df_state *s = xcalloc(1, sizeof *s);
    s->m = m;
    s->n_layers = c->n_layers;
    s->rec_max = DF_ROLLBACK_ROWS_DEFAULT;
    s->layers = xcalloc(c->n_layers, sizeof *s->layers);
    for (int i = 0; i < c->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            l->S = m->ops->mem_alloc(m, kda_S_bytes(c));
            l->conv = m->ops->mem_alloc(m, kda_conv_bytes(c) + sizeof(float));
        }
    }
    return s;
}

void state_free(df_state *s) {
    if (!s) return;
    df_model *m = s->m;
    for (int i = 0; i < s->n_layers; i++) {
        m->ops->mem_free(m, s->layers[i].S);
        m->ops->mem_free(m, s->layers[i].conv);
        m->ops->mem_free(m, s->layers[i].c);
        m->ops->mem_free(m, s->layers[i].r);
        m->ops->mem_free(m, s->layers[i].rec);
    }
    free(s->layers);
    free(s);
}

void state_reset(df_model *m, df_state *s) {
    const df_config *c = &m->cfg;
    for (int i = 0; i < s->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (l->S) m->ops->mem_zero(m, l->S, kda_S_bytes(c));
        if (l->conv) m->ops->mem_zero(m, l->conv, kda_conv_bytes(c));
    }
    s->pos = 0;
    s->rec_valid = 0;
}

static size_t mla_row_c(const df_config *c) { return (size_t)c->kv_lora * sizeof(float); }
static size_t mla_row_r(const df_config *c) { return (size_t)(c->rope ? c->rope : 1) * sizeof(float); }

static void mla_reserve(df_model *m, df_layer_state *l, int64_t need) {
    const df_config *c = &m->cfg;
    if (need <= l->cap) return;
    int64_t cap = l->cap ? l->cap : 64;
    while (cap < need) cap *= 2;
    l->c = m->ops->mem_realloc(m, l->c, (size_t)l->cap * mla_row_c(c), (size_t)cap * mla_row_c(c));
    l->r = m->ops->mem_realloc(m, l->r, (size_t)l->cap * mla_row_r(c), (size_t)cap * mla_row_r(c));
    l->cap = cap;
}

/* A KDA layer's recurrent and convolution state. */
static void kda_copy(df_model *m, df_layer_state *d, const df_layer_state *s) {
    m->ops->mem_copy(m, d->S, s->S, kda_S_bytes(&m->cfg));
    m->ops->mem_copy(m, d->conv, s->conv, kda_conv_bytes(&m->cfg));
}

/* An MLA layer's latents and rope keys of positions 0..pos-1. */
static void mla_copy_prefix(df_model *m, df_layer_state *d, const df_layer_state *s, int64_t pos) {
    const df_config *c = &m->cfg;
    if (!pos) return;
    mla_reserve(m, d, pos);
    m->ops->mem_copy(m, d->c, s->c, (size_t)pos * c->kv_lora * sizeof(float));
    m->ops->mem_copy(m, d->r, s->r, (size_t)pos * c->rope * sizeof(float));
}

void state_copy(df_model *m, df_state *dst, const df_state *src) {
    const df_config *c = &m->cfg;
    for (int i = 0; i < src->n_layers; i++) {
        df_layer_state *d = &dst->layers[i];
        const df_layer_state *s = &src->layers[i];
        if (s->S) kda_copy(m, d, s);
        else mla_copy_prefix(m, d, s, src->pos);
        if (src->rec_valid && s->rec) {
            int64_t nf = kda_record_floats(c, src->rec_T);
            if (nf > d->rec_cap) {
                d->rec = m->ops->mem_realloc(m, d->rec, (size_t)d->rec_cap * sizeof(float), (size_t)nf * sizeof(float));
                d->rec_cap = nf;
            }
            m->ops->mem_copy(m, d->rec, s->rec, (size_t)nf * sizeof(float));
        }
    }
    dst->pos = src->pos;
    dst->rec_valid = src->rec_valid;
    dst->rec_T = src->rec_T;
    dst->rec_pos0 = src->rec_pos0;
}

int state_rewind(df_model *m, df_state *s, int64_t pos) {
    if (!s->rec_valid || pos < s->rec_pos0 || pos > s->pos) return -1;
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i].S) m->ops->kda_rewind(m, &s->layers[i], s->rec_T, (int)(pos - s->rec_pos0));
    s->pos = pos;
    return 0;
}

/* Completes a snapshot of s at pos taken during the pass that just ended: a recording pass rebuilds the KDA
 * layers from its record (on a copy); otherwise mixer_forward copied them at pos, and the MLA layers' caches
 * up to pos are a prefix of s's. */
void state_snapshot_finish(df_model *m, df_state *snap, const df_state *s, int64_t pos) {
    const df_config *c = &m->cfg;
    if (s->rec_valid) {
        state_copy(m, snap, s);
        state_rewind(m, snap, pos);
    } else {
        for (int i = 0; i < c->n_layers; i++)
            if (!s->layers[i].S) mla_copy_prefix(m, &snap->layers[i], &s->layers[i], pos);
        snap->pos = pos;
    }
    snap->rec_valid = 0;
}

void state_set_record_rows(df_state *s, int rows) {
    s->rec_max = rows > 0 ? rows : 0;
    if (rows > 0) return;
    s->rec_valid = 0;
    for (int i = 0; i < s->n_layers; i++) {
        s->m->ops->mem_free(s->m, s->layers[i].rec);
        s->layers[i].rec = NULL;
        s->layers[i].rec_cap = 0;
    }
}

uint64_t state_bytes(const df_model *m, const df_state *s) {
    const df_config *c = &m->cfg;
    uint64_t n = 0;
    for (int i = 0; i < s->n_layers; i++) {
        const df_layer_state *l = &s->layers[i];
        n += (uint64_t)l->rec_cap * sizeof(float) + (uint64_t)l->cap * (c->kv_lora + (c->rope ? c->rope : 1)) * 4;
    }
    return n + state_blob_size(m, 0);
}

static uint64_t record_bytes(const df_config *c, int rows) {
    if (rows < 2) return 0;
    uint64_t n = 0;
    for (int i = 0; i < c->n_layers; i++)
        if (c->mixer[i] == MIXER_KDA) n += (uint64_t)kda_record_floats(c, rows) * sizeof(float);
    return n;
}

/* Mirrors state_new (KDA S and conv tails), the MLA cache's doubling growth from 64 positions, the session's
 * history and last logits, and the rollback record. */
uint64_t state_bytes_for(const df_config *c, int64_t n_tokens, int rollback_rows) {
    int64_t cap = 64;
    while (cap < n_tokens) cap *= 2;
    uint64_t bytes = (uint64_t)c->vocab * sizeof(float) + (uint64_t)cap * 2 * sizeof(int32_t);
    for (int i = 0; i < c->n_layers; i++) {
        if (c->mixer[i] == MIXER_KDA) {
            uint64_t pk = (uint64_t)c->kda_heads * c->kda_dim;
            bytes += ((uint64_t)c->kda_heads * c->kda_dim * c->kda_dim + (uint64_t)(c->conv_w - 1) * 3 * pk + 1) *
                     sizeof(float);
        } else {
            bytes += (uint64_t)cap * (uint64_t)(c->kv_lora + (c->rope ? c->rope : 1)) * sizeof(float);
        }
    }
    return bytes + record_bytes(c, rollback_rows);
}

/* The blob: per layer in order, KDA S and conv, or the first pos rows of the MLA latents and rope keys. */
uint64_t state_blob_size(const df_model *m, int64_t pos) {
    const df_config *c = &m->cfg;
    uint64_t kda = (uint64_t)c->kda_heads * c->kda_dim * c->kda_dim +
                   (uint64_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim;
    uint64_t mla = (uint64_t)pos * (c->kv_lora + c->rope), n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->mixer[i] == MIXER_KDA ? kda : mla;
    return n * sizeof(float);
}

void state_blob_put(const df_model *mc, const df_state *s, uint8_t *out) {
    df_model *m = s->m;
    const df_config *c = &mc->cfg;
    size_t nS = kda_S_bytes(c), nconv = kda_conv_bytes(c);
    size_t nc = (size_t)s->pos * c->kv_lora * sizeof(float), nr = (size_t)s->pos * c->rope * sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        const df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            m->ops->mem_to_host(m, out, l->S, nS);
            m->ops->mem_to_host(m, out + nS, l->conv, nconv);
            out += nS + nconv;
        } else if (s->pos) {
            m->ops->mem_to_host(m, out, l->c, nc);
            m->ops->mem_to_host(m, out + nc, l->r, nr);
            out += nc + nr;
        }
    }
}

void state_blob_get(df_model *m, df_state *s, int64_t pos, const uint8_t *in) {
    const df_config *c = &m->cfg;
    size_t nS = kda_S_bytes(c), nconv = kda_conv_bytes(c);
    size_t nc = (size_t)pos * c->kv_lora * sizeof(float), nr = (size_t)pos * c->rope * sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            m->ops->mem_from_host(m, l->S, in, nS);
            m->ops->mem_from_host(m, l->conv, in + nS, nconv);
            in += nS + nconv;
        } else if (pos) {
            mla_reserve(m, l, pos);
            m->ops->mem_from_host(m, l->c, in, nc);
            m->ops->mem_from_host(m, l->r, in + nc, nr);
            in += nc + nr;
        }
    }
    s->pos = pos;
    s->rec_valid = 0;
}

/* ---- the layer loop ------------------------------------------------------------------------------- */

typedef struct {
    float *buf;     /* [T, d] scratch */
    float *norm;    /* [T, d] */
} fwd_scratch;

int fwd_need(df_fwd *f, const df_tensor *w) {
    if (!f->L) return DF_OK;       /* weights resident in the backend */
    double t0 = df_now();
    int rc = store_layer_need(f->m->store, f->L, w, f->err);
    model_clock(&f->m->prof.spine_read, t0);
    return rc;
}

int fwd_matmul_n(df_fwd *f, int n, const df_tensor *const *w, const float *x, int T, float *const *out) {
    if (f->remote) {   /* one round trip for the n projections of x */
        const model_peers *p = f->m->peers;
        const char *keys[MODEL_MATMUL_MAX];
        DF_ASSERT(n >= 1 && n <= MODEL_MATMUL_MAX);
        for (int i = 0; i < n; i++) keys[i] = store_layer_tensor_key(f->L, w[i]);
        double t0 = df_now();
        int rc = p->matmul(p->ctx, f->layer, n, keys, w, x, T, out, f->err);
        model_clock(&f->m->prof.spine_remote, t0);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        int rc = fwd_matmul(f, w[i], x, T, out[i]);
        if (rc) return rc;
    }
    return DF_OK;
}

int fwd_matmul(df_fwd *f, const df_tensor *w, const float *x, int T, float *out) {
    if (f->remote) return fwd_matmul_n(f, 1, &w, x, T, &out);
    int rc = fwd_need(f, w);
    if (!rc) kern_matmul(f->m->kern, w, x, T, out);
    return rc;
}

static void rms_rows(df_fwd *f, const float *w, const float *x, int T, float *out) {
    f->m->ops->rmsnorm(f->m, w, x, T, out);
}

/* The sessions of the pass in progress, for the mixers. */
typedef struct {
    fwd_seg *seg;
    int n;
    int mixed;      /* layers whose mixer has changed the states (a failed MLA mixer changes nothing) */
    int torn;       /* a KDA mixer failed part-way (reading a part of its layer): its states are lost */
} pass_segs;

/* Rows a mixer takes at once. KDA and MLA run each session's rows in order, carrying their state from row to
 * row, so a pass cut into blocks computes what passes of those blocks would (bit for bit with kernels whose
 * sums do not depend on the row count); blocks bound the mixers' per-row projections (6 x 12,288 floats a
 * row for K3's KDA), which would otherwise set how long a prompt one pass (one read of each expert) can take. */
#define MIXER_BLOCK_ROWS MODEL_BLOCK_ROWS

static int mixer_run(df_fwd *f, const fwd_seg *seg, int n, const float *xn, int T, float *out) {
    if (f->m->cfg.mixer[f->layer] == MIXER_KDA) return f->m->ops->kda(f, seg, n, xn, T, out);
    return f->m->ops->mla(f, seg, n, xn, T, out);
}

/* The pass's rows in blocks of about MIXER_BLOCK_ROWS: a segment longer than a block's room is split at
 * its position, except one that records for rollback, which a block takes whole (it is short); a block also
 * ends where a segment's snapshot is taken, so the KDA state there can be copied. */
static int mixer_forward(df_fwd *f, pass_segs *ps, const float *xn, int T, float *out) {
    const df_config *c = &f->m->cfg;
    int d = c->d, rc = DF_OK, j = 0, in_j = 0, kda = c->mixer[f->layer] == MIXER_KDA;
    if (!kda)
        for (int i = 0; i < ps->n; i++)
            mla_reserve(f->m, &ps->seg[i].s->layers[f->layer], ps->seg[i].pos + ps->seg[i].T);
    size_t mark = scratch_mark(f->sc);
    fwd_seg *sub = SCRATCH_NEW(f->sc, fwd_seg, ps->n);
    for (int r0 = 0; !rc && r0 < T;) {
        int n = 0, rows = 0;
        while (j < ps->n && rows < MIXER_BLOCK_ROWS) {
            const fwd_seg *s = &ps->seg[j];
            int take = s->record ? s->T : DF_MIN(s->T - in_j, MIXER_BLOCK_ROWS - rows);
            int64_t at = s->pos + in_j;
            if (s->snap && at < s->snap_at && at + take > s->snap_at) take = (int)(s->snap_at - at);
            sub[n++] = (fwd_seg){s->s, rows, take, at, s->record, s->snap, s->snap_at};
            rows += take;
            in_j += take;
            if (in_j == s->T) j++, in_j = 0;
            if (s->snap && at + take == s->snap_at) break;   /* the block ends at the snapshot */
        }
        rc = mixer_run(f, sub, n, xn + (int64_t)r0 * d, rows, out + (int64_t)r0 * d);
        for (int i = 0; !rc && kda && i < n; i++)
            if (sub[i].snap && sub[i].pos + sub[i].T == sub[i].snap_at)
                kda_copy(f->m, &sub[i].snap->layers[f->layer], &sub[i].s->layers[f->layer]);
        r0 += rows;
    }
    scratch_release(f->sc, mark);
    if (!rc) ps->mixed = f->layer + 1;
    else if (kda) ps->torn = 1;
    return rc;
}

static int ffn_forward(df_fwd *f, const float *xn, int T, float *out) {
    if (f->m->cfg.ffn[f->layer] == FFN_MOE) return f->m->ops->moe(f, xn, T, out);
    return f->m->ops->dense(f, xn, T, out);
}

static void guess(df_fwd *f, const float *h, int T) {
    if (f->m->ops->guess) f->m->ops->guess(f, h, T);
}

/* Ordinary pre-norm residual layer: h += mixer(norm(h)); h += ffn(norm(h)). */
static int layer_plain(df_fwd *f, pass_segs *s, float *h, int T, fwd_scratch *sc) {
    df_model *m = f->m;
    int64_t n = (int64_t)T * m->cfg.d;
    guess(f, h, T);
    rms_rows(f, f->w->attn_norm, h, T, sc->norm);
    int rc = mixer_forward(f, s, sc->norm, T, sc->buf);
    if (rc) return rc;
    m->ops->add(m, h, sc->buf, n);
    rms_rows(f, f->w->ffn_norm, h, T, sc->norm);
    rc = ffn_forward(f, sc->norm, T, sc->buf);
    if (rc) return rc;
    m->ops->add(m, h, sc->buf, n);
    return DF_OK;
}

/* Block attention residuals. blocks holds nb [T, d] block vectors; p is the running partial
 * block; *p_empty says the previous block was just closed (p = None in the spec). */
typedef struct {
    float **blocks;
    int nb;
    float *p;
    int p_empty;
} attnres_state;

static void res_mix(df_fwd *f, attnres_state *ar, const float *wn, const float *wp, int T, float *out) {
    f->m->ops->attn_res(f->m, ar->blocks, ar->nb, ar->p, wn, wp, T, out);
}

static int layer_attnres(df_fwd *f, pass_segs *s, attnres_state *ar, int T, fwd_scratch *sc, float *x) {
    df_model *m = f->m;
    const df_config *c = &m->cfg;
    int64_t n = (int64_t)T * c->d;
    if (ar->nb) res_mix(f, ar, f->w->attn_res_norm, f->w->attn_res_proj, T, x);
    else m->ops->copy(m, x, ar->p, n);
    if (f->layer % c->attn_res_block == 0) {       /* close the previous block */
        ar->blocks[ar->nb++] = ar->p;
        ar->p = m->ops->act(m, n);
        ar->p_empty = 1;
    }
    guess(f, x, T);
    rms_rows(f, f->w->attn_norm, x, T, sc->norm);
    int rc = mixer_forward(f, s, sc->norm, T, sc->buf);
    if (rc) return rc;
    if (ar->p_empty) m->ops->copy(m, ar->p, sc->buf, n);
    else m->ops->add(m, ar->p, sc->buf, n);
    ar->p_empty = 0;
    res_mix(f, ar, f->w->mlp_res_norm, f->w->mlp_res_proj, T, x);
    rms_rows(f, f->w->ffn_norm, x, T, sc->norm);
    rc = ffn_forward(f, sc->norm, T, sc->buf);
    if (rc) return rc;
    m->ops->add(m, ar->p, sc->buf, n);
    return DF_OK;
}

static int embed_tokens(df_model *m, const int32_t *tokens, int T, float *h, df_error *err) {
    const df_config *c = &m->cfg;
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab) {
            df_error_set(err, DF_EINVAL, "token id %d at position %d is outside the vocabulary (0..%d)", tokens[t],
                         t, c->vocab - 1);
            return DF_EINVAL;
        }
    }
    return m->ops->embed(m, tokens, T, h, err);
}

static void output_attnres(df_model *m, attnres_state *ar, int T, float *h) {
    m->ops->attn_res(m, ar->blocks, ar->nb, ar->p, m->w.out_res_norm, m->w.out_res_proj, T, h);
}

/* Calls each session's step callback after a layer; any non-zero return cancels the pass. */
static int pass_step(const pass_segs *ps, int layer, int n_layers, df_error *err) {
    for (int j = 0; j < ps->n; j++) {
        df_state *s = ps->seg[j].s;
        if (s->step && s->step(s->step_ctx, layer, n_layers)) {
            df_error_set(err, DF_ECANCELLED, "evaluation cancelled after layer %d", layer);
            return DF_ECANCELLED;
        }
    }
    return DF_OK;
}

static int pass_check(const df_config *c, const model_seg *seg, int n_seg, df_error *err) {
    for (int j = 0; j < n_seg || !n_seg; j++) {
        if (!n_seg || seg[j].T <= 0) {
            df_error_set(err, DF_EINVAL, "no tokens to evaluate");
            return DF_EINVAL;
        }
        if (seg[j].s->pos + seg[j].T > c->max_ctx) {
            df_error_set(err, DF_EINVAL, "context of %lld tokens exceeds the model's %lld",
                         (long long)(seg[j].s->pos + seg[j].T), (long long)c->max_ctx);
            return DF_EINVAL;
        }
        for (int i = 0; i < j; i++)
            if (seg[i].s == seg[j].s) {
                df_error_set(err, DF_EINVAL, "a session appears twice in one pass");
                return DF_EINVAL;
            }
    }
    return DF_OK;
}

int model_forward_batch(df_model *m, model_seg *seg, int n_seg, const int32_t *tokens, df_error *err) {
    const df_config *c = &m->cfg;
    const model_ops *ops = m->ops;
    int rc = pass_check(c, seg, n_seg, err);
    if (rc) return rc;
    double t_start = df_now();
    scratch *sa = &m->sc;
    pass_segs ps = {.seg = SCRATCH_NEW(sa, fwd_seg, n_seg), .n = n_seg};
    int T = 0;
    for (int j = 0; j < n_seg; j++) {
        int record = state_records(seg[j].s, seg[j].T);
        ps.seg[j] = (fwd_seg){seg[j].s, T, seg[j].T, seg[j].s->pos, record, record ? NULL : seg[j].snap, seg[j].snap_at};
        seg[j].restored = 0;
        seg[j].s->rec_valid = 0;
        T += seg[j].T;
    }
    rc = ops->pass_begin(m, seg, n_seg, T, err);
    int64_t n = (int64_t)T * c->d;
    float *h = NULL;
    fwd_scratch sc = {0};
    attnres_state ar = {0};
    if (!rc) {
        h = ops->act(m, n);
        sc = (fwd_scratch){ops->act(m, n), ops->act(m, n)};
        rc = embed_tokens(m, tokens, T, h, err);
    }
    if (!rc && c->attn_res_block) {
        ar.blocks = SCRATCH_NEW(sa, float *, c->n_layers / c->attn_res_block + 2);
        ar.p = h;
        h = ops->act(m, n);
    }
    for (int i = 0; !rc && i < c->n_layers; i++) {
        df_fwd f = {.m = m, .w = &m->w.layers[i], .layer = i, .sc = sa, .err = err};
        const df_store_layer *L = NULL;
        double t0 = df_now();
        if (!ops->weights_resident) rc = store_layer_acquire(m->store, i, &L, err);
        model_clock(&m->prof.spine_read, t0);
        if (rc) break;
        f.L = L;
        f.remote = m->peers && m->peers->spine_rank && m->peers->spine_rank[i] != 0;
        rc = c->attn_res_block ? layer_attnres(&f, &ps, &ar, T, &sc, h) : layer_plain(&f, &ps, h, T, &sc);
        if (L) store_layer_release(m->store, L);
        if (!rc) rc = pass_step(&ps, i, c->n_layers, err);
    }
    if (!rc && c->attn_res_block) output_attnres(m, &ar, T, h);
    int want_logits = 0;
    for (int j = 0; j < n_seg; j++) want_logits |= seg[j].logits != NULL;
    if (!rc && want_logits) rc = ops->head(m, h, seg, n_seg, err);
    rc = ops->pass_end(m, rc, err);
    for (int j = 0; j < n_seg; j++) {
        df_state *s = seg[j].s;
        int recorded = state_records(s, seg[j].T);
        if (!rc) {
            s->rec_valid = recorded;
            s->rec_T = seg[j].T;
            s->rec_pos0 = s->pos;
            s->pos += seg[j].T;
        } else if (!ps.torn && (recorded || !ps.mixed)) {
            /* Put back as before the pass: the KDA layers from the record's start, MLA by position. */
            for (int i = 0; i < ps.mixed; i++)
                if (s->layers[i].S) ops->kda_rewind(m, &s->layers[i], seg[j].T, 0);
            seg[j].restored = 1;
        }
    }
    for (int j = 0; !rc && j < n_seg; j++)
        if (seg[j].snap) state_snapshot_finish(m, seg[j].snap, seg[j].s, seg[j].snap_at);
    model_clock(&m->prof.total, t_start);
    scratch_end_pass(sa);
    return rc;
}

/* ---- opening and checking ------------------------------------------------------------------------- */

/* Logit rows over several sessions that the arena is sized for (a single session's are written in place);
 * more grow it once. */
#define MODEL_HEAD_ROWS 64

size_t model_scratch_bytes(const df_model *m, int T) {
    const df_config *c = &m->cfg;
    int nt = m->kern->n_threads, kda = 0, mla = 0, moe = 0, dense = 0;
    for (int i = 0; i < c->n_layers; i++) {
        kda |= c->mixer[i] == MIXER_KDA;
        mla |= c->mixer[i] == MIXER_MLA;
        moe |= c->ffn[i] == FFN_MOE;
        dense |= c->ffn[i] != FFN_MOE;
    }
    size_t td = scratch_size((size_t)T * c->d, sizeof(float));
    size_t pass = scratch_size(T, sizeof(fwd_seg)) + 3 * td;
    if (c->attn_res_block) {
        int nb = c->n_layers / c->attn_res_block + 2;
        pass += scratch_size(nb, sizeof(float *)) + (size_t)nb * td;
    }
    int64_t rows = DF_MIN(T, MODEL_HEAD_ROWS), per = 0;
    int tiles = store_head_tiles(m->store, &per);
    size_t layer = scratch_size((size_t)rows * c->vocab, sizeof(float)) + td +
                   (tiles > 1 ? scratch_size((size_t)rows * per, sizeof(float)) : 0);
    int64_t S = DF_MIN(c->max_ctx, (int64_t)T + MODEL_SCORE_POSITIONS);
    int B = DF_MIN(T, MIXER_BLOCK_ROWS);
    size_t blocks = scratch_size(T, sizeof(fwd_seg));
    if (kda) layer = DF_MAX(layer, blocks + kda_scratch_bytes(c, B, nt));
    if (mla) layer = DF_MAX(layer, blocks + mla_scratch_bytes(c, B, nt, S));
    if (moe) layer = DF_MAX(layer, DF_MAX(moe_scratch_bytes(c, T), moe_guess_scratch_bytes(c, T)));
    if (dense) layer = DF_MAX(layer, glu_scratch_bytes(c->dense_inter, T));
    return pass + layer;
}

int model_init(df_model *m, int rows, df_error *err) {
    if (!m->ops) m->ops = model_ops_cpu();
    int rc = model_weights_bind(m, err);
    if (rc) {
        model_weights_free(&m->w);
        return rc;
    }
    scratch_init(&m->sc, model_scratch_bytes(m, rows));
    return DF_OK;
}

void model_free(df_model *m) {
    model_weights_free(&m->w);
    scratch_free(&m->sc);
}

int model_check(df_model *m, df_error *err) {
    for (int i = 0; i < m->cfg.n_layers; i++) {
        int rc = store_layer_check(m->store, i, err);
        if (rc) return rc;
    }
    return DF_OK;
}
