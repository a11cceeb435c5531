/* catalog.c — the store's tables built from the checkpoint (format/checkpoint.h reads config.json and the
 * shards and classifies every tensor by the tensor-name table): top-level items, per-layer spine tables and
 * routed-expert parts, with views into the mapped shards. With the int8 spine asked for, spine items point at
 * the sidecar's copies instead. Problems that do not stop loading are collected for `info`. */
#include "store_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "format/int8_spine.h"

void store_problem(df_store *st, const char *fmt, ...) {
    if (st->n_problems++ >= STORE_MAX_PROBLEMS) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t a = st->problems ? strlen(st->problems) : 0, b = strlen(line);
    st->problems = xrealloc(st->problems, a + b + 2);
    memcpy(st->problems + a, line, b);
    st->problems[a + b] = '\n';
    st->problems[a + b + 1] = 0;
}

static int store_cmp_item(const void *a, const void *b) {
    return strcmp(((const store_item *)a)->key, ((const store_item *)b)->key);
}

const store_item *store_find_item(const store_item *items, int n, const char *key) {
    store_item k = {.key = key};
    return bsearch(&k, items, (size_t)n, sizeof k, store_cmp_item);
}

static void store_count_dtype(df_store *st, const st_tensor *t) {
    uint64_t bytes = t->end - t->begin;
    for (int i = 0; i < st->n_dtypes; i++)
        if (st->dtypes[i].name == t->dtype_name) {
            st->dtypes[i].count++;
            st->dtypes[i].bytes += bytes;
            return;
        }
    DF_ASSERT(st->n_dtypes < (int)(sizeof st->dtypes / sizeof st->dtypes[0]));
    st->dtypes[st->n_dtypes++] = (store_dtype_stat){t->dtype_name, 1, bytes};
}


/* ---------------------------------------------------------------------------------------------------- */
/* Sorting tensors into top-level items, layer items and expert parts by the tensor-name table. */

/* Kernels read elements through typed pointers, so a tensor whose offset is not a multiple of its element
 * size (legal in safetensors, never written by the usual tools) is served from an aligned copy. */
void store_align_view(df_store *st, df_tensor *v, int elem_size) {
    if (elem_size <= 1 || (uintptr_t)v->data % (uintptr_t)elem_size == 0) return;
    size_t n = (size_t)tensor_data_bytes(v);
    void *p = xaligned_alloc(64, n);
    memcpy(p, v->data, n);
    st->copies = xrealloc(st->copies, sizeof *st->copies * (size_t)(st->n_copies + 1));
    st->copies[st->n_copies++] = p;
    v->data = p;
}

static void store_item_init(df_store *st, store_item *it, const char *key, store_ref r) {
    df_error e;
    it->key = key;
    it->ref = r;
    it->usable = st_tensor_view(&st->ck.shards[r.shard], r.t, &it->view, &e) == DF_OK;
    if (!it->usable) store_problem(st, "%s", e.msg);
    else store_align_view(st, &it->view, r.t->elem_size);
}

/* Sorts a layer's items by key; two checkpoint tensors of one kind (both spellings of a dense FFN matrix) are
 * an error, since either could be meant. */
static int catalog_sort_layer(df_store *st, df_store_layer *l, df_error *err) {
    qsort(l->items, (size_t)l->n, sizeof *l->items, store_cmp_item);
    for (int i = 1; i < l->n; i++)
        if (!strcmp(l->items[i].key, l->items[i - 1].key))
            return df_error_set(err, DF_EFORMAT, "%s: tensors '%s' and '%s' both name layer %d's %s", st->dir,
                                l->items[i - 1].ref.t->name, l->items[i].ref.t->name, l->index, l->items[i].key),
                   DF_EFORMAT;
    return DF_OK;
}

