/* catalog.c — the checkpoint as a catalog: config.json, the shards (one model.safetensors or those an index
 * names), and every tensor sorted into top-level tensors, per-layer spine tables and routed-expert parts by the
 * tensor-name table (tensor_names.h). With the int8 spine asked for, spine items point at the sidecar's
 * copies instead. Problems that do not stop loading are collected for `info`. */
#include "store_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
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
/* Collecting the checkpoint's tensors: from the index's weight_map, or every tensor of model.safetensors. */

static void store_refs_push(store_refs *r, store_ref x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->v = xrealloc(r->v, sizeof *r->v * (size_t)r->cap);
    }
    r->v[r->n++] = x;
}

int store_add_shard(df_store *st, const char *file, df_error *err) {
    char *path = df_path_join(st->dir, file);
    st->shards = xrealloc(st->shards, sizeof *st->shards * (size_t)(st->n_shards + 1));
    int rc = st_file_open(&st->shards[st->n_shards], path, err);
    free(path);
    if (rc) return rc;
    return st->n_shards++, DF_OK;
}

int store_shard_name_ok(const char *f) {
    if (!*f || f[0] == '/') return 0;
    for (const char *p = f; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2])) return 0;
    return 1;
}

static int store_load_index(df_store *st, const char *index_path, store_refs *refs, df_error *err) {
    json_t *root = df_json_load_file(index_path, JSON_REJECT_DUPLICATES, err);
    if (!root) return err->code;
    json_t *wm = json_object_get(root, "weight_map");
    int rc = DF_OK;
    if (!json_is_object(wm)) {
        df_error_set(err, DF_EFORMAT, "%s: missing \"weight_map\" object", index_path);
        rc = DF_EFORMAT;
    }
    char **shard_names = NULL;
    int64_t *used = NULL;
    int last = -1;
    const char *name;
    json_t *val;
    if (!rc) json_object_foreach(wm, name, val) {
        if (!json_is_string(val) || !store_shard_name_ok(json_string_value(val))) {
            df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shard must be a relative file name inside the model "
                         "folder", index_path, name);
            rc = DF_EFORMAT;
            break;
        }
        const char *file = json_string_value(val);
        int s = last >= 0 && !strcmp(shard_names[last], file) ? last : -1;
        for (int i = 0; s < 0 && i < st->n_shards; i++)
            if (!strcmp(shard_names[i], file)) s = i;
        if (s < 0) {
            if ((rc = store_add_shard(st, file, err))) {
                char inner[sizeof err->msg];
                memcpy(inner, err->msg, sizeof inner);
                df_error_set(err, rc, "%s names shard '%s' (for tensor '%s'), which cannot be used: %s", index_path,
                             file, name, inner);
                break;
            }
            s = st->n_shards - 1;
            shard_names = xrealloc(shard_names, sizeof *shard_names * (size_t)st->n_shards);
            used = xrealloc(used, sizeof *used * (size_t)st->n_shards);
            shard_names[s] = xstrdup(file);
            used[s] = 0;
        }
        last = s;
        const st_tensor *t = st_file_find(&st->shards[s], name);
        if (!t) {
            df_error_set(err, DF_EFORMAT, "%s lists tensor '%s' in shard %s, but the shard has no such tensor",
                         index_path, name, st->shards[s].path);
            rc = DF_EFORMAT;
            break;
        }
        used[s]++;
        store_refs_push(refs, (store_ref){s, t});
    }
    for (int i = 0; i < st->n_shards && shard_names; i++) {
        if (!rc && used[i] < st->shards[i].n_tensors) {
            st->n_unindexed += st->shards[i].n_tensors - used[i];
            store_problem(st, "%s: %lld tensors not listed in the index (ignored)", st->shards[i].path,
                          (long long)(st->shards[i].n_tensors - used[i]));
        }
        free(shard_names[i]);
    }
    free(shard_names);
    free(used);
    json_decref(root);
    return rc;
}

