/* experts.c — routed experts: pairing a checkpoint's parts (plain weights or MXFP4 packed + scale) into
 * three checked matrices, where each expert's bytes lie (expert_index.h), reading one into a cache slot and
 * checking its scale bytes on every read (checking a 1.4 TB checkpoint at open would read all of it), and the
 * store.h entry points that prefetch, hint and acquire experts (also in the order their bytes arrive). */
#include "store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* Routed experts: pairing, shape checks, byte spans. */

const char *experts_mat_name(int m) { return m == 0 ? "w1" : m == 1 ? "w2" : "w3"; }

/* Fills one matrix view of an expert; the error names the file and tensor at fault. */
static int store_expert_matrix(df_store *st, int layer, int e, int m, store_expert *x, df_tensor *out,
                               df_error *err) {
    store_ref *p = x->part[m];
    /* a file of this expert, or (when the whole expert is missing) one holding the layer's experts */
    const char *file = st->ck.shards[st->expert_shard[layer]].path;
    for (int mm = 0; mm < 3; mm++)
        for (int k = 0; k < TENSOR_PART_COUNT; k++)
            if (x->part[mm][k].t) file = store_tensor_path(st, x->part[mm][k]);
    if (p[TENSOR_PART_WEIGHT].t && (p[TENSOR_PART_PACKED].t || p[TENSOR_PART_SCALE].t))
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': expert matrix has both a plain weight and MXFP4 "
                            "weight_packed/weight_scale", file, p[TENSOR_PART_WEIGHT].t->name), DF_EFORMAT;
    if (p[TENSOR_PART_WEIGHT].t) {
        const st_tensor *t = p[TENSOR_PART_WEIGHT].t;
        int rc = st_tensor_view(&st->ck.shards[p[TENSOR_PART_WEIGHT].shard], t, out, err);
        if (rc) return rc;
        if (t->ndim != 2 || (t->dtype != DF_DT_F32 && t->dtype != DF_DT_BF16 && t->dtype != DF_DT_F16))
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': expert weight must be a 2-D F32/BF16/F16 "
                                "matrix, got %s with %d dims", file, t->name, t->dtype_name, t->ndim), DF_EFORMAT;
        store_align_view(st, out, t->elem_size);
        return DF_OK;
    }
    const st_tensor *pk = p[TENSOR_PART_PACKED].t, *sc = p[TENSOR_PART_SCALE].t;
    if (!pk || !sc) {
        char missing[256];
        int part = pk ? TENSOR_PART_SCALE : sc ? TENSOR_PART_PACKED : TENSOR_PART_WEIGHT;
        tensor_name_format(tensor_expert_kind(m, part), st->ck.family, layer, e, missing, sizeof missing);
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s' is missing (experts of a layer must be numbered "
                            "0..E-1, each with w1, w2, w3 as .weight or .weight_packed + .weight_scale)", file,
                            missing), DF_EFORMAT;
    }
    if (pk->dtype != DF_DT_U8 || pk->ndim != 2)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 weight_packed must be a 2-D U8 tensor, got %s "
                            "with %d dims", store_tensor_path(st, p[TENSOR_PART_PACKED]), pk->name, pk->dtype_name,
                            pk->ndim), DF_EFORMAT;
    if (sc->dtype != DF_DT_U8 || sc->ndim != 2)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 weight_scale must be a 2-D U8 tensor, got %s "
                            "with %d dims", store_tensor_path(st, p[TENSOR_PART_SCALE]), sc->name, sc->dtype_name,
                            sc->ndim), DF_EFORMAT;
    if (pk->shape[0] != sc->shape[0] || pk->shape[1] * 2 != sc->shape[1] * 32 || pk->shape[1] == 0)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 scale shape [%lld, %lld] does not match "
                            "weight_packed [%lld, %lld] (need the same rows and packed cols x 2 == scale cols x 32)",
                            store_tensor_path(st, p[TENSOR_PART_SCALE]), sc->name, (long long)sc->shape[0],
                            (long long)sc->shape[1], (long long)pk->shape[0], (long long)pk->shape[1]), DF_EFORMAT;
    *out = (df_tensor){.name = pk->name, .dtype = DF_DT_MXFP4, .ndim = 2, .shape = {pk->shape[0], pk->shape[1] * 2},
                       .data = pk->data, .scale = sc->data};
    const st_tensor *sh = p[TENSOR_PART_SHAPE].t;
    if (sh) {
        int64_t v[2] = {-1, -1};
        if (sh->ndim == 1 && sh->shape[0] == 2 && sh->dtype == DF_DT_I64) memcpy(v, sh->data, sizeof v);
        if (sh->ndim == 1 && sh->shape[0] == 2 && sh->dtype == DF_DT_I32)
            for (int i = 0; i < 2; i++) {
                int32_t x32;
                memcpy(&x32, (const uint8_t *)sh->data + 4 * i, 4);
                v[i] = x32;
            }
        if (v[0] != out->shape[0] || v[1] != out->shape[1])
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': weight_shape does not match the MXFP4 pair's "
                                "logical shape [%lld, %lld]", store_tensor_path(st, p[TENSOR_PART_SHAPE]), sh->name,
                                (long long)out->shape[0], (long long)out->shape[1]), DF_EFORMAT;
    }
    return DF_OK;
}

