/* gpu.c — the device side of the CUDA backend: choosing and opening the device, loading the kernels (kcache.h),
 * the budget, copying every weight the model bound into device memory (spine tensors by their host views, each
 * layer's routed experts as one array), the activation arena and kernel launches. The operations are gpu_ops.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu_internal.h"
#include "kcache.h"
#include "common/util.h"

#define GPU_ALIGN 256
#define GPU_RESERVE (1024ull << 20)   /* left free for the driver's own use and other processes */
#define GIB(x) ((double)(x) / (1 << 30))

static size_t align_up(size_t n) { return (n + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN; }

int gpu_check(gpu_ctx *g, CUresult r, const char *what) {
    if (r && !g->err) {
        g->err = DF_EIO;
        snprintf(g->msg, sizeof g->msg, "GPU %d (%s): %s failed: %s", g->ordinal, g->name, what,
                 cu_api_errstr(&g->a, r));
    }
    return r != 0;
}

/* ---- the map from host views to device copies ----------------------------------------------------------- */

static size_t map_slot(const gpu_ctx *g, const void *key) {
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (g->map_cap - 1);
}

static void map_put(gpu_ctx *g, const void *key, const gpu_wmat *w) {
    if (2 * (g->map_n + 1) > g->map_cap) {
        gpu_map_ent *old = g->map;
        size_t oc = g->map_cap;
        g->map_cap = oc ? 2 * oc : 1024;
        g->map = xcalloc(g->map_cap, sizeof *g->map);
        g->map_n = 0;
        for (size_t i = 0; i < oc; i++)
            if (old[i].key) map_put(g, old[i].key, &old[i].w);
        free(old);
    }
    size_t i = map_slot(g, key);
    while (g->map[i].key && g->map[i].key != key) i = (i + 1) & (g->map_cap - 1);
    if (!g->map[i].key) g->map_n++;
    g->map[i].key = key;
    g->map[i].w = *w;
}

static const gpu_wmat *map_get(const gpu_ctx *g, const void *key) {
    if (!g->map_cap || !key) return NULL;
    size_t i = map_slot(g, key);
    while (g->map[i].key) {
        if (g->map[i].key == key) return &g->map[i].w;
        i = (i + 1) & (g->map_cap - 1);
    }
    return NULL;
}

const gpu_wmat *gpu_mat(gpu_ctx *g, const df_tensor *t) {
    const gpu_wmat *w = map_get(g, t);
    if (!w) df_die("GPU backend: tensor %s was never copied to the device", t && t->name ? t->name : "?");
    return w;
}

CUdeviceptr gpu_vec(gpu_ctx *g, const float *v) {
    if (!v) return 0;
    const gpu_wmat *w = map_get(g, v);
    if (!w) df_die("GPU backend: a resident weight vector was never copied to the device");
    return w->data;
}

/* ---- arena and launches ---------------------------------------------------------------------------------- */

CUdeviceptr gpu_arena(gpu_ctx *g, size_t n) {
    size_t sz = align_up(n ? n : 1), at = g->arena_used;
    g->arena_used += sz;
    if (g->arena_used > g->arena_need) g->arena_need = g->arena_used;
    if (g->arena_used <= g->arena_cap) return g->arena + at;
    if (g->mode != GPU_EAGER) {    /* a graph is captured or replayed only once its signature ran eagerly */
        gpu_check(g, 1, "working memory outgrew its arena inside a decode graph");
        return g->arena;
    }
    CUdeviceptr p = 0;
    if (gpu_check(g, g->a.cuMemAlloc(&p, sz), "allocating working memory")) {
        df_die("%s (%zu bytes more than the arena's %zu)", g->msg, sz, g->arena_cap);
    }
    if (g->n_spill == g->spill_cap) {
        g->spill_cap = g->spill_cap ? 2 * g->spill_cap : 16;
        g->spill = xrealloc(g->spill, (size_t)g->spill_cap * sizeof *g->spill);
    }
    return g->spill[g->n_spill++] = p;
}

/* After a pass (the stream drained): spilled blocks freed, the arena grown to what the pass needed plus half. */
void gpu_arena_end_pass(gpu_ctx *g) {
    g->arena_used = 0;
    if (g->n_spill || g->arena_need > g->arena_cap) {
        for (int i = 0; i < g->n_spill; i++) g->a.cuMemFree(g->spill[i]);
        g->n_spill = 0;
        if (g->arena) g->a.cuMemFree(g->arena);
        g->arena_cap = align_up(g->arena_need + g->arena_need / 2);
        g->arena = 0;
        if (gpu_check(g, g->a.cuMemAlloc(&g->arena, g->arena_cap), "growing the working memory")) g->arena_cap = 0;
    }
    g->arena_need = 0;
}

void gpu_launch(gpu_ctx *g, int k, unsigned gx, unsigned gy, unsigned gz, unsigned block, unsigned smem, void **args) {
    if (!gx || !gy || !gz || g->mode == GPU_REPLAY) return;
    if (g->prof_on) g->a.cuEventRecord(g->prof_e0, g->st);
    CUresult r = g->a.cuLaunchKernel(g->fn[k], gx, gy, gz, block, 1, 1, smem, g->st, args, NULL);
    if (g->prof_on && !r) {
        float ms = 0;
        g->a.cuEventRecord(g->prof_e1, g->st);
        if (!g->a.cuEventSynchronize(g->prof_e1) && !g->a.cuEventElapsedTime(&ms, g->prof_e0, g->prof_e1)) {
            g->prof_ms[k] += ms;
            g->prof_n[k]++;
        }
    }
    if (r && !g->err) {
        char what[96];
        snprintf(what, sizeof what, "launching %s (%u x %u x %u blocks)", gpu_kernel_names[k], gx, gy, gz);
        gpu_check(g, r, what);
    }
}

void gpu_copy_async(gpu_ctx *g, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    if (bytes && g->mode != GPU_REPLAY) gpu_check(g, g->a.cuMemcpyDtoDAsync(dst, src, bytes, g->st), "a device copy");
}

void *gpu_host_alloc(gpu_ctx *g, size_t bytes) {
    void *p = NULL;
    bytes = (bytes + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, bytes ? bytes : 4096)) return NULL;
    if (g->a.cuMemHostRegister(p, bytes ? bytes : 4096, CU_MEMHOSTREGISTER_PORTABLE)) {
        free(p);
        return NULL;
    }
    return p;
}

