/* forward.c — the decoder: embedding, the layer loop (ordinary or block-attention residuals), final norm
 * and lm_head; checked tensor access; and the per-conversation state. Layer bodies live in kda.c, mla.c,
 * moe.c and attn_res.c. Activations are fp32 throughout. */
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

/* ---- checked tensor access ------------------------------------------------------------------------ */

static int dtype_is_matrix(df_dtype dt) {
    return dt == DF_DT_F32 || dt == DF_DT_BF16 || dt == DF_DT_F16 || dt == DF_DT_MXFP4 || dt == DF_DT_I8;
}

int tensor_check_mat(const df_tensor *t, const char *name, int64_t rows, int64_t cols, const char *dir,
                     df_error *err) {
    if (!t) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s is missing from the checkpoint", dir, name);
        return DF_EFORMAT;
    }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[96] = "";
        for (int i = 0, o = 0; i < t->ndim && o < 80; i++)
            o += snprintf(got + o, sizeof got - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has shape [%s], expected [%lld,%lld]", dir, t->name, got,
                     (long long)rows, (long long)cols);
        return DF_EFORMAT;
    }
    if (!dtype_is_matrix(t->dtype)) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has dtype %s, not usable as a weight matrix", dir, t->name,
                     tensor_dtype_name(t->dtype));
        return DF_EFORMAT;
    }
    if (t->dtype == DF_DT_MXFP4 && cols % 32) {
        df_error_set(err, DF_EFORMAT, "%s: MXFP4 tensor %s has %lld columns, not a multiple of 32", dir, t->name,
                     (long long)cols);
        return DF_EFORMAT;
    }
    return DF_OK;
}

static float *vec_check_convert(const df_tensor *t, const char *name, int64_t n, int exact, const char *dir,
                                df_error *err) {
    if (!t) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s is missing from the checkpoint", dir, name);
        return NULL;
    }
    int64_t numel = tensor_numel(t);
    if (numel < n || (exact && numel != n) ||
        !(t->dtype == DF_DT_F32 || t->dtype == DF_DT_BF16 || t->dtype == DF_DT_F16)) {
        df_error_set(err, DF_EFORMAT, "%s: tensor %s has %lld %s elements, expected %s%lld float values", dir,
                     t->name, (long long)numel, tensor_dtype_name(t->dtype), exact ? "" : "at least ",
                     (long long)n);
        return NULL;
    }
    float *v = xmalloc(numel * sizeof(float));
    tensor_to_f32(t, v);
    return v;
}

static void layer_name(char *buf, size_t cap, int layer, const char *suffix) {
    snprintf(buf, cap, "model.layers.%d.%s", layer, suffix);
}

const df_tensor *fwd_mat(df_fwd *f, const char *suffix, int64_t rows, int64_t cols) {
    const df_tensor *t = store_layer_tensor(f->L, suffix);
    char name[256];
    layer_name(name, sizeof name, f->layer, suffix);
    return tensor_check_mat(t, name, rows, cols, f->m->dir, f->err) ? NULL : t;
}

float *fwd_vec(df_fwd *f, const char *suffix, int64_t n, int exact) {
    char name[256];
    layer_name(name, sizeof name, f->layer, suffix);
    return vec_check_convert(store_layer_tensor(f->L, suffix), name, n, exact, f->m->dir, f->err);
}

const df_tensor *model_global_mat(df_model *m, const char *name, int64_t rows, int64_t cols, df_error *err) {
    const df_tensor *t = store_global(m->store, name);
    return tensor_check_mat(t, name, rows, cols, m->dir, err) ? NULL : t;
}

float *model_global_vec(df_model *m, const char *name, int64_t n, df_error *err) {
    return vec_check_convert(store_global(m->store, name), name, n, 1, m->dir, err);
}

/* ---- state ---------------------------------------------------------------------------------------- */

df_state *state_new(const df_model *m) {
    const df_config *c = &m->cfg;
    df_state *s = xcalloc(1, sizeof *s);
    s->n_layers = c->n_layers;
    s->rec_max = MODEL_RECORD_ROWS;
    s->layers = xcalloc(c->n_layers, sizeof *s->layers);
    for (int i = 0; i < c->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            int64_t pk = (int64_t)c->kda_heads * c->kda_dim;
            l->S = xcalloc((size_t)c->kda_heads * c->kda_dim * c->kda_dim, sizeof(float));
            l->conv = xcalloc((size_t)(c->conv_w - 1) * 3 * pk + 1, sizeof(float));
        }
    }
    return s;
}