static int store_cmp_part(const void *a, const void *b) {
    const store_expert_part *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void store_expert_locate_init(df_store *st, store_expert *x) {
    store_expert_loc *loc = &x->loc;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < TENSOR_PART_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (!r.t) continue;
            loc->parts[loc->n_parts++] = (store_expert_part){r.t->name, r.shard,
                                                             st_tensor_offset(&st->ck.shards[r.shard], r.t),
                                                             r.t->end - r.t->begin};
        }
    qsort(loc->parts, (size_t)loc->n_parts, sizeof loc->parts[0], store_cmp_part);
    loc->shard = loc->parts[0].shard;
    loc->path = st->ck.shards[loc->shard].path;
    loc->offset = loc->parts[0].offset;
    loc->contiguous = 1;
    uint64_t end = loc->offset;
    for (int i = 0; i < loc->n_parts; i++) {
        if (loc->parts[i].shard != loc->shard || loc->parts[i].offset != end) loc->contiguous = 0;
        end = loc->parts[i].offset + loc->parts[i].length;
    }
    loc->length = loc->contiguous ? end - loc->offset : 0;
}

int64_t store_expert_index(const df_store *st, int layer, int e) { return st->expert_base[layer] + e; }

int store_expert_placed(const df_store *st, int layer, int e) {
    int f = -1;
    uint64_t off, len;
    if (!st->experts[layer][e].loc.contiguous) return 1;
    if (st->place.n_folders) placement_where(&st->place, layer, e, &f, &off, &len);
    return f >= 0;
}

int experts_build(df_store *st, df_error *err) {
    st->expert_base = xcalloc((size_t)st->n_layers + 1, sizeof *st->expert_base);
    for (int l = 0; l < st->n_layers; l++) st->expert_base[l + 1] = st->expert_base[l] + st->n_experts[l];
    for (int l = 0; l < st->n_layers; l++) {
        for (int e = 0; e < st->n_experts[l]; e++) {
            store_expert *x = &st->experts[l][e];
            df_tensor *w[3] = {&x->ex.w1, &x->ex.w2, &x->ex.w3};
            for (int m = 0; m < 3; m++) {
                int rc = store_expert_matrix(st, l, e, m, x, w[m], err);
                if (rc) return rc;
            }
            const df_tensor *ref = e ? &st->experts[l][0].ex.w1 : NULL;
            int ok = x->ex.w1.shape[0] == x->ex.w3.shape[0] && x->ex.w1.shape[1] == x->ex.w3.shape[1] &&
                     x->ex.w2.shape[0] == x->ex.w1.shape[1] && x->ex.w2.shape[1] == x->ex.w1.shape[0] &&
                     x->ex.w1.dtype == x->ex.w2.dtype && x->ex.w1.dtype == x->ex.w3.dtype;
            if (ok && ref) ok = ref->dtype == x->ex.w1.dtype && ref->shape[0] == x->ex.w1.shape[0] &&
                                ref->shape[1] == x->ex.w1.shape[1];
            int first = x->part[0][TENSOR_PART_WEIGHT].t ? TENSOR_PART_WEIGHT : TENSOR_PART_PACKED;
            if (!ok)
                return df_error_set(err, DF_EFORMAT, "%s: tensors '%s', '%s', '%s': expert shapes/dtypes inconsistent "
                                    "(w1 %s [%lld, %lld], w2 %s [%lld, %lld], w3 %s [%lld, %lld]; expected w1 = w3 = "
                                    "[I, D], w2 = [D, I], the same for every expert of the layer)",
                                    store_tensor_path(st, x->part[0][first]),
                                    x->ex.w1.name, x->ex.w2.name, x->ex.w3.name,
                                    tensor_dtype_name(x->ex.w1.dtype), (long long)x->ex.w1.shape[0],
                                    (long long)x->ex.w1.shape[1], tensor_dtype_name(x->ex.w2.dtype),
                                    (long long)x->ex.w2.shape[0], (long long)x->ex.w2.shape[1],
                                    tensor_dtype_name(x->ex.w3.dtype), (long long)x->ex.w3.shape[0],
                                    (long long)x->ex.w3.shape[1]), DF_EFORMAT;
            store_expert_locate_init(st, x);
        }
    }
    return DF_OK;
}


/* ---------------------------------------------------------------------------------------------------- */
/* Reading experts into cache slots. */