void gpu_host_free(gpu_ctx *g, void *p) {
    if (!p) return;
    g->a.cuMemHostUnregister(p);
    free(p);
}

/* ---- weights ------------------------------------------------------------------------------------------- */

static int64_t vec_cols(int dt) {
    switch (dt) {
    case DF_DT_F32: return 4;
    case DF_DT_F16: case DF_DT_BF16: return 8;
    case DF_DT_I8: return 16;
    default: return 32;
    }
}

static uint64_t scale_bytes(const df_tensor *t) {
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
    if (t->dtype == DF_DT_MXFP4) return (uint64_t)rows * cols / 32;
    if (t->dtype == DF_DT_I8) return (uint64_t)rows * 2;
    return 0;
}

static uint64_t mat_bytes(const df_tensor *t) {
    return align_up(tensor_data_bytes(t)) + align_up(scale_bytes(t));
}

static gpu_wmat wmat_of(const df_tensor *t, CUdeviceptr data, CUdeviceptr scale) {
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
    return (gpu_wmat){data, scale, rows, cols, t->dtype, cols % vec_cols(t->dtype) == 0};
}

static CUdeviceptr dev_alloc(gpu_ctx *g, size_t n) {
    CUdeviceptr p = 0;
    if (gpu_check(g, g->a.cuMemAlloc(&p, n ? n : 1), "allocating weight memory")) return 0;
    if (g->n_allocs == g->allocs_cap) {
        g->allocs_cap = g->allocs_cap ? 2 * g->allocs_cap : 256;
        g->allocs = xrealloc(g->allocs, (size_t)g->allocs_cap * sizeof *g->allocs);
    }
    return g->allocs[g->n_allocs++] = p;
}

/* A matrix whose bytes are in host memory now: copied into one allocation, data then scale. */
static int upload_mat(gpu_ctx *g, const df_tensor *t) {
    if (!t || map_get(g, t)) return g->err;
    uint64_t db = tensor_data_bytes(t), sb = scale_bytes(t);
    CUdeviceptr p = dev_alloc(g, mat_bytes(t));
    if (!p) return g->err;
    gpu_check(g, g->a.cuMemcpyHtoD(p, t->data, db), "copying a weight");
    if (sb) gpu_check(g, g->a.cuMemcpyHtoD(p + align_up(db), t->scale, sb), "copying a weight's scales");
    gpu_wmat w = wmat_of(t, p, sb ? p + align_up(db) : 0);
    map_put(g, t, &w);
    return g->err;
}