int catalog_build_tables(df_store *st, df_error *err) {
    const checkpoint *ck = &st->ck;
    for (int i = 0; i < ck->n_notes; i++) store_problem(st, "%s", ck->notes[i]);
    st->n_layers = ck->n_layers;
    st->layers = xcalloc((size_t)st->n_layers + 1, sizeof *st->layers);
    st->n_experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->n_experts);
    st->experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->experts);
    st->expert_shard = xcalloc((size_t)st->n_layers + 1, sizeof *st->expert_shard);
    int64_t n_glob = 0;
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const ckpt_tensor *x = &ck->tensors[i];
        if (x->cls == TENSOR_TOP) n_glob++;
        else if (x->cls == TENSOR_SPINE) st->layers[x->layer].n++;
        else if (x->cls == TENSOR_EXPERT && x->expert >= st->n_experts[x->layer])
            st->n_experts[x->layer] = x->expert + 1;
    }
    st->globals = xcalloc((size_t)n_glob + 1, sizeof *st->globals);
    for (int l = 0; l < st->n_layers; l++) {
        st->layers[l].index = l;
        st->layers[l].items = xcalloc((size_t)st->layers[l].n + 1, sizeof(store_item));
        st->layers[l].n = 0;
        st->experts[l] = xcalloc((size_t)st->n_experts[l] + 1, sizeof(store_expert));
    }
    /* pass 2: fill; items are keyed by the table's canonical name of their kind */
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const ckpt_tensor *x = &ck->tensors[i];
        store_ref r = {x->shard, x->t};
        uint64_t bytes = r.t->end - r.t->begin;
        st->n_tensors++;
        st->total_bytes += bytes;
        tensor_class c = x->cls;
        int layer = x->layer, expert = x->expert;
        tensor_kind kind = x->kind;
        if (c == TENSOR_NON_TEXT) {
            st->n_ignored++;
            st->ignored_bytes += bytes;
            continue;
        }
        if (c == TENSOR_UNKNOWN) {
            st->n_unknown++;
            st->unknown_bytes += bytes;
            store_problem(st, "%s: tensor '%s' is not a %s tensor name (ignored)", store_tensor_path(st, r),
                          r.t->name, ck->family == TENSOR_FAMILY_K3 ? "Kimi K3" : "Kimi-Linear");
            continue;
        }
        store_count_dtype(st, r.t);
        if (c == TENSOR_EXPERT) {
            st->expert_bytes += bytes;
            st->experts[layer][expert].part[tensor_expert_mat(kind)][tensor_expert_part(kind)] = r;
            st->expert_shard[layer] = r.shard;
            continue;
        }
        st->spine_bytes += bytes;
        if (c == TENSOR_TOP) {
            store_item_init(st, &st->globals[st->n_globals++], tensor_name_suffix(kind), r);
        } else {
            df_store_layer *l = &st->layers[layer];
            store_item_init(st, &l->items[l->n++], tensor_name_suffix(kind), r);
        }
    }
    qsort(st->globals, (size_t)st->n_globals, sizeof *st->globals, store_cmp_item);
    for (int l = 0; l < st->n_layers; l++) {
        df_store_layer *ly = &st->layers[l];
        int rc = catalog_sort_layer(st, ly, err);
        if (rc) return rc;
        ly->bad = -1;
        for (int i = 0; i < ly->n && ly->bad < 0; i++)
            if (!ly->items[i].usable) ly->bad = i;
    }
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* The int8 spine (format in int8_spine.h). With opts.spine DF_SPINE_INT8, every spine item whose checkpoint
 * tensor has an int8 copy in the sidecar points at that copy instead: one byte range holding the fp16 row
 * scales then the int8 rows, which the mapping, the memory plan and spine streaming then size, read and place
 * like any other tensor (store_item_place splits it into scale and data). */

void store_item_place(store_item *it, const uint8_t *p) {
    if (it->int8) int8_spine_place(&it->view, p);
    else it->view.data = p;
}

static void store_int8_point(df_store *st, store_item *it, int span) {
    const st_tensor *t = &st->int8_spans[span];
    it->ref = (store_ref){st->int8_shard[span], t};
    it->usable = 1;
    it->int8 = 1;
    it->view = (df_tensor){.name = t->name, .dtype = DF_DT_I8, .ndim = 2, .shape = {t->shape[0], t->shape[1]}};
    int8_spine_place(&it->view, t->data);
}

static int store_int8_swap(df_store *st, store_item *it, int first_shard, df_error *err) {
    const st_tensor *src = it->ref.t;
    for (int s = first_shard; s < st->ck.n_shards; s++) {
        st_tensor span;
        int found = int8_spine_find(&st->ck.shards[s], src->name, &span, err);
        if (found < 0) return found;
        if (!found) continue;
        if (src->ndim != 2 || span.shape[0] != src->shape[0] || span.shape[1] != src->shape[1])
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s' is [%lld, %lld] but the checkpoint's is %s; the int8 "
                                "spine was written for another checkpoint (rerun `deltafin quantize --spine int8`)",
                                st->ck.shards[s].path, src->name, (long long)span.shape[0], (long long)span.shape[1],
                                src->ndim == 2 ? "another shape" : "not a matrix"), DF_EFORMAT;
        st->int8_spans[st->n_int8] = span;
        st->int8_shard[st->n_int8] = s;
        st->spine_bytes = st->spine_bytes - (src->end - src->begin) + (span.end - span.begin);
        st->int8_replaced_bytes += src->end - src->begin;
        st->int8_bytes += span.end - span.begin;
        store_int8_point(st, it, st->n_int8++);
        return DF_OK;
    }
    if (int8_spine_eligible(src->name, src->dtype, src->ndim, src->shape))
        return df_error_set(err, DF_EFORMAT, "%s: the int8 spine has no copy of '%s'; it was written for another "
                            "checkpoint or by an older rule (rerun `deltafin quantize --spine int8`)", st->dir,
                            src->name), DF_EFORMAT;
    return DF_OK;
}