void experts_plan_read(df_store *st, store_expert *x) {
    x->one_read = x->loc.contiguous;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < TENSOR_PART_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (r.t && r.t->elem_size > 1 && store_ref_offset(st, r) % (uint64_t)r.t->elem_size) x->one_read = 0;
        }
}

/* Slot bytes expert x needs under the placement rule of io.h. */
uint64_t experts_slot_need(const df_store *st, const store_expert *x) {
    if (x->one_read) return io_span_bytes(x->loc.offset, x->loc.length);
    uint64_t n = 0;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < TENSOR_PART_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (r.t) n += io_span_bytes(store_ref_offset(st, r), r.t->end - r.t->begin) + IO_ALIGN;
        }
    return n;
}

/* E8M0 0xFF is NaN in the OCP MX spec: a checkpoint containing it is corrupt, not a weight to multiply. */
static int store_expert_check_scales(const df_store *st, int layer, int e, const store_expert *x,
                                     const uint8_t *const scale[3], df_error *err) {
    for (int m = 0; m < 3; m++) {
        store_ref r = x->part[m][TENSOR_PART_SCALE];
        if (!r.t) continue;
        const uint8_t *hit = memchr(scale[m], 0xFF, r.t->end - r.t->begin);
        if (!hit) continue;
        int64_t off = hit - scale[m], cols = r.t->shape[1];
        return df_error_set(err, DF_EFORMAT, "%s: expert %d of layer %d: tensor '%s': MXFP4 scale byte 0xFF (NaN) "
                            "at row %lld, block %lld (corrupt shard?)", store_tensor_path(st, r), e, layer,
                            r.t->name, (long long)(off / cols), (long long)(off % cols)), DF_EFORMAT;
    }
    return DF_OK;
}

int experts_load(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err) {
    df_store *st = ctx;
    const store_expert *x = &st->experts[layer][e];
    const uint8_t *ptr[3][TENSOR_PART_COUNT] = {{0}};
    char what[96];
    snprintf(what, sizeof what, "expert %d of layer %d", e, layer);
    io_source *src = st->src_expert;
    if (st->opts.test_before_read) st->opts.test_before_read(st->opts.test_ctx, layer, e);
    if (x->one_read) {
        int file = x->loc.shard, f = -1;   /* placed in another folder: the same bytes at another offset */
        uint64_t at = x->loc.offset, placed_at = 0, placed_len = 0;
        if (st->place.n_folders) placement_where(&st->place, layer, e, &f, &placed_at, &placed_len);
        if (f >= 0) file = st->ck.n_shards + f, at = placed_at;
        int rc = src->read(src, file, at, x->loc.length, slot, what, err);
        if (rc) return rc;
        const uint8_t *base = slot + x->loc.offset % IO_ALIGN;
        for (int m = 0; m < 3; m++)
            for (int k = 0; k < TENSOR_PART_COUNT; k++)
                if (x->part[m][k].t) ptr[m][k] = base + (store_ref_offset(st, x->part[m][k]) - x->loc.offset);
    } else {
        uint64_t at = 0;
        for (int m = 0; m < 3; m++)
            for (int k = 0; k < TENSOR_PART_COUNT; k++) {
                store_ref r = x->part[m][k];
                if (!r.t) continue;
                uint64_t off = store_ref_offset(st, r), len = r.t->end - r.t->begin;
                int rc = src->read(src, r.shard, off, len, slot + at, what, err);
                if (rc) return rc;
                uint8_t *got = slot + at + off % IO_ALIGN, *want = got;
                uint64_t es = r.t->elem_size > 1 ? (uint64_t)r.t->elem_size : 1;
                if ((uintptr_t)got % es) want = got + (es - (uintptr_t)got % es);
                if (want != got) memmove(want, got, len);
                ptr[m][k] = want;
                at += io_span_bytes(off, len) + IO_ALIGN;
            }
    }
    *view = x->ex;
    df_tensor *w[3] = {&view->w1, &view->w2, &view->w3};
    const uint8_t *scale[3] = {0};
    for (int m = 0; m < 3; m++) {
        if (ptr[m][TENSOR_PART_WEIGHT]) {
            w[m]->data = ptr[m][TENSOR_PART_WEIGHT];
            continue;
        }
        w[m]->data = ptr[m][TENSOR_PART_PACKED];
        w[m]->scale = scale[m] = ptr[m][TENSOR_PART_SCALE];
    }
    return store_expert_check_scales(st, layer, e, x, scale, err);
}


int store_expert_count(const df_store *st, int layer) {
    return layer >= 0 && layer < st->n_layers ? st->n_experts[layer] : 0;
}

const store_expert_loc *store_expert_locate(const df_store *st, int layer, int e) {
    if (layer < 0 || layer >= st->n_layers || e < 0 || e >= st->n_experts[layer]) return NULL;
    return &st->experts[layer][e].loc;
}