static int upload_vec(gpu_ctx *g, const float *v, int64_t n) {
    if (!v || map_get(g, v)) return g->err;
    CUdeviceptr p = dev_alloc(g, (size_t)n * sizeof(float));
    if (!p) return g->err;
    gpu_check(g, g->a.cuMemcpyHtoD(p, v, (size_t)n * sizeof(float)), "copying a weight vector");
    gpu_wmat w = {p, 0, 1, n, DF_DT_F32, 0};
    map_put(g, v, &w);
    return g->err;
}

/* Every matrix a layer binds, in the order the layer uses them (what a layer streamed in parts reads once). */
static int layer_mats(const df_config *c, int i, const layer_weights *w, const df_tensor **out) {
    int n = 0;
    if (c->mixer[i] == MIXER_KDA) {
        const kda_weights *k = &w->kda;
        const df_tensor *t[] = {k->q, k->k, k->v, k->fa, k->fb, k->b, k->g, k->ga, k->gb, k->o};
        for (size_t j = 0; j < sizeof t / sizeof *t; j++) if (t[j]) out[n++] = t[j];
    } else {
        const mla_weights *a = &w->mla;
        const df_tensor *t[] = {a->q, a->qa, a->qb, a->kva, a->kvb, a->g, a->o};
        for (size_t j = 0; j < sizeof t / sizeof *t; j++) if (t[j]) out[n++] = t[j];
    }
    const df_tensor *f[] = {w->moe.gate, w->moe.shared.gate, w->moe.shared.up, w->moe.shared.down,
                            w->moe.latent_down, w->moe.latent_up, w->ffn.gate, w->ffn.up, w->ffn.down};
    for (size_t j = 0; j < sizeof f / sizeof *f; j++) if (f[j]) out[n++] = f[j];
    return n;
}

static int layer_vecs(const df_model *m, int i, const float **v, int64_t *len) {
    const df_config *c = &m->cfg;
    const layer_weights *w = &m->w.layers[i];
    int n = 0;
    int64_t d = c->d, P = (int64_t)c->kda_heads * c->kda_dim;
#define V(p, l) do { if (p) { v[n] = (p); len[n++] = (l); } } while (0)
    V(w->attn_norm, d); V(w->ffn_norm, d);
    V(w->attn_res_norm, d); V(w->attn_res_proj, d); V(w->mlp_res_norm, d); V(w->mlp_res_proj, d);
    if (c->mixer[i] == MIXER_KDA) {
        for (int j = 0; j < 3; j++) V(w->kda.conv[j], P * c->conv_w);
        V(w->kda.dt_bias, P); V(w->kda.onorm, c->kda_dim);
        V(w->kda.alog, m->alog_per_channel ? c->kda_dim : c->kda_heads);
    } else {
        V(w->mla.qa_norm, c->q_lora); V(w->mla.kv_norm, c->kv_lora);
    }
    V(w->moe.bias, c->n_experts); V(w->moe.latent_norm, config_expert_dim(c));
#undef V
    return n;
}

/* The device bytes of one layer's experts: offsets of w1, w3, w2 and their scales within one expert's block. */
static void experts_layout(const df_expert *ex, int n_experts, gpu_experts *x) {
    uint64_t at = 0;
    const df_tensor *p[3] = {&ex->w1, &ex->w3, &ex->w2};
    uint64_t *off[3][2] = {{&x->w1, &x->w1s}, {&x->w3, &x->w3s}, {&x->w2, &x->w2s}};
    for (int j = 0; j < 3; j++) {
        *off[j][0] = at;
        at += align_up(tensor_data_bytes(p[j]));
        *off[j][1] = at;
        at += align_up(scale_bytes(p[j]));
    }
    x->stride = at;
    x->inter = ex->w1.shape[0];
    x->dim = ex->w1.shape[1];
    x->dt = ex->w1.dtype;
    x->vec = x->inter % vec_cols(ex->w1.dtype) == 0 && x->dim % vec_cols(ex->w1.dtype) == 0;
    (void)n_experts;
}

static int experts_same(const df_expert *a, const df_expert *b) {
    const df_tensor *pa[3] = {&a->w1, &a->w3, &a->w2}, *pb[3] = {&b->w1, &b->w3, &b->w2};
    for (int j = 0; j < 3; j++)
        if (pa[j]->dtype != pb[j]->dtype || pa[j]->shape[0] != pb[j]->shape[0] || pa[j]->shape[1] != pb[j]->shape[1])
            return 0;
    return a->w1.dtype == a->w3.dtype && a->w1.dtype == a->w2.dtype;
}