int catalog_collect(df_store *st, store_refs *refs, df_error *err) {
    char *index_path = df_path_join(st->dir, "model.safetensors.index.json");
    int rc;
    if (access(index_path, F_OK) == 0) {
        st->indexed = 1;
        rc = store_load_index(st, index_path, refs, err);
    } else {
        char *single = df_path_join(st->dir, "model.safetensors");
        if (access(single, F_OK) != 0) {
            df_error_set(err, DF_EIO, "%s: neither model.safetensors nor model.safetensors.index.json found",
                         st->dir);
            rc = DF_EIO;
        } else if (!(rc = store_add_shard(st, "model.safetensors", err))) {
            for (int i = 0; i < st->shards[0].n_tensors; i++)
                store_refs_push(refs, (store_ref){0, &st->shards[0].tensors[i]});
        }
        free(single);
    }
    free(index_path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* config.json */

int catalog_load_config(df_store *st, int *n_layers, df_error *err) {
    char *path = df_path_join(st->dir, "config.json");
    size_t len;
    st->config_text = df_read_file_max(path, DF_JSON_FILE_MAX, &len, err);
    if (!st->config_text) {
        free(path);
        return DF_EIO;
    }
    json_error_t je;
    json_t *root = json_loadb(st->config_text, len, 0, &je);
    int rc = DF_OK;
    if (!root || !json_is_object(root)) {
        df_error_set(err, DF_EFORMAT, "%s: bad JSON: %s (line %d, column %d)", path, root ? "not an object" : je.text,
                     je.line, je.column);
        rc = DF_EFORMAT;
    } else {
        const char *mt = json_string_value(json_object_get(root, "model_type"));
        st->model_type = xstrdup(mt ? mt : "unknown");
        st->family = tensor_family_of(st->model_type);
        json_t *text = json_object_get(root, "text_config");
        if (!strcmp(st->model_type, "kimi_k3") && json_is_object(text)) {
            json_incref(text);
            json_decref(root);
            root = text;
        }
        json_int_t nl = json_integer_value(json_object_get(root, "num_hidden_layers"));
        *n_layers = nl > 0 && nl <= TENSOR_MAX_LAYERS ? (int)nl : 0;
    }
    json_decref(root);
    free(path);
    return rc;
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
    it->usable = st_tensor_view(&st->shards[r.shard], r.t, &it->view, &e) == DF_OK;
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

int catalog_build_tables(df_store *st, const store_refs *refs, int cfg_layers, df_error *err) {
    /* pass 1: sizes */
    int max_layer = cfg_layers - 1, layer, expert;
    tensor_kind kind;
    for (int64_t i = 0; i < refs->n; i++) {
        const st_tensor *t = refs->v[i].t;
        tensor_class c = tensor_classify(t->name, st->family, &layer, &expert, &kind);
        if (c == TENSOR_UNKNOWN && expert >= 0)
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': unrecognised routed-expert tensor name (expected "
                                "experts.{e}.w{1,2,3}.weight, .weight_packed or .weight_scale)",
                                store_tensor_path(st, refs->v[i]), t->name), DF_EFORMAT;
        if ((c == TENSOR_SPINE || c == TENSOR_EXPERT) && layer > max_layer) max_layer = layer;
    }
    st->n_layers = max_layer + 1;
    st->layers = xcalloc((size_t)st->n_layers + 1, sizeof *st->layers);
    st->n_experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->n_experts);
    st->experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->experts);
    st->expert_shard = xcalloc((size_t)st->n_layers + 1, sizeof *st->expert_shard);
    int64_t n_glob = 0;
    for (int64_t i = 0; i < refs->n; i++) {
        tensor_class c = tensor_classify(refs->v[i].t->name, st->family, &layer, &expert, &kind);
        if (c == TENSOR_TOP) n_glob++;
        else if (c == TENSOR_SPINE) st->layers[layer].n++;
        else if (c == TENSOR_EXPERT && expert >= st->n_experts[layer]) st->n_experts[layer] = expert + 1;
    }
    st->globals = xcalloc((size_t)n_glob + 1, sizeof *st->globals);
    for (int l = 0; l < st->n_layers; l++) {
        st->layers[l].index = l;
        st->layers[l].items = xcalloc((size_t)st->layers[l].n + 1, sizeof(store_item));
        st->layers[l].n = 0;
        st->experts[l] = xcalloc((size_t)st->n_experts[l] + 1, sizeof(store_expert));
    }
    /* pass 2: fill; items are keyed by the table's canonical name of their kind */
    for (int64_t i = 0; i < refs->n; i++) {
        store_ref r = refs->v[i];
        uint64_t bytes = r.t->end - r.t->begin;
        st->n_tensors++;
        st->total_bytes += bytes;
        tensor_class c = tensor_classify(r.t->name, st->family, &layer, &expert, &kind);
        if (c == TENSOR_NON_TEXT) {
            st->n_ignored++;
            st->ignored_bytes += bytes;
            continue;
        }
        if (c == TENSOR_UNKNOWN) {
            st->n_unknown++;
            st->unknown_bytes += bytes;
            store_problem(st, "%s: tensor '%s' is not a %s tensor name (ignored)", store_tensor_path(st, r),
                          r.t->name, st->family == TENSOR_FAMILY_K3 ? "Kimi K3" : "Kimi-Linear");
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
    for (int s = first_shard; s < st->n_shards; s++) {
        st_tensor span;
        int found = int8_spine_find(&st->shards[s], src->name, &span, err);
        if (found < 0) return found;
        if (!found) continue;
        if (src->ndim != 2 || span.shape[0] != src->shape[0] || span.shape[1] != src->shape[1])
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s' is [%lld, %lld] but the checkpoint's is %s; the int8 "
                                "spine was written for another checkpoint (rerun `deltafin quantize --spine int8`)",
                                st->shards[s].path, src->name, (long long)span.shape[0], (long long)span.shape[1],
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
        if (st_file_open(&f, path, &e) || int8_spine_check(&f, st->shards, st->n_shards, &e))
            store_problem(st, "%s", e.msg);
        st_file_close(&f);
        free(path);
        free(files[i]);
    }
    free(files);
}

int catalog_use_int8_spine(df_store *st, df_error *err) {
    if (st->opts.spine != DF_SPINE_INT8) {
        catalog_check_unused_int8(st);
        return DF_OK;
    }
    char **files;
    int n, rc = int8_spine_files(st->dir, &files, &n, err), first = st->n_shards;
    if (!rc && !n)
        rc = (df_error_set(err, DF_EIO, "%s: the int8 spine was asked for, but the folder has no %s; write it with "
                           "`deltafin quantize -m %s --spine int8`", st->dir, INT8_SPINE_FILE, st->dir), DF_EIO);
    for (int i = 0; i < n; i++) {
        if (!rc) rc = store_add_shard(st, files[i], err);
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
    for (int s = first; s < st->n_shards && !rc; s++)   /* computed from these weights, not others */
        rc = int8_spine_check(&st->shards[s], st->shards, first, err);
    return rc;
}