void state_free(df_state *s) {
    if (!s) return;
    for (int i = 0; i < s->n_layers; i++) {
        free(s->layers[i].S);
        free(s->layers[i].conv);
        free(s->layers[i].c);
        free(s->layers[i].r);
        free(s->layers[i].rec);
    }
    free(s->layers);
    free(s);
}

void state_reset(const df_model *m, df_state *s) {
    const df_config *c = &m->cfg;
    int64_t pk = (int64_t)c->kda_heads * c->kda_dim;
    for (int i = 0; i < s->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (l->S) memset(l->S, 0, (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float));
        if (l->conv) memset(l->conv, 0, (size_t)(c->conv_w - 1) * 3 * pk * sizeof(float));
    }
    s->pos = 0;
    s->rec_valid = 0;
}

static void mla_reserve(const df_config *c, df_layer_state *l, int64_t need) {
    if (need <= l->cap) return;
    int64_t cap = l->cap ? l->cap : 64;
    while (cap < need) cap *= 2;
    l->c = xrealloc(l->c, (size_t)cap * c->kv_lora * sizeof(float));
    l->r = xrealloc(l->r, (size_t)cap * (c->rope ? c->rope : 1) * sizeof(float));
    l->cap = cap;
}

void state_copy(const df_model *m, df_state *dst, const df_state *src) {
    const df_config *c = &m->cfg;
    int64_t pk = (int64_t)c->kda_heads * c->kda_dim;
    for (int i = 0; i < src->n_layers; i++) {
        df_layer_state *d = &dst->layers[i];
        const df_layer_state *s = &src->layers[i];
        if (s->S) {
            memcpy(d->S, s->S, (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float));
            memcpy(d->conv, s->conv, (size_t)(c->conv_w - 1) * 3 * pk * sizeof(float));
        } else if (src->pos) {
            mla_reserve(c, d, src->pos);
            memcpy(d->c, s->c, (size_t)src->pos * c->kv_lora * sizeof(float));
            memcpy(d->r, s->r, (size_t)src->pos * c->rope * sizeof(float));
        }
        if (src->rec_valid && s->rec) {
            int64_t nf = kda_record_floats(c, src->rec_T);
            if (nf > d->rec_cap) {
                d->rec = xrealloc(d->rec, (size_t)nf * sizeof(float));
                d->rec_cap = nf;
            }
            memcpy(d->rec, s->rec, (size_t)nf * sizeof(float));
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
        if (s->layers[i].S) kda_rewind(m, &s->layers[i], s->rec_T, (int)(pos - s->rec_pos0));
    s->pos = pos;
    return 0;
}

void state_set_record_rows(df_state *s, int rows) {
    s->rec_max = rows > 0 ? rows : 0;
    if (rows > 0) return;
    s->rec_valid = 0;
    for (int i = 0; i < s->n_layers; i++) {
        free(s->layers[i].rec);
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

/* The blob: per layer in order, KDA S and conv, or the first pos rows of the MLA latents and rope keys. */
uint64_t state_blob_size(const df_model *m, int64_t pos) {
    const df_config *c = &m->cfg;
    uint64_t kda = (uint64_t)c->kda_heads * c->kda_dim * c->kda_dim +
                   (uint64_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim;
    uint64_t mla = (uint64_t)pos * (c->kv_lora + c->rope), n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->mixer[i] == MIXER_KDA ? kda : mla;
    return n * sizeof(float);
}

void state_blob_put(const df_model *m, const df_state *s, uint8_t *out) {
    const df_config *c = &m->cfg;
    size_t nS = (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float);
    size_t nconv = (size_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim * sizeof(float);
    size_t nc = (size_t)s->pos * c->kv_lora * sizeof(float), nr = (size_t)s->pos * c->rope * sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        const df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            memcpy(out, l->S, nS);
            memcpy(out + nS, l->conv, nconv);
            out += nS + nconv;
        } else if (s->pos) {
            memcpy(out, l->c, nc);
            memcpy(out + nc, l->r, nr);
            out += nc + nr;
        }
    }
}

void state_blob_get(const df_model *m, df_state *s, int64_t pos, const uint8_t *in) {
    const df_config *c = &m->cfg;
    size_t nS = (size_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float);
    size_t nconv = (size_t)(c->conv_w - 1) * 3 * c->kda_heads * c->kda_dim * sizeof(float);
    size_t nc = (size_t)pos * c->kv_lora * sizeof(float), nr = (size_t)pos * c->rope * sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        df_layer_state *l = &s->layers[i];
        if (c->mixer[i] == MIXER_KDA) {
            memcpy(l->S, in, nS);
            memcpy(l->conv, in + nS, nconv);
            in += nS + nconv;
        } else if (pos) {
            mla_reserve(c, l, pos);
            memcpy(l->c, in, nc);
            memcpy(l->r, in + nc, nr);
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

static int rms_rows(df_fwd *f, const char *suffix, const float *x, int T, float *out) {
    int d = f->m->cfg.d;
    float *w = fwd_vec(f, suffix, d, 1);
    if (!w) return f->err->code;
    for (int t = 0; t < T; t++) kern_rmsnorm(out + (int64_t)t * d, x + (int64_t)t * d, w, d, f->m->cfg.eps);
    free(w);
    return DF_OK;
}

/* The sessions of the pass in progress, for the mixers. */
typedef struct {
    fwd_seg *seg;
    int n;
    int mixed;      /* layers whose mixer has changed the states (a failed mixer changes nothing) */
} pass_segs;

static int mixer_forward(df_fwd *f, pass_segs *ps, const float *xn, int T, float *out) {
    int rc;
    if (f->m->cfg.mixer[f->layer] == MIXER_KDA) {
        rc = kda_forward(f, ps->seg, ps->n, xn, T, out);
    } else {
        for (int j = 0; j < ps->n; j++)
            mla_reserve(&f->m->cfg, &ps->seg[j].s->layers[f->layer], ps->seg[j].s->pos + ps->seg[j].T);
        rc = mla_forward(f, ps->seg, ps->n, xn, T, out);
    }
    if (!rc) ps->mixed = f->layer + 1;
    return rc;
}

static int ffn_forward(df_fwd *f, const float *xn, int T, float *out) {
    const df_config *c = &f->m->cfg;
    if (c->ffn[f->layer] == FFN_MOE) return moe_forward(f, xn, T, out);
    /* transformers' save_pretrained renames the dense layer to block_sparse_moe.; accept both */
    const char *prefix = store_layer_tensor(f->L, "mlp.gate_proj.weight") ? "mlp." : "block_sparse_moe.";
    return ffn_dense_forward(f, prefix, c->dense_inter, xn, T, out);
}

/* Ordinary pre-norm residual layer: h += mixer(norm(h)); h += ffn(norm(h)). */
static int layer_plain(df_fwd *f, pass_segs *s, float *h, int T, fwd_scratch *sc) {
    int64_t n = (int64_t)T * f->m->cfg.d;
    int rc = rms_rows(f, "input_layernorm.weight", h, T, sc->norm);
    if (!rc) rc = mixer_forward(f, s, sc->norm, T, sc->buf);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) h[i] += sc->buf[i];
    rc = rms_rows(f, "post_attention_layernorm.weight", h, T, sc->norm);
    if (!rc) rc = ffn_forward(f, sc->norm, T, sc->buf);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) h[i] += sc->buf[i];
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

static int res_mix(df_fwd *f, attnres_state *ar, const char *stem, int T, float *out) {
    int d = f->m->cfg.d;
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "%s_norm.weight", stem);
    snprintf(n2, sizeof n2, "%s_proj.weight", stem);
    float *wn = fwd_vec(f, n1, d, 1), *wp = wn ? fwd_vec(f, n2, d, 1) : NULL;
    if (!wn || !wp) {
        free(wn);
        return f->err->code;
    }
    attn_res((const float *const *)ar->blocks, ar->nb, ar->p, wn, wp, T, d, f->m->cfg.eps, out);
    free(wn);
    free(wp);
    return DF_OK;
}

static int layer_attnres(df_fwd *f, pass_segs *s, attnres_state *ar, int T, fwd_scratch *sc, float *x) {
    const df_config *c = &f->m->cfg;
    int64_t n = (int64_t)T * c->d;
    int rc = DF_OK;
    if (ar->nb) rc = res_mix(f, ar, "self_attention_res", T, x);
    else memcpy(x, ar->p, n * sizeof(float));
    if (rc) return rc;
    if (f->layer % c->attn_res_block == 0) {       /* close the previous block */
        ar->blocks[ar->nb++] = ar->p;
        ar->p = xmalloc(n * sizeof(float));
        ar->p_empty = 1;
    }
    rc = rms_rows(f, "input_layernorm.weight", x, T, sc->norm);
    if (!rc) rc = mixer_forward(f, s, sc->norm, T, sc->buf);
    if (rc) return rc;
    if (ar->p_empty) memcpy(ar->p, sc->buf, n * sizeof(float));
    else for (int64_t i = 0; i < n; i++) ar->p[i] += sc->buf[i];
    ar->p_empty = 0;
    rc = res_mix(f, ar, "mlp_res", T, x);
    if (!rc) rc = rms_rows(f, "post_attention_layernorm.weight", x, T, sc->norm);
    if (!rc) rc = ffn_forward(f, sc->norm, T, sc->buf);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) ar->p[i] += sc->buf[i];
    return DF_OK;
}

static int embed_tokens(df_model *m, const int32_t *tokens, int T, float *h, df_error *err) {
    const df_config *c = &m->cfg;
    const df_tensor *emb = model_global_mat(m, "model.embed_tokens.weight", c->vocab, c->d, err);
    if (!emb) return err->code;
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab) {
            df_error_set(err, DF_EINVAL, "token id %d at position %d is outside the vocabulary (0..%d)", tokens[t],
                         t, c->vocab - 1);
            return DF_EINVAL;
        }
        tensor_row_f32(emb, tokens[t], h + (int64_t)t * c->d);
    }
    return DF_OK;
}

/* Logits of the rows each session asked for (all its rows, or its last), in one product over them all. */
static int head_forward(df_model *m, const float *h, model_seg *seg, int n_seg, df_error *err) {
    const df_config *c = &m->cfg;
    const df_tensor *lm = model_global_mat(m, "lm_head.weight", c->vocab, c->d, err);
    float *w = lm ? model_global_vec(m, "model.norm.weight", c->d, err) : NULL;
    if (!w) return err->code;
    int rows = 0, T = 0;
    for (int j = 0; j < n_seg; j++) rows += seg[j].logits ? (seg[j].all_rows ? seg[j].T : 1) : 0;
    float *xn = xmalloc((size_t)rows * c->d * sizeof(float));
    int r = 0;
    for (int j = 0; j < n_seg; T += seg[j++].T) {
        if (!seg[j].logits) continue;
        for (int t = seg[j].all_rows ? 0 : seg[j].T - 1; t < seg[j].T; t++, r++)
            kern_rmsnorm(xn + (int64_t)r * c->d, h + (int64_t)(T + t) * c->d, w, c->d, c->eps);
    }
    int one = n_seg == 1;          /* a single session gets its logits written in place */
    float *out = one ? seg[0].logits : xmalloc((size_t)rows * c->vocab * sizeof(float));
    int64_t per;
    int n_tiles = store_head_tiles(m->store, &per), rc = DF_OK;
    if (n_tiles <= 1) kern_matmul(m->kern, lm, xn, rows, out);
    float *part = n_tiles > 1 ? xmalloc((size_t)rows * (size_t)per * sizeof(float)) : NULL;
    for (int j = 0; j < n_tiles && n_tiles > 1 && !rc; j++) {   /* lm_head streamed: rows j*per.. of the vocabulary */
        df_tensor tile;
        rc = store_head_tile_acquire(m->store, j, &tile, err);
        if (rc) break;
        kern_matmul(m->kern, &tile, xn, rows, part);
        store_head_tile_release(m->store, j);
        for (int t = 0; t < rows; t++)
            memcpy(out + (int64_t)t * c->vocab + (int64_t)j * per, part + (int64_t)t * tile.shape[0],
                   (size_t)tile.shape[0] * sizeof(float));
    }
    free(part);
    r = 0;
    for (int j = 0; !one && !rc && j < n_seg; j++) {
        if (!seg[j].logits) continue;
        int n = seg[j].all_rows ? seg[j].T : 1;
        memcpy(seg[j].logits, out + (int64_t)r * c->vocab, (size_t)n * c->vocab * sizeof(float));
        r += n;
    }
    if (!one) free(out);
    free(xn);
    free(w);
    return rc;
}

static int output_attnres(df_model *m, attnres_state *ar, int T, float *h, df_error *err) {
    int d = m->cfg.d;
    float *wn = model_global_vec(m, "model.output_attn_res_norm.weight", d, err);
    float *wp = wn ? model_global_vec(m, "model.output_attn_res_proj.weight", d, err) : NULL;
    if (!wp) {
        free(wn);
        return err->code;
    }
    attn_res((const float *const *)ar->blocks, ar->nb, ar->p, wn, wp, T, d, m->cfg.eps, h);
    free(wn);
    free(wp);
    return DF_OK;
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
    int rc = pass_check(c, seg, n_seg, err);
    if (rc) return rc;
    double t_start = df_now();
    pass_segs ps = {xmalloc((size_t)n_seg * sizeof(fwd_seg)), n_seg, 0};
    int T = 0;
    for (int j = 0; j < n_seg; j++) {
        ps.seg[j] = (fwd_seg){seg[j].s, T, seg[j].T};
        seg[j].restored = 0;
        seg[j].s->rec_valid = 0;
        T += seg[j].T;
    }
    int64_t n = (int64_t)T * c->d;
    float *h = xmalloc(n * sizeof(float));
    fwd_scratch sc = {xmalloc(n * sizeof(float)), xmalloc(n * sizeof(float))};
    attnres_state ar = {0};
    rc = embed_tokens(m, tokens, T, h, err);
    if (!rc && c->attn_res_block) {
        ar.blocks = xcalloc(c->n_layers / c->attn_res_block + 2, sizeof(float *));
        ar.p = h;
        h = xmalloc(n * sizeof(float));
    }
    for (int i = 0; !rc && i < c->n_layers; i++) {
        df_fwd f = {m, NULL, i, err};
        double t0 = df_now();
        rc = store_layer_acquire(m->store, i, &f.L, err);
        model_clock(&m->prof.spine_read, t0);
        if (rc) break;
        rc = c->attn_res_block ? layer_attnres(&f, &ps, &ar, T, &sc, h) : layer_plain(&f, &ps, h, T, &sc);
        store_layer_release(m->store, f.L);
        if (!rc) rc = pass_step(&ps, i, c->n_layers, err);
    }
    if (!rc && c->attn_res_block) rc = output_attnres(m, &ar, T, h, err);
    int want_logits = 0;
    for (int j = 0; j < n_seg; j++) want_logits |= seg[j].logits != NULL;
    if (!rc && want_logits) rc = head_forward(m, h, seg, n_seg, err);
    for (int j = 0; j < n_seg; j++) {
        df_state *s = seg[j].s;
        int recorded = state_records(s, seg[j].T);
        if (!rc) {
            s->rec_valid = recorded;
            s->rec_T = seg[j].T;
            s->rec_pos0 = s->pos;
            s->pos += seg[j].T;
        } else if (recorded || !ps.mixed) {
            /* Put back as before the pass: the KDA layers from the record's start, MLA by position. */
            for (int i = 0; i < ps.mixed; i++)
                if (s->layers[i].S) kda_rewind(m, &s->layers[i], seg[j].T, 0);
            seg[j].restored = 1;
        }
    }
    model_clock(&m->prof.total, t_start);
    for (int b = 0; b < ar.nb; b++) free(ar.blocks[b]);
    free(ar.blocks);
    free(ar.p);
    free(h);
    free(sc.buf);
    free(sc.norm);
    free(ps.seg);
    return rc;
}

/* ---- whole-model check ----------------------------------------------------------------------------- */

static int check_layer(df_fwd *f) {
    const df_config *c = &f->m->cfg;
    int d = c->d;
    static const char *const norms[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attention_res_norm.weight", "self_attention_res_proj.weight",
                                  "mlp_res_norm.weight", "mlp_res_proj.weight"};
    for (int i = 0; i < (c->attn_res_block ? 6 : 2); i++) {
        float *v = fwd_vec(f, norms[i], d, 1);
        if (!v) return f->err->code;
        free(v);
    }
    int rc = c->mixer[f->layer] == MIXER_KDA ? kda_check(f) : mla_check(f);
    if (!rc) rc = c->ffn[f->layer] == FFN_MOE ? moe_check(f) : ffn_dense_check(f);
    return rc;
}

int model_check(df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    if (!model_global_mat(m, "model.embed_tokens.weight", c->vocab, c->d, err) ||
        !model_global_mat(m, "lm_head.weight", c->vocab, c->d, err))
        return err->code;
    const char *vecs[] = {"model.norm.weight", "model.output_attn_res_norm.weight",
                          "model.output_attn_res_proj.weight"};
    for (int i = 0; i < (c->attn_res_block ? 3 : 1); i++) {
        float *v = model_global_vec(m, vecs[i], c->d, err);
        if (!v) return err->code;
        free(v);
    }
    for (int i = 0; i < c->n_layers; i++) {
        df_fwd f = {m, NULL, i, err};
        int rc = store_layer_acquire(m->store, i, &f.L, err);
        if (rc) return rc;
        rc = check_layer(&f);
        store_layer_release(m->store, f.L);
        if (rc) return rc;
    }
    return DF_OK;
}