static int upload_expert(gpu_ctx *g, const gpu_experts *x, int e, const df_expert *ex) {
    CUdeviceptr b = x->base + (uint64_t)e * x->stride;
    const df_tensor *p[3] = {&ex->w1, &ex->w3, &ex->w2};
    uint64_t off[3][2] = {{x->w1, x->w1s}, {x->w3, x->w3s}, {x->w2, x->w2s}};
    for (int j = 0; j < 3; j++) {
        gpu_check(g, g->a.cuMemcpyHtoD(b + off[j][0], p[j]->data, tensor_data_bytes(p[j])), "copying an expert");
        if (scale_bytes(p[j]))
            gpu_check(g, g->a.cuMemcpyHtoD(b + off[j][1], p[j]->scale, scale_bytes(p[j])), "copying an expert's scales");
    }
    return g->err;
}

static uint64_t expert_read_bytes(const df_expert *ex) {
    return tensor_data_bytes(&ex->w1) + scale_bytes(&ex->w1) + tensor_data_bytes(&ex->w3) + scale_bytes(&ex->w3) +
           tensor_data_bytes(&ex->w2) + scale_bytes(&ex->w2);
}

/* One layer's routed experts into one device array, read through storage a few at a time. */
static int upload_experts(gpu_ctx *g, df_model *m, int layer, df_error *err) {
    int E = m->cfg.n_experts, rc;
    store_stats ss;
    store_get_stats(m->store, &ss);
    int chunk = DF_MAX(1, DF_MIN(32, ss.cache_slots / 2));
    gpu_experts *x = &g->experts[layer];
    df_expert first;
    if ((rc = store_expert_acquire(m->store, layer, 0, &first, err))) return rc;
    experts_layout(&first, E, x);
    g->decode_bytes += (uint64_t)m->cfg.topk * expert_read_bytes(&first);
    df_expert ref = first;
    store_expert_release(m->store, layer, 0);
    x->base = dev_alloc(g, (size_t)x->stride * E);
    if (!x->base) return g->err;
    int *ids = xmalloc((size_t)chunk * sizeof *ids);
    uint8_t *done = xmalloc((size_t)chunk);
    for (int e0 = 0; !rc && e0 < E; e0 += chunk) {
        int n = DF_MIN(chunk, E - e0);
        for (int i = 0; i < n; i++) ids[i] = e0 + i;
        memset(done, 0, (size_t)chunk);
        rc = store_experts_prefetch(m->store, layer, ids, n, err);
        for (int got = 0; !rc && got < n; got++) {
            df_expert ex;
            int u = -1;
            rc = store_expert_acquire_next(m->store, layer, ids, n, done, &u, &ex, err);
            if (rc) break;
            if (!experts_same(&ref, &ex)) {
                df_error_set(err, DF_EUNSUPPORTED, "%s: expert %d of layer %d differs in shape or dtype from expert 0 "
                             "(the GPU backend keeps a layer's experts in one array)", m->dir, ids[u], layer);
                rc = DF_EUNSUPPORTED;
            } else if (upload_expert(g, x, ids[u], &ex)) {
                rc = g->err;
            }
            store_expert_release(m->store, layer, ids[u]);
        }
    }
    free(ids);
    free(done);
    if (!rc && g->err) rc = g->err;
    return rc;
}

/* The bytes every weight takes on the device (spine matrices, vectors, experts), before anything is copied. */
static uint64_t weight_bytes(df_model *m) {
    const df_config *c = &m->cfg;
    const df_tensor *mats[32];
    const float *v[32];
    int64_t len[32];
    uint64_t n = mat_bytes(m->w.embed) + mat_bytes(m->w.head) + 3 * align_up((size_t)c->d * 4);
    for (int i = 0; i < c->n_layers; i++) {
        int k = layer_mats(c, i, &m->w.layers[i], mats);
        for (int j = 0; j < k; j++) n += mat_bytes(mats[j]);
        k = layer_vecs(m, i, v, len);
        for (int j = 0; j < k; j++) n += align_up((size_t)len[j] * 4);
    }
    df_param_counts pc;
    config_param_counts(c, &pc);
    /* experts: their stored bytes (MXFP4: 17 bytes per 32 weights), rounded up per part */
    store_stats ss;
    store_get_stats(m->store, &ss);
    n += (uint64_t)pc.n_moe_layers * c->n_experts * (ss.expert_bytes + 6 * GPU_ALIGN);
    return n;
}