static int store_expert_check_range(const df_store *st, int layer, int e, df_error *err) {
    if (store_expert_locate(st, layer, e)) return DF_OK;
    return df_error_set(err, DF_EINVAL, "%s: expert %d of layer %d out of range (layer has %d experts)", st->dir, e,
                        layer, store_expert_count(st, layer)), DF_EINVAL;
}

/* In range and, with a mask, this rank's to read. */
static int store_expert_check_mine(const df_store *st, int layer, int e, df_error *err) {
    int rc = store_expert_check_range(st, layer, e, err);
    if (!rc && st->opts.expert_mask && !st->opts.expert_mask[st->expert_base[layer] + e])
        rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "%s: expert %d of layer %d is not this rank's to read (the rank "
                                     "plan gives it to others)", st->dir, e, layer);
    return rc;
}

int store_experts_note(df_store *st, int layer, const int *ids, int n, df_error *err) {
    for (int i = 0; i < n; i++) {
        int rc = store_expert_check_range(st, layer, ids[i], err);
        if (rc) return rc;
    }
    if (st->trace && n) {
        int rc = rtrace_writer_record(st->trace, layer, ids, n, err);
        if (rc) return rc;
    }
    if (st->heat && n) heat_add(st->heat, layer, ids, n);
    return DF_OK;
}

int store_experts_read(df_store *st, int layer, const int *ids, int n, df_error *err) {
    for (int i = 0; i < n; i++) {
        int rc = store_expert_check_mine(st, layer, ids[i], err);
        if (rc) return rc;
    }
    atomic_fetch_add(&st->expert_requests, (uint64_t)n);
    if (n) ecache_prefetch(st->cache, layer, ids, n);
    return DF_OK;
}

int store_experts_prefetch(df_store *st, int layer, const int *ids, int n, df_error *err) {
    int rc = store_experts_note(st, layer, ids, n, err);
    return rc ? rc : store_experts_read(st, layer, ids, n, err);
}

int store_lookahead_plan(df_store *st, int layer, int *read_ranks) {
    *read_ranks = 0;
    return store_expert_count(st, layer) ? readahead_plan(st->ra, layer, read_ranks) : STORE_LOOKAHEAD_SKIP;
}

void store_experts_hint(df_store *st, int layer, const int *ids, const int *rank, int n, int read_ranks) {
    int *ok = xmalloc(sizeof *ok * 2 * ((size_t)n + 1)), *ok_rank = ok + n + 1, m = 0;
    for (int i = 0; i < n; i++)
        if (store_expert_locate(st, layer, ids[i]) &&
            (!st->opts.expert_mask || st->opts.expert_mask[st->expert_base[layer] + ids[i]]))
            ok_rank[m] = rank[i], ok[m++] = ids[i];
    if (m) ecache_hint(st->cache, layer, ok, ok_rank, m, read_ranks);
    free(ok);
}

void store_lookahead_layer(df_store *st, int layer, df_layer_lookahead *out) {
    ecache_hint_stats h = {0};
    if (st->cache && store_expert_count(st, layer)) ecache_hint_layer(st->cache, layer, &h);
    memset(out, 0, sizeof *out);
    out->requests = h.requests, out->recalled = h.recalled, out->loads = h.loads;
    memcpy(out->guessed_rank, h.guessed_rank, sizeof out->guessed_rank);
    memcpy(out->recalled_rank, h.recalled_rank, sizeof out->recalled_rank);
    out->read_ranks = store_expert_count(st, layer) ? readahead_reading(st->ra, layer) : 0;
}

int store_expert_acquire(df_store *st, int layer, int e, df_expert *out, df_error *err) {
    int rc = store_expert_check_mine(st, layer, e, err);
    if (rc) return rc;
    return ecache_acquire(st->cache, layer, e, out, err);
}

int store_expert_acquire_next(df_store *st, int layer, const int *ids, int n, uint8_t *done, int *which,
                              df_expert *out, df_error *err) {
    for (int i = 0; i < n; i++) {
        int rc = done[i] ? DF_OK : store_expert_check_mine(st, layer, ids[i], err);
        if (rc) return *which = i, rc;
    }
    return ecache_acquire_next(st->cache, layer, ids, n, done, which, out, err);
}


void store_warm_wait(df_store *st) {
    if (st->cache) ecache_warm_wait(st->cache);
}

void store_populate_wait(df_store *st) {
    spine_warm_wait(st->warm);
    if (st->cache) ecache_populate_wait(st->cache);
}

const char *store_heat_note(const df_store *st) { return st->heat_note; }

void store_expert_release(df_store *st, int layer, int e) {
    if (store_expert_locate(st, layer, e)) ecache_release(st->cache, layer, e);
}