/* A sidecar the store does not use is still checked, so that `info` reports one left over from other weights
 * before --spine int8 is asked for. */
static void catalog_check_unused_int8(df_store *st) {
    char **files;
    int n;
    df_error e = {0};
    if (int8_spine_files(st->dir, &files, &n, &e)) {
        store_problem(st, "%s", e.msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        char *path = df_path_join(st->dir, files[i]);
        st_file f;
        e = (df_error){0};
        if (st_file_open(&f, path, &e) || int8_spine_check(&f, st->ck.shards, st->ck.n_shards, &e))
            store_problem(st, "%s", e.msg);
        st_file_close(&f);
        free(path);
        free(files[i]);
    }
    free(files);
}

/* The spine split over ranks: matrices this process does not use leave the spine's bytes, and their views lose
 * their data, so that a use of one by mistake faults instead of quietly reading the disk. Vectors (a [1, n]
 * projection too) stay: every rank copies its own at bind. */
static void catalog_foreign_items(df_store *st, int layer, store_item *it, int n) {
    for (int i = 0; i < n; i++) {
        const df_tensor *v = &it[i].view;
        if (!it[i].usable || v->ndim != 2 || v->shape[0] < 2 || v->shape[1] < 2 ||
            st->opts.spine_keep(st->opts.spine_keep_ctx, layer, it[i].key))
            continue;
        it[i].foreign = 1;
        it[i].view.data = NULL;
        it[i].view.scale = NULL;
        st->spine_bytes -= it[i].ref.t->end - it[i].ref.t->begin;
        st->foreign_bytes += it[i].ref.t->end - it[i].ref.t->begin;
    }
}

void catalog_mark_foreign(df_store *st) {
    if (!st->opts.spine_keep) return;
    for (int l = 0; l < st->n_layers; l++) catalog_foreign_items(st, l, st->layers[l].items, st->layers[l].n);
    catalog_foreign_items(st, st->n_layers, st->globals, st->n_globals);
}

int catalog_use_int8_spine(df_store *st, df_error *err) {
    if (st->opts.spine != DF_SPINE_INT8) {
        catalog_check_unused_int8(st);
        return DF_OK;
    }
    char **files;
    int n, rc = int8_spine_files(st->dir, &files, &n, err), first = st->ck.n_shards;
    if (!rc && !n)
        rc = (df_error_set(err, DF_EIO, "%s: the int8 spine was asked for, but the folder has no %s; write it with "
                           "`deltafin quantize -m %s --spine int8`", st->dir, INT8_SPINE_FILE, st->dir), DF_EIO);
    for (int i = 0; i < n; i++) {
        if (!rc) rc = ckpt_add_shard(&st->ck, files[i], err);
        free(files[i]);
    }
    free(files);
    st->n_int8_files = n;
    int64_t items = st->n_globals;
    for (int l = 0; l < st->n_layers; l++) items += st->layers[l].n;
    st->int8_spans = xcalloc((size_t)items + 1, sizeof *st->int8_spans);
    st->int8_shard = xcalloc((size_t)items + 1, sizeof *st->int8_shard);
    for (int l = 0; l < st->n_layers && !rc; l++)
        for (int i = 0; i < st->layers[l].n && !rc; i++)
            if (st->layers[l].items[i].usable) rc = store_int8_swap(st, &st->layers[l].items[i], first, err);
    for (int i = 0; i < st->n_globals && !rc; i++)
        if (st->globals[i].usable) rc = store_int8_swap(st, &st->globals[i], first, err);
    for (int s = first; s < st->ck.n_shards && !rc; s++)   /* computed from these weights, not others */
        rc = int8_spine_check(&st->ck.shards[s], st->ck.shards, first, err);
    return rc;
}