/* Working memory of a pass of T rows (activations of the layer loop, the largest layer's temporaries, logits). */
static uint64_t work_bytes(const df_config *c, int T) {
    uint64_t td = (uint64_t)T * c->d * 4, P = (uint64_t)c->kda_heads * c->kda_dim, H = c->mla_heads;
    uint64_t loop = 3 * td + (c->attn_res_block ? (c->n_layers / c->attn_res_block + 2) * td : 0);
    uint64_t kda = (uint64_t)T * (6 * P + c->kda_dim + c->kda_heads) * 4;
    uint64_t mla = (uint64_t)T * (H * (c->nope + c->rope) + 2 * H * c->vdim + 2 * H * c->kv_lora +
                                  DF_MAX(c->q_lora, c->kv_lora + c->rope)) * 4;
    uint64_t Dz = config_expert_dim(c);
    uint64_t moe = (uint64_t)T * (c->n_experts + 2 * c->topk + (uint64_t)c->topk * (c->moe_inter + Dz) + 3 * Dz +
                                  c->d + 2 * (uint64_t)c->moe_inter * DF_MAX(c->n_shared, 1)) * 4;
    uint64_t dense = (uint64_t)T * 2 * c->dense_inter * 4;
    uint64_t head = (uint64_t)DF_MIN(T, 64) * ((uint64_t)c->vocab + c->d) * 4;
    return loop + DF_MAX(DF_MAX(kda, mla), DF_MAX(DF_MAX(moe, dense), head)) + (64u << 20);
}

static int upload_all(gpu_ctx *g, df_model *m, df_error *err) {
    const df_config *c = &m->cfg;
    const df_tensor *mats[32];
    const float *v[32];
    int64_t len[32];
    int rc = DF_OK;
    if (upload_mat(g, m->w.embed) || upload_vec(g, m->w.norm, c->d) || upload_vec(g, m->w.out_res_norm, c->d) ||
        upload_vec(g, m->w.out_res_proj, c->d))
        goto fail;
    int64_t per;
    int tiles = store_head_tiles(m->store, &per);
    g->decode_bytes += tensor_data_bytes(m->w.head) + scale_bytes(m->w.head);
    if (tiles <= 1) {
        if (upload_mat(g, m->w.head)) goto fail;
    } else {   /* lm_head streamed on the host: its tiles, one after another, into one device copy */
        const df_tensor *hd = m->w.head;
        uint64_t row = tensor_row_bytes(hd), srow = scale_bytes(hd) / (uint64_t)hd->shape[0];
        uint64_t db = tensor_data_bytes(hd);
        CUdeviceptr p = dev_alloc(g, mat_bytes(hd));
        if (!p) goto fail;
        for (int j = 0; j < tiles && !rc; j++) {
            df_tensor tile;
            if ((rc = store_head_tile_acquire(m->store, j, &tile, err))) break;
            gpu_check(g, g->a.cuMemcpyHtoD(p + (uint64_t)j * per * row, tile.data, tensor_data_bytes(&tile)), "lm_head");
            if (srow)
                gpu_check(g, g->a.cuMemcpyHtoD(p + align_up(db) + (uint64_t)j * per * srow, tile.scale, scale_bytes(&tile)),
                          "lm_head scales");
            store_head_tile_release(m->store, j);
        }
        if (rc) return rc;
        gpu_wmat w = wmat_of(hd, p, srow ? p + align_up(db) : 0);
        map_put(g, hd, &w);
    }
    for (int i = 0; !rc && i < c->n_layers; i++) {
        const df_store_layer *L;
        if ((rc = store_layer_acquire(m->store, i, &L, err))) break;
        int k = layer_mats(c, i, &m->w.layers[i], mats);
        for (int j = 0; j < k; j++) g->decode_bytes += tensor_data_bytes(mats[j]) + scale_bytes(mats[j]);
        for (int j = 0; !rc && j < k; j++) {
            rc = store_layer_need(m->store, L, mats[j], err);
            if (!rc && upload_mat(g, mats[j])) rc = g->err;
        }
        store_layer_release(m->store, L);
        k = layer_vecs(m, i, v, len);
        for (int j = 0; !rc && j < k; j++)
            if (upload_vec(g, v[j], len[j])) rc = g->err;
        if (!rc && c->ffn[i] == FFN_MOE) rc = upload_experts(g, m, i, err);
    }
    if (rc) return rc;
    if (!g->err) return DF_OK;
fail:
    df_error_set(err, g->err ? g->err : DF_EIO, "%s", g->msg);
    return err->code;
}

/* ---- opening ------------------------------------------------------------------------------------------- */

int gpu_selection_wants(const char *sel) { return sel && *sel && strcmp(sel, "off") != 0; }

void gpu_probe_devices(gpu_probe *p) {
    memset(p, 0, sizeof *p);
    cu_api a;
    df_error err = {0};
    if (cu_api_load_driver(&a, &err)) {
        snprintf(p->reason, sizeof p->reason, "%s", err.msg);
        return;
    }
    if (a.cuDeviceGetCount(&p->n_devices) || p->n_devices <= 0) {
        p->n_devices = 0;
        snprintf(p->reason, sizeof p->reason, "the NVIDIA driver sees no GPU");
    }
    cu_api_unload(&a);
}

static void gpu_profile_print(gpu_ctx *g) {
    double total = 0;
    for (int k = 0; k < K_COUNT; k++) total += g->prof_ms[k];
    fprintf(stderr, "gpu profile (each launch timed alone): %.1f ms in all\n", total);
    for (int k = 0; k < K_COUNT; k++)
        if (g->prof_n[k])
            fprintf(stderr, "  %-16s %8llu launches %10.3f ms %8.2f us each\n", gpu_kernel_names[k],
                    (unsigned long long)g->prof_n[k], g->prof_ms[k], 1e3 * g->prof_ms[k] / (double)g->prof_n[k]);
}

static void gpu_free_ctx(gpu_ctx *g) {
    if (g->ctx) g->a.cuCtxSetCurrent(g->ctx);
    if (g->prof_on) gpu_profile_print(g);
    if (getenv("DELTAFIN_GPU_DEBUG"))
        fprintf(stderr, "gpu: decode graphs %llu captured, %llu replayed%s%s\n", (unsigned long long)g->graph_captures,
                (unsigned long long)g->graph_replays, g->capture_refused ? "; capture refused: " : "",
                g->capture_refused ? cu_api_errstr(&g->a, g->capture_refused) : "");
    if (g->prof_e0) g->a.cuEventDestroy(g->prof_e0);
    if (g->prof_e1) g->a.cuEventDestroy(g->prof_e1);
    if (g->st) g->a.cuStreamSynchronize(g->st);
    for (int i = 0; i < g->n_allocs; i++) g->a.cuMemFree(g->allocs[i]);
    for (int i = 0; i < g->n_spill; i++) g->a.cuMemFree(g->spill[i]);
    if (g->arena) g->a.cuMemFree(g->arena);
    if (g->tok) g->a.cuMemFree(g->tok);
    if (g->hist_tmp) g->a.cuMemFree(g->hist_tmp);
    if (g->pos) g->a.cuMemFree(g->pos);
    gpu_graph_free(g);
    gpu_host_free(g, g->h_tok);
    gpu_host_free(g, g->h_pos);
    gpu_host_free(g, g->h_logits);
    free(g->outs);
    free(g->pass_states);
    if (g->mod) g->a.cuModuleUnload(g->mod);
    if (g->st) g->a.cuStreamDestroy(g->st);
    if (g->ctx) g->a.cuDevicePrimaryCtxRelease(g->dev);
    cu_api_unload(&g->a);
    free(g->allocs);
    free(g->spill);
    free(g->map);
    free(g->experts);
    free(g);
}

/* What the kernels assume of the model's shapes; a model outside them stays on the CPU. */
static int shapes_supported(const df_model *m, const gpu_ctx *g, df_error *err) {
    const df_config *c = &m->cfg;
    int kda = 0, mla = 0;
    for (int i = 0; i < c->n_layers; i++) {
        kda |= c->mixer[i] == MIXER_KDA;
        mla |= c->mixer[i] == MIXER_MLA;
    }
    const char *why = NULL;
    if (kda && (c->kda_dim > 1024 || (size_t)(c->kda_dim * c->kda_dim + 3 * c->kda_dim) * 4 > (size_t)g->smem_optin))
        why = "KDA head dimension too large for one block's shared memory";
    else if (mla && (c->kv_lora > 2048 || c->rope > 512)) why = "MLA latent wider than 2048 or rope part over 512";
    else if (c->n_experts > 4096 || c->topk > 64 || c->n_group > 1024) why = "more than 4096 experts, top-64 or 1024 groups";
    else if (c->attn_res_block && c->n_layers / c->attn_res_block + 2 > 128) why = "more than 127 attention-residual blocks";
    if (why) {
        df_error_set(err, DF_EUNSUPPORTED, "%s: the GPU backend does not take this model: %s", m->dir, why);
        return DF_EUNSUPPORTED;
    }
    return DF_OK;
}

int gpu_backend_open(df_model *m, const char *sel, uint64_t mem_budget, uint64_t state_bytes, df_error *err) {
    int ordinal = 0;
    if (strcmp(sel, "auto")) {
        char *end;
        long v = strtol(sel, &end, 10);
        if (end == sel || *end || v < 0 || v > 1024) {
            df_error_set(err, DF_EINVAL, "--gpu: expected auto, off or a device number, got '%s'", sel);
            return DF_EINVAL;
        }
        ordinal = (int)v;
    }
    gpu_ctx *g = xcalloc(1, sizeof *g);
    g->ordinal = ordinal;
    snprintf(g->name, sizeof g->name, "?");
    int rc = cu_api_load_driver(&g->a, err), n = 0;
    if (rc) {
        free(g);
        return rc;
    }
    if (g->a.cuDeviceGetCount(&n) || ordinal >= n) {
        df_error_set(err, DF_EUNSUPPORTED, n ? "no GPU %d: the driver sees %d device%s (0..%d)" : "no GPU %d: the driver "
                     "sees no device", ordinal, n, n == 1 ? "" : "s", n - 1);
        gpu_free_ctx(g);
        return DF_EUNSUPPORTED;
    }
    int major = 0, minor = 0;
    g->a.cuDeviceGet(&g->dev, ordinal);
    g->a.cuDeviceGetName(g->name, sizeof g->name, g->dev);
    g->a.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g->dev);
    g->a.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g->dev);
    g->a.cuDeviceGetAttribute(&g->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev);
    g->a.cuDeviceGetAttribute(&g->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, g->dev);
    g->arch = major * 10 + minor;
    if (major < 7) {
        df_error_set(err, DF_EUNSUPPORTED, "GPU %d (%s) has compute capability %d.%d; the GPU backend needs 7.0 or newer",
                     ordinal, g->name, major, minor);
        gpu_free_ctx(g);
        return DF_EUNSUPPORTED;
    }
    if ((rc = shapes_supported(m, g, err))) {
        gpu_free_ctx(g);
        return rc;
    }
    if (g->a.cuDevicePrimaryCtxRetain(&g->ctx, g->dev) || g->a.cuCtxSetCurrent(g->ctx) ||
        g->a.cuStreamCreate(&g->st, CU_STREAM_NON_BLOCKING)) {
        df_error_set(err, DF_EUNSUPPORTED, "GPU %d (%s): cannot create a context and stream", ordinal, g->name);
        gpu_free_ctx(g);
        return DF_EUNSUPPORTED;
    }
    g->a.cuMemGetInfo(&g->free_mem, &g->total_mem);
    g->budget = mem_budget ? mem_budget : (g->free_mem > GPU_RESERVE ? g->free_mem - GPU_RESERVE : 0);
    g->weight_bytes = weight_bytes(m);
    g->work_bytes = work_bytes(&m->cfg, 256);
    g->state_bytes = state_bytes;
    uint64_t need = g->weight_bytes + g->work_bytes + g->state_bytes;
    if (need > g->budget) {
        df_error_set(err, DF_ENOMEM, "the model needs %.2f GiB of GPU memory (weights %.2f + working %.2f + states %.2f "
                     "GiB), more than the budget of %.2f GiB on GPU %d (%s, %.1f GiB free)%s", GIB(need),
                     GIB(g->weight_bytes), GIB(g->work_bytes), GIB(g->state_bytes), GIB(g->budget), ordinal, g->name,
                     GIB(g->free_mem), mem_budget ? "" : "; --gpu-mem sets the budget");
        gpu_free_ctx(g);
        return DF_ENOMEM;
    }
    void *img = NULL;
    size_t len = 0;
    double tc = df_now();
    rc = kcache_image(&g->a, g->arch, &img, &len, &g->compiled, err);
    g->compile_s = df_now() - tc;
    if (!rc && g->a.cuModuleLoadData(&g->mod, img)) {
        df_error_set(err, DF_EUNSUPPORTED, "GPU %d (%s): the driver refused the sm_%d kernel image", ordinal, g->name,
                     g->arch);
        rc = DF_EUNSUPPORTED;
    }
    free(img);
    for (int k = 0; !rc && k < K_COUNT; k++)
        if (g->a.cuModuleGetFunction(&g->fn[k], g->mod, gpu_kernel_names[k])) {
            df_error_set(err, DF_EUNSUPPORTED, "GPU kernel %s is missing from the compiled image", gpu_kernel_names[k]);
            rc = DF_EUNSUPPORTED;
        }
    if (!rc) g->a.cuFuncSetAttribute(g->fn[K_KDA_RECUR], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, g->smem_optin);
    if (rc) {
        gpu_free_ctx(g);
        return rc;
    }
    g->experts = xcalloc((size_t)m->cfg.n_layers, sizeof *g->experts);
    double tu = df_now();
    rc = upload_all(g, m, err);
    g->upload_s = df_now() - tu;
    size_t hist = (size_t)DF_MAX(1, m->cfg.conv_w - 1) * 3 * m->cfg.kda_heads * m->cfg.kda_dim * sizeof(float);
    if (!rc && (gpu_check(g, g->a.cuMemAlloc(&g->arena, g->arena_cap = (size_t)g->work_bytes), "working memory") ||
                gpu_check(g, g->a.cuMemAlloc(&g->hist_tmp, hist + 4), "working memory"))) {
        df_error_set(err, DF_ENOMEM, "%s", g->msg);
        rc = DF_ENOMEM;
    }
    if (rc) {
        gpu_free_ctx(g);
        return rc;
    }
    const char *ge = getenv("DELTAFIN_GPU_GRAPHS");
    g->graphs_on = !(ge && !strcmp(ge, "0"));
    const char *pe = getenv("DELTAFIN_GPU_PROFILE");
    g->prof_on = pe && !strcmp(pe, "1") && !g->a.cuEventCreate(&g->prof_e0, CU_EVENT_DEFAULT) &&
                 !g->a.cuEventCreate(&g->prof_e1, CU_EVENT_DEFAULT);
    m->ops = gpu_ops();
    m->be = g;
    return DF_OK;
}

void gpu_backend_close(df_model *m) {
    if (!m->be || m->ops != gpu_ops()) return;
    gpu_free_ctx(gpu_of(m));
    m->be = NULL;
    m->ops = model_ops_cpu();
}

void gpu_backend_describe(const df_model *m, char *buf, size_t cap) {
    const gpu_ctx *g = gpu_of(m);
    if (!g || m->ops != gpu_ops()) {
        snprintf(buf, cap, "gpu: not used\n");
        return;
    }
    snprintf(buf, cap, "gpu: %d: %s (sm_%d, %d SMs), %.1f GiB, %.1f GiB free at open; plan: weights %.2f GiB + "
             "working %.2f GiB + states %.2f GiB of a %.2f GiB budget; kernels %s in %.2f s, weights copied in %.1f s; "
             "decode graphs %s\n",
             g->ordinal, g->name, g->arch, g->sms, GIB(g->total_mem), GIB(g->free_mem), GIB(g->weight_bytes),
             GIB(g->work_bytes), GIB(g->state_bytes), GIB(g->budget), g->compiled ? "compiled" : "from the cache",
             g->compile_s, g->upload_s, g->graphs_on ? "on" : "off (DELTAFIN_GPU_GRAPHS=0)");
}

uint64_t gpu_backend_decode_bytes(const df_model *m) {
    return m->ops == gpu_ops() ? gpu_of(m)->decode_bytes : 0;
}

double gpu_backend_read_gbps(df_model *m) {
    if (m->ops != gpu_ops()) return 0;
    gpu_ctx *g = gpu_of(m);
    g->a.cuCtxSetCurrent(g->ctx);
    size_t n = (size_t)4 << 30, free_b = 0, total = 0;
    g->a.cuMemGetInfo(&free_b, &total);
    while (n > ((size_t)256 << 20) && n + ((size_t)512 << 20) > free_b) n /= 2;
    CUdeviceptr buf = 0, out = 0;
    CUevent e0 = NULL, e1 = NULL;
    double best = 0;
    unsigned blocks = (unsigned)g->sms * 8;
    if (g->a.cuMemAlloc(&buf, n) || g->a.cuMemAlloc(&out, blocks * sizeof(float))) goto done;
    g->a.cuMemsetD8Async(buf, 0x3c, n, g->st);
    g->a.cuMemsetD8Async(out, 0, blocks * sizeof(float), g->st);
    if (g->a.cuEventCreate(&e0, CU_EVENT_DEFAULT) || g->a.cuEventCreate(&e1, CU_EVENT_DEFAULT)) goto done;
    int64_t n4 = (int64_t)(n / 16);
    for (int rep = 0; rep < 6; rep++) {
        void *args[] = {&buf, &n4, &out};
        g->a.cuEventRecord(e0, g->st);
        g->err = 0;
        gpu_launch(g, K_READ, blocks, 1, 1, 256, 0, args);
        g->a.cuEventRecord(e1, g->st);
        float ms = 0;
        if (g->err || g->a.cuEventSynchronize(e1) || g->a.cuEventElapsedTime(&ms, e0, e1)) break;
        if (rep && ms > 0) best = DF_MAX(best, (double)n / (ms * 1e-3) / 1e9);   /* the first run warms up */
    }
done:
    if (e0) g->a.cuEventDestroy(e0);
    if (e1) g->a.cuEventDestroy(e1);
    if (buf) g->a.cuMemFree(buf);
    if (out) g->a.cuMemFree(out);
    g->err = 0;
    return best;
}
