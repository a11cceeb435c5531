/* store.c — the storage seam over local files: a model folder (config.json plus model.safetensors or a
 * sharded index). Owns name resolution (the K3 "language_model." prefix), the per-layer tensor tables, the
 * routed-expert table with MXFP4 pairing, the expert index, the memory plan and the `info` description.
 * Shards are mapped for their headers; the spine is served from the mapping when it fits the budget, else
 * read into budgeted buffers (resident or streamed, spine.c). Routed experts are always read (O_DIRECT) into
 * the slot cache (cache.c), and their scale bytes are checked on every read (checking 1.4 TB at open would
 * read the whole checkpoint). */
#include "store.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/util.h"
#include "budget.h"
#include "cache.h"
#include "expert_index.h"
#include "io.h"
#include "remote.h"
#include "safetensors.h"
#include "spine.h"
#include "int8_spine.h"
#include "readahead.h"
#include "policy.h"
#include "trace.h"
#include "heat.h"
#include "tiles.h"
#include "place.h"

#define STORE_PREFIX "language_model."
#define STORE_MAX_LAYERS 4096
#define STORE_MAX_EXPERTS 65536
#define STORE_MAX_PROBLEMS 24
#define STORE_IO_THREADS 8
#define STORE_MIN_SLOTS 24

enum { KIND_WEIGHT, KIND_PACKED, KIND_SCALE, KIND_SHAPE, KIND_COUNT };
static const char *const store_kind_names[KIND_COUNT] = {"weight", "weight_packed", "weight_scale", "weight_shape"};

/* One tensor of the checkpoint as the store sees it: which shard, which header entry. */
typedef struct store_ref {
    int shard;
    const st_tensor *t;
} store_ref;

/* A layer tensor (key = suffix after "model.layers.{i}.") or a global (key = name relative to the text
 * root). The key points into the tensor's own name or at a static alias. */
typedef struct store_item {
    const char *key;
    store_ref ref;
    int usable;
    int int8;            /* view is an int8 spine span (scales then rows), see int8_spine.h */
    df_tensor view;
} store_item;

struct df_store_layer {
    int index;
    int n;
    store_item *items;   /* sorted by key */
    int bad;             /* index of an item with an unusable dtype/shape, or -1 */
    int *region;         /* streamed/resident spine: item -> region of its spine unit */
};

typedef struct store_expert {
    store_ref part[3][KIND_COUNT];   /* [w1,w2,w3][kind]; t == NULL when absent */
    df_expert ex;
    store_expert_loc loc;
    int one_read;                    /* contiguous and every part aligned to its element size */
} store_expert;

typedef struct store_dtype_stat {
    const char *name;
    int64_t count;
    uint64_t bytes;
} store_dtype_stat;

struct df_store {
    char *dir;
    char *config_text;
    char *model_type;
    int prefixed;                    /* text tensors live under "language_model." */
    int indexed;
    int n_shards;
    st_file *shards;
    int n_layers;
    df_store_layer *layers;
    int n_globals;
    store_item *globals;
    int *n_experts;                  /* per layer */
    int *expert_shard;               /* per layer: a shard holding some of its experts */
    store_expert **experts;          /* per layer, n_experts[l] entries */
    /* statistics for store_describe */
    int64_t n_tensors, n_ignored, n_unindexed;
    uint64_t total_bytes, spine_bytes, expert_bytes, ignored_bytes;
    store_dtype_stat dtypes[16];
    int n_dtypes;
    char *problems;
    int n_problems;
    void **copies;                   /* aligned copies of misaligned tensors */
    int n_copies;
    /* reading and memory */
    store_opts opts;
    io_source *src_expert, *src_spine;
    io_pool *pool;
    ecache *cache;
    readahead *ra;                   /* look-ahead policy */
    spine *spine;                    /* NULL: spine served from the mappings */
    int *global_region;              /* globals -> region of the top-level unit, -1 for mapped ones */
    uint64_t slot_bytes, reserve_bytes;
    int64_t n_experts_total;
    atomic_uint_fast64_t expert_requests;
    /* int8 spine: the sidecar's shards follow the checkpoint's in shards[]; spans are what items point at */
    st_tensor *int8_spans;
    int *int8_shard;                 /* per span: its shard */
    int n_int8, n_int8_files;
    uint64_t int8_bytes, int8_replaced_bytes;
    rtrace_writer *trace;            /* --trace-routing */
    uint64_t min_budget;             /* smallest budget this model opens with: all streamed, lm_head tiled */
    uint64_t min_slots;
    placement place;                 /* experts copied to other folders (n_folders 0: none) */
    heat *heat;                      /* per-expert heat (DF_HEAT_ON / DF_HEAT_READ) */
    int head_tiled;                  /* lm_head streams in row tiles (tiles.h) instead of staying resident */
    tiles head;
    char heat_note[512];
};

/* ---------------------------------------------------------------------------------------------------- */

static void store_problem(df_store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void store_problem(df_store *st, const char *fmt, ...) {
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

static const store_item *store_find_item(const store_item *items, int n, const char *key) {
    store_item k = {.key = key};
    return bsearch(&k, items, (size_t)n, sizeof k, store_cmp_item);
}

/* Parses a canonical decimal (no sign, no leading zero) at *s, advancing past it; -1 if none or > max. */
static long store_parse_index(const char **s, long max) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > max) return -1;
    }
    *s = p;
    return v;
}

static const char *store_tensor_path(const df_store *st, store_ref r) { return st->shards[r.shard].path; }

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

typedef struct store_refs {
    store_ref *v;
    int64_t n, cap;
} store_refs;

static void store_refs_push(store_refs *r, store_ref x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->v = xrealloc(r->v, sizeof *r->v * (size_t)r->cap);
    }
    r->v[r->n++] = x;
}

static int store_add_shard(df_store *st, const char *file, df_error *err) {
    char *path = df_path_join(st->dir, file);
    st->shards = xrealloc(st->shards, sizeof *st->shards * (size_t)(st->n_shards + 1));
    int rc = st_file_open(&st->shards[st->n_shards], path, err);
    free(path);
    if (rc) return rc;
    return st->n_shards++, DF_OK;
}

static int store_shard_name_ok(const char *f) {
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

static int store_collect(df_store *st, store_refs *refs, df_error *err) {
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

static int store_load_config(df_store *st, int *n_layers, df_error *err) {
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
        json_t *text = json_object_get(root, "text_config");
        if (!strcmp(st->model_type, "kimi_k3") && json_is_object(text)) {
            json_incref(text);
            json_decref(root);
            root = text;
        }
        json_int_t nl = json_integer_value(json_object_get(root, "num_hidden_layers"));
        *n_layers = nl > 0 && nl <= STORE_MAX_LAYERS ? (int)nl : 0;
    }
    json_decref(root);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Classifying tensors into globals, layer tensors and expert parts. */

typedef struct store_name {
    int layer;        /* -1: global */
    long expert;      /* -1: not an expert tensor */
    int mat, kind;
    const char *rel;  /* relative to the text root */
    const char *suffix;
} store_name;

/* Returns 0 if the tensor is not part of the text model (ignored), -1 on a malformed expert name. */
static int store_parse_name(const df_store *st, const char *full, store_name *out) {
    *out = (store_name){.layer = -1, .expert = -1};
    size_t pl = strlen(STORE_PREFIX);
    if (st->prefixed && strncmp(full, STORE_PREFIX, pl)) return 0;
    out->rel = st->prefixed ? full + pl : full;
    const char *p = out->rel;
    if (strncmp(p, "model.layers.", 13)) return 1;
    p += 13;
    long layer = store_parse_index(&p, STORE_MAX_LAYERS - 1);
    if (layer < 0 || *p != '.') return 1;
    out->layer = (int)layer;
    out->suffix = ++p;
    static const char ex[] = "block_sparse_moe.experts.";
    if (strncmp(p, ex, sizeof ex - 1) || p[sizeof ex - 1] < '0' || p[sizeof ex - 1] > '9') return 1;
    p += sizeof ex - 1;
    long e = store_parse_index(&p, STORE_MAX_EXPERTS - 1);
    if (e < 0 || p[0] != '.' || p[1] != 'w' || p[2] < '1' || p[2] > '3' || p[3] != '.') return -1;
    out->expert = e;
    out->mat = p[2] - '1';
    for (int k = 0; k < KIND_COUNT; k++)
        if (!strcmp(p + 4, store_kind_names[k])) return out->kind = k, 1;
    return -1;
}

/* Kernels read elements through typed pointers, so a tensor whose offset is not a multiple of its element
 * size (legal in safetensors, never written by the usual tools) is served from an aligned copy. */
static void store_align_view(df_store *st, df_tensor *v, int elem_size) {
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

/* Checkpoints saved by HF transformers name the dense FFN "block_sparse_moe.*_proj". */
static void store_layer_aliases(df_store_layer *l) {
    static const char *const alias[3][2] = {
        {"mlp.gate_proj.weight", "block_sparse_moe.gate_proj.weight"},
        {"mlp.up_proj.weight", "block_sparse_moe.up_proj.weight"},
        {"mlp.down_proj.weight", "block_sparse_moe.down_proj.weight"},
    };
    qsort(l->items, (size_t)l->n, sizeof *l->items, store_cmp_item);
    int n = l->n;
    for (int i = 0; i < 3; i++) {
        const store_item *src = store_find_item(l->items, n, alias[i][1]);
        if (!src || store_find_item(l->items, n, alias[i][0])) continue;
        l->items[l->n] = *src;
        l->items[l->n++].key = alias[i][0];
    }
    qsort(l->items, (size_t)l->n, sizeof *l->items, store_cmp_item);
}

static int store_build_tables(df_store *st, const store_refs *refs, int cfg_layers, df_error *err) {
    st->prefixed = 0;
    for (int64_t i = 0; i < refs->n && !st->prefixed; i++)
        st->prefixed = !strncmp(refs->v[i].t->name, STORE_PREFIX, strlen(STORE_PREFIX));
    /* pass 1: sizes */
    int max_layer = cfg_layers - 1;
    store_name nm;
    for (int64_t i = 0; i < refs->n; i++) {
        const st_tensor *t = refs->v[i].t;
        int k = store_parse_name(st, t->name, &nm);
        if (k < 0)
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': unrecognised routed-expert tensor name (expected "
                                "experts.{e}.w{1,2,3}.weight, .weight_packed or .weight_scale)",
                                store_tensor_path(st, refs->v[i]), t->name), DF_EFORMAT;
        if (nm.layer > max_layer) max_layer = nm.layer;
    }
    st->n_layers = max_layer + 1;
    st->layers = xcalloc((size_t)st->n_layers + 1, sizeof *st->layers);
    st->n_experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->n_experts);
    st->experts = xcalloc((size_t)st->n_layers + 1, sizeof *st->experts);
    st->expert_shard = xcalloc((size_t)st->n_layers + 1, sizeof *st->expert_shard);
    int64_t n_glob = 0;
    for (int64_t i = 0; i < refs->n; i++) {
        if (!store_parse_name(st, refs->v[i].t->name, &nm)) continue;
        if (nm.layer < 0) n_glob++;
        else if (nm.expert < 0) st->layers[nm.layer].n++;
        else if (nm.expert >= st->n_experts[nm.layer]) st->n_experts[nm.layer] = (int)nm.expert + 1;
    }
    st->globals = xcalloc((size_t)n_glob + 1, sizeof *st->globals);
    for (int l = 0; l < st->n_layers; l++) {
        st->layers[l].index = l;
        st->layers[l].items = xcalloc((size_t)st->layers[l].n + 3 + 1, sizeof(store_item));
        st->layers[l].n = 0;
        st->experts[l] = xcalloc((size_t)st->n_experts[l] + 1, sizeof(store_expert));
    }
    /* pass 2: fill */
    for (int64_t i = 0; i < refs->n; i++) {
        store_ref r = refs->v[i];
        uint64_t bytes = r.t->end - r.t->begin;
        st->n_tensors++;
        st->total_bytes += bytes;
        if (!store_parse_name(st, r.t->name, &nm)) {
            st->n_ignored++;
            st->ignored_bytes += bytes;
            continue;
        }
        store_count_dtype(st, r.t);
        if (nm.expert >= 0) {
            st->expert_bytes += bytes;
            st->experts[nm.layer][nm.expert].part[nm.mat][nm.kind] = r;
            st->expert_shard[nm.layer] = r.shard;
            continue;
        }
        st->spine_bytes += bytes;
        if (nm.layer < 0) {
            store_item_init(st, &st->globals[st->n_globals++], nm.rel, r);
        } else {
            df_store_layer *l = &st->layers[nm.layer];
            store_item_init(st, &l->items[l->n++], nm.suffix, r);
        }
    }
    qsort(st->globals, (size_t)st->n_globals, sizeof *st->globals, store_cmp_item);
    for (int l = 0; l < st->n_layers; l++) {
        df_store_layer *ly = &st->layers[l];
        store_layer_aliases(ly);
        ly->bad = -1;
        for (int i = 0; i < ly->n && ly->bad < 0; i++)
            if (!ly->items[i].usable) ly->bad = i;
    }
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* The int8 spine (format in int8_spine.h). With opts.spine_int8, every spine item whose checkpoint
 * tensor has an int8 copy in the sidecar points at that copy instead: one byte range holding the fp16 row
 * scales then the int8 rows, which the mapping, the memory plan and spine streaming then size, read and place
 * like any other tensor (store_item_place splits it into scale and data). */

static void store_item_place(store_item *it, const uint8_t *p) {
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
    for (int i = 0; i < st->n_int8; i++)
        if (!strcmp(st->int8_spans[i].name, src->name)) {   /* an alias of a tensor already swapped */
            store_int8_point(st, it, i);
            return DF_OK;
        }
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

static int store_use_int8_spine(df_store *st, df_error *err) {
    if (!st->opts.spine_int8) return DF_OK;
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
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Routed experts: pairing, shape checks, byte spans. */

static const char *store_mat_name(int m) { return m == 0 ? "w1" : m == 1 ? "w2" : "w3"; }

/* Fills one matrix view of an expert; the error names the file and tensor at fault. */
static int store_expert_matrix(df_store *st, int layer, int e, int m, store_expert *x, df_tensor *out,
                               df_error *err) {
    store_ref *p = x->part[m];
    const char *pre = st->prefixed ? STORE_PREFIX : "";
    /* a file of this expert, or (when the whole expert is missing) one holding the layer's experts */
    const char *file = st->shards[st->expert_shard[layer]].path;
    for (int mm = 0; mm < 3; mm++)
        for (int k = 0; k < KIND_COUNT; k++)
            if (x->part[mm][k].t) file = store_tensor_path(st, x->part[mm][k]);
    if (p[KIND_WEIGHT].t && (p[KIND_PACKED].t || p[KIND_SCALE].t))
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': expert matrix has both a plain weight and MXFP4 "
                            "weight_packed/weight_scale", file, p[KIND_WEIGHT].t->name), DF_EFORMAT;
    if (p[KIND_WEIGHT].t) {
        const st_tensor *t = p[KIND_WEIGHT].t;
        int rc = st_tensor_view(&st->shards[p[KIND_WEIGHT].shard], t, out, err);
        if (rc) return rc;
        if (t->ndim != 2 || (t->dtype != DF_DT_F32 && t->dtype != DF_DT_BF16 && t->dtype != DF_DT_F16))
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': expert weight must be a 2-D F32/BF16/F16 "
                                "matrix, got %s with %d dims", file, t->name, t->dtype_name, t->ndim), DF_EFORMAT;
        store_align_view(st, out, t->elem_size);
        return DF_OK;
    }
    const st_tensor *pk = p[KIND_PACKED].t, *sc = p[KIND_SCALE].t;
    if (!pk || !sc)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%smodel.layers.%d.block_sparse_moe.experts.%d.%s.%s' is "
                            "missing (experts of a layer must be numbered 0..E-1, each with w1, w2, w3 as .weight "
                            "or .weight_packed + .weight_scale)", file, pre, layer, e, store_mat_name(m),
                            pk ? "weight_scale" : sc ? "weight_packed" : "weight"), DF_EFORMAT;
    if (pk->dtype != DF_DT_U8 || pk->ndim != 2)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 weight_packed must be a 2-D U8 tensor, got %s "
                            "with %d dims", store_tensor_path(st, p[KIND_PACKED]), pk->name, pk->dtype_name, pk->ndim),
               DF_EFORMAT;
    if (sc->dtype != DF_DT_U8 || sc->ndim != 2)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 weight_scale must be a 2-D U8 tensor, got %s "
                            "with %d dims", store_tensor_path(st, p[KIND_SCALE]), sc->name, sc->dtype_name, sc->ndim),
               DF_EFORMAT;
    if (pk->shape[0] != sc->shape[0] || pk->shape[1] * 2 != sc->shape[1] * 32 || pk->shape[1] == 0)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': MXFP4 scale shape [%lld, %lld] does not match "
                            "weight_packed [%lld, %lld] (need the same rows and packed cols x 2 == scale cols x 32)",
                            store_tensor_path(st, p[KIND_SCALE]), sc->name, (long long)sc->shape[0],
                            (long long)sc->shape[1], (long long)pk->shape[0], (long long)pk->shape[1]), DF_EFORMAT;
    *out = (df_tensor){.name = pk->name, .dtype = DF_DT_MXFP4, .ndim = 2, .shape = {pk->shape[0], pk->shape[1] * 2},
                       .data = pk->data, .scale = sc->data};
    const st_tensor *sh = p[KIND_SHAPE].t;
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
                                "logical shape [%lld, %lld]", store_tensor_path(st, p[KIND_SHAPE]), sh->name,
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
        for (int k = 0; k < KIND_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (!r.t) continue;
            loc->parts[loc->n_parts++] = (store_expert_part){r.t->name, r.shard,
                                                             st_tensor_offset(&st->shards[r.shard], r.t),
                                                             r.t->end - r.t->begin};
        }
    qsort(loc->parts, (size_t)loc->n_parts, sizeof loc->parts[0], store_cmp_part);
    loc->shard = loc->parts[0].shard;
    loc->path = st->shards[loc->shard].path;
    loc->offset = loc->parts[0].offset;
    loc->contiguous = 1;
    uint64_t end = loc->offset;
    for (int i = 0; i < loc->n_parts; i++) {
        if (loc->parts[i].shard != loc->shard || loc->parts[i].offset != end) loc->contiguous = 0;
        end = loc->parts[i].offset + loc->parts[i].length;
    }
    loc->length = loc->contiguous ? end - loc->offset : 0;
}

static int store_build_experts(df_store *st, df_error *err) {
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
            if (!ok)
                return df_error_set(err, DF_EFORMAT, "%s: tensors '%s', '%s', '%s': expert shapes/dtypes inconsistent "
                                    "(w1 %s [%lld, %lld], w2 %s [%lld, %lld], w3 %s [%lld, %lld]; expected w1 = w3 = "
                                    "[I, D], w2 = [D, I], the same for every expert of the layer)",
                                    store_tensor_path(st, x->part[0][x->part[0][KIND_WEIGHT].t ? KIND_WEIGHT : KIND_PACKED]),
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

/* ---------------------------------------------------------------------------------------------------- */
/* Reading experts into cache slots. */

static uint64_t store_ref_offset(const df_store *st, store_ref r) { return st_tensor_offset(&st->shards[r.shard], r.t); }

static void store_expert_plan_read(df_store *st, store_expert *x) {
    x->one_read = x->loc.contiguous;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < KIND_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (r.t && r.t->elem_size > 1 && store_ref_offset(st, r) % (uint64_t)r.t->elem_size) x->one_read = 0;
        }
}

/* Slot bytes expert x needs under the placement rule of io.h. */
static uint64_t store_expert_slot_need(const df_store *st, const store_expert *x) {
    if (x->one_read) return io_span_bytes(x->loc.offset, x->loc.length);
    uint64_t n = 0;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < KIND_COUNT; k++) {
            store_ref r = x->part[m][k];
            if (r.t) n += io_span_bytes(store_ref_offset(st, r), r.t->end - r.t->begin) + IO_ALIGN;
        }
    return n;
}

/* E8M0 0xFF is NaN in the OCP MX spec: a checkpoint containing it is corrupt, not a weight to multiply. */
static int store_expert_check_scales(const df_store *st, int layer, int e, const store_expert *x,
                                     const uint8_t *const scale[3], df_error *err) {
    for (int m = 0; m < 3; m++) {
        store_ref r = x->part[m][KIND_SCALE];
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

static int store_expert_load(void *ctx, int layer, int e, uint8_t *slot, df_expert *view, df_error *err) {
    df_store *st = ctx;
    const store_expert *x = &st->experts[layer][e];
    const uint8_t *ptr[3][KIND_COUNT] = {{0}};
    char what[96];
    snprintf(what, sizeof what, "expert %d of layer %d", e, layer);
    io_source *src = st->src_expert;
    if (st->opts.test_before_read) st->opts.test_before_read(st->opts.test_ctx, layer, e);
    if (x->one_read) {
        int file = x->loc.shard, f = -1;   /* placed in another folder: the same bytes at another offset */
        uint64_t at = x->loc.offset, placed_at = 0, placed_len = 0;
        if (st->place.n_folders) placement_where(&st->place, layer, e, &f, &placed_at, &placed_len);
        if (f >= 0) file = st->n_shards + f, at = placed_at;
        int rc = src->read(src, file, at, x->loc.length, slot, what, err);
        if (rc) return rc;
        const uint8_t *base = slot + x->loc.offset % IO_ALIGN;
        for (int m = 0; m < 3; m++)
            for (int k = 0; k < KIND_COUNT; k++)
                if (x->part[m][k].t) ptr[m][k] = base + (store_ref_offset(st, x->part[m][k]) - x->loc.offset);
    } else {
        uint64_t at = 0;
        for (int m = 0; m < 3; m++)
            for (int k = 0; k < KIND_COUNT; k++) {
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
        if (ptr[m][KIND_WEIGHT]) {
            w[m]->data = ptr[m][KIND_WEIGHT];
            continue;
        }
        w[m]->data = ptr[m][KIND_PACKED];
        w[m]->scale = scale[m] = ptr[m][KIND_SCALE];
    }
    return store_expert_check_scales(st, layer, e, x, scale, err);
}

/* ---------------------------------------------------------------------------------------------------- */
/* The memory plan: working reserve, then the spine (mapped if it all fits, else top-level tensors and the
 * biggest layers resident and the rest streamed through two buffers), then expert slots. */

static int store_item_region(const store_item *items, const int *region, int i) {
    for (int j = 0; j < i; j++)
        if (items[j].ref.t == items[i].ref.t) return region[j];
    return -1;
}

/* Builds the spine unit of a layer (or, with layer == n_layers, of the globals but the embedding). */
static void store_unit_init(df_store *st, int layer, spine_unit *u) {
    int n = layer < st->n_layers ? st->layers[layer].n : st->n_globals;
    store_item *items = layer < st->n_layers ? st->layers[layer].items : st->globals;
    int *region = xmalloc(sizeof *region * (size_t)(n + 1));
    u->r = xcalloc((size_t)n + 1, sizeof *u->r);
    for (int i = 0; i < n; i++) {
        region[i] = -1;
        if (layer == st->n_layers && !strcmp(items[i].key, "model.embed_tokens.weight")) continue;
        if (layer == st->n_layers && st->head_tiled && !strcmp(items[i].key, "lm_head.weight")) continue;
        region[i] = store_item_region(items, region, i);
        if (region[i] >= 0) continue;
        store_ref r = items[i].ref;
        region[i] = u->n;
        u->r[u->n++] = (spine_region){r.shard, store_ref_offset(st, r), r.t->end - r.t->begin, r.t->elem_size, 0};
    }
    if (layer < st->n_layers) {
        snprintf(u->name, sizeof u->name, "layer %d", layer);
        free(st->layers[layer].region);
        st->layers[layer].region = region;
    } else {
        snprintf(u->name, sizeof u->name, "the top-level tensors");
        free(st->global_region);
        st->global_region = region;
    }
}

static int store_cmp_size_desc(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;   /* pairs (bytes, layer) */
    return x[0] < y[0] ? 1 : x[0] > y[0] ? -1 : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Chooses resident layers (largest first) so that resident + two stream buffers (of at least buf_floor bytes)
 * fit avail. */
static void store_choose_resident(df_store *st, spine_unit *u, uint64_t avail, uint64_t buf_floor) {
    int n = st->n_layers;
    uint64_t (*by)[2] = xmalloc(sizeof *by * (size_t)(n + 1));
    for (int l = 0; l < n; l++) by[l][0] = spine_unit_bytes(&u[l]), by[l][1] = (uint64_t)l;
    qsort(by, (size_t)n, sizeof *by, store_cmp_size_desc);
    uint64_t used = 0, skipped_max = 0;
    for (int j = 0; j < n && !st->opts.spine_stream; j++) {
        uint64_t rest = DF_MAX(DF_MAX(skipped_max, j + 1 < n ? by[j + 1][0] : 0), buf_floor);
        if (used + by[j][0] + 2 * rest <= avail) {
            used += by[j][0];
            u[by[j][1]].resident = 1;
        } else {
            skipped_max = DF_MAX(skipped_max, by[j][0]);
        }
    }
    free(by);
}

static void store_print_gib(char *buf, size_t cap, uint64_t n) {
    if (n >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", (double)n / (1ull << 30));
    else snprintf(buf, cap, "%.1f MiB", (double)n / (1ull << 20));
}

/* The replacement policy and the routing trace the options ask for. */
static int store_policy_open(df_store *st, df_error *err) {
    int kind = st->opts.cache_policy;
    if (kind < 0 || kind > POLICY_COUNT)
        return df_error_set(err, DF_EINVAL, "unknown expert cache policy %d", kind), DF_EINVAL;
    ecache_set_policy(st->cache, kind ? kind - 1 : POLICY_DEFAULT);
    if (st->opts.heat) st->heat = heat_load(st->dir, st->n_layers, st->n_experts, st->heat_note, sizeof st->heat_note);
    if (st->opts.heat == DF_HEAT_ON) {   /* warm with the hottest, as many as there are slots */
        ecache_stats cs;
        ecache_get_stats(st->cache, &cs);
        int *layers = xmalloc(sizeof *layers * (size_t)cs.slots), *ids = xmalloc(sizeof *ids * (size_t)cs.slots);
        float *w = xmalloc(sizeof *w * (size_t)cs.slots);
        int n = heat_top(st->heat, cs.slots, layers, ids, w);
        if (n) ecache_warm(st->cache, n, layers, ids, w);
        free(layers);
        free(ids);
        free(w);
    }
    if (!st->opts.trace_path) return DF_OK;
    return rtrace_writer_open(&st->trace, st->opts.trace_path, st->n_layers, st->n_experts, err);
}

/* lm_head can be tiled when it is a plain matrix (the int8 copy keeps its row scales apart). */
static int store_head_tileable(const df_store *st) {
    const store_item *h = store_find_item(st->globals, st->n_globals, "lm_head.weight");
    return h && h->usable && !h->int8 && h->view.ndim == 2 && h->view.shape[0] >= 2;
}

/* Spine units for streaming: one per layer, the top-level tensors (resident, without the embedding, which
 * stays mapped), and with tiled lm_head its tiles; chooses resident layers. Returns the bytes this plan needs
 * (reserve, resident spine, two stream buffers, the minimum cache). */
static uint64_t store_stream_plan(df_store *st, uint64_t budget, uint64_t min_cache, int tiled, spine_unit **out,
                                  int *n_units) {
    const store_item *h =
        tiled && store_head_tileable(st) ? store_find_item(st->globals, st->n_globals, "lm_head.weight") : NULL;
    st->head_tiled = h != NULL;
    uint64_t row = h ? tensor_row_bytes(&h->view) : 0, floor = 0;
    if (h) {   /* tiles of the requested rows, else of the largest layer (at least 64 MiB, to keep reads big) */
        floor = st->opts.head_tile_rows > 0 ? (uint64_t)st->opts.head_tile_rows * row : 64ull << 20;
        tiles_init(&st->head, &h->view, row, floor, st->n_layers + 1);
    }
    int n = st->n_layers + 1 + (h ? st->head.n : 0);
    spine_unit *u = xcalloc((size_t)n, sizeof *u);
    for (int l = 0; l <= st->n_layers; l++) store_unit_init(st, l, &u[l]);
    u[st->n_layers].resident = 1;
    uint64_t fixed = st->reserve_bytes + min_cache + spine_unit_bytes(&u[st->n_layers]), need = fixed;
    if (fixed < budget) store_choose_resident(st, u, budget - fixed, floor);
    uint64_t big = 0;
    for (int l = 0; l < st->n_layers; l++)
        if (u[l].resident) need += spine_unit_bytes(&u[l]);
        else big = DF_MAX(big, spine_unit_bytes(&u[l]));
    if (h) {
        if (st->opts.head_tile_rows <= 0 && big > floor) tiles_init(&st->head, &h->view, row, big, st->n_layers + 1);
        tiles_units(&st->head, h->ref.shard, store_ref_offset(st, h->ref), h->ref.t->elem_size, u + st->n_layers + 1);
        for (int j = 0; j < st->head.n; j++) big = DF_MAX(big, spine_unit_bytes(&u[st->n_layers + 1 + j]));
    }
    *out = u;
    *n_units = n;
    return need + 2 * big;
}

/* The smallest budget the planner accepts: every layer streamed, lm_head tiled when it can be, the minimum
 * cache, and the working reserve, which is a 16th of the budget within [64 MiB, 1 GiB]. Run before the real
 * plan, which rebuilds the units. */
static uint64_t store_min_budget(df_store *st, uint64_t min_cache) {
    spine_unit *u = NULL;
    int n = 0;
    uint64_t need = store_stream_plan(st, 0, min_cache, 1, &u, &n) - st->reserve_bytes;
    for (int i = 0; i < n; i++) free(u[i].r);
    free(u);
    st->head_tiled = 0;
    if (need + (64ull << 20) <= (1ull << 30)) return need + (64ull << 20);
    if (need / 15 * 16 <= (16ull << 30)) return (need + 14) / 15 * 16;
    return need + (1ull << 30);
}

static int store_plan(df_store *st, df_error *err) {
    uint64_t budget = st->opts.mem_budget ? st->opts.mem_budget : budget_default_bytes();
    st->opts.mem_budget = budget;
    st->reserve_bytes = DF_MIN(DF_MAX(budget / 16, 64ull << 20), 1ull << 30);
    for (int l = 0; l < st->n_layers; l++)
        for (int e = 0; e < st->n_experts[l]; e++) {
            store_expert *x = &st->experts[l][e];
            store_expert_plan_read(st, x);
            st->slot_bytes = DF_MAX(st->slot_bytes, io_round_up(store_expert_slot_need(st, x), IO_ALIGN));
            st->n_experts_total++;
        }
    uint64_t min_slots = (uint64_t)DF_MIN(st->n_experts_total, STORE_MIN_SLOTS);
    if (st->opts.cache_slots > 0) min_slots = (uint64_t)st->opts.cache_slots;
    uint64_t min_cache = min_slots * st->slot_bytes, spine_used = st->spine_bytes;
    st->min_slots = min_slots;
    st->min_budget = store_min_budget(st, min_cache);
    char b1[32], b2[32];
    if (st->opts.spine_stream || st->opts.head_tile_rows > 0 || st->reserve_bytes + st->spine_bytes + min_cache > budget) {
        int n_units = 0;
        spine_unit *u = NULL;
        uint64_t need = store_stream_plan(st, budget, min_cache, st->opts.head_tile_rows > 0, &u, &n_units);
        if (need > budget && !st->head_tiled && store_head_tileable(st)) {   /* lm_head resident does not fit */
            for (int l = 0; l < n_units; l++) free(u[l].r);
            free(u);
            need = store_stream_plan(st, budget, min_cache, 1, &u, &n_units);
        }
        if (need > budget) {
            store_print_gib(b1, sizeof b1, budget);
            store_print_gib(b2, sizeof b2, need);
            for (int l = 0; l < n_units; l++) free(u[l].r);
            free(u);
            return df_error_set(err, DF_ENOMEM, "%s: memory budget %s is too small for this model: streaming its "
                                "spine needs at least %s (working reserve, top-level tensors, two buffers of the "
                                "largest streamed layer or lm_head tile and %llu expert slots); the smallest budget "
                                "it runs in is %.2f GiB", st->dir, b1, b2, (unsigned long long)min_slots,
                                (double)st->min_budget / (1ull << 30)), DF_ENOMEM;
        }
        int rc = spine_new(&st->spine, st->src_spine, st->pool, n_units, u, err);
        if (rc) return rc;
        spine_used = spine_resident_bytes(st->spine) + spine_stream_bytes(st->spine);
        uint8_t *gbase = NULL;
        spine_acquire(st->spine, st->n_layers, &gbase, err);
        for (int i = 0; i < st->n_globals; i++)
            if (st->global_region[i] >= 0)
                store_item_place(&st->globals[i],
                                 spine_region_data(gbase, spine_unit_region(st->spine, st->n_layers, st->global_region[i])));
    }
    if (!st->n_experts_total) return DF_OK;
    int64_t slots = st->opts.cache_slots;
    if (slots <= 0) {
        uint64_t left = budget > st->reserve_bytes + spine_used ? budget - st->reserve_bytes - spine_used : 0;
        slots = (int64_t)(left / st->slot_bytes);
    }
    slots = DF_MIN(slots, st->n_experts_total);
    if (slots < 1) {
        store_print_gib(b1, sizeof b1, budget);
        return df_error_set(err, DF_ENOMEM, "%s: memory budget %s leaves no room for an expert slot (%llu bytes)",
                            st->dir, b1, (unsigned long long)st->slot_bytes), DF_ENOMEM;
    }
    st->cache = ecache_new(st->n_layers, st->n_experts, (int)slots, st->slot_bytes, st->pool, store_expert_load, st);
    return store_policy_open(st, err);
}

/* Experts placed in other folders: checked against the checkpoint's spans, read from file n_shards + folder. */
static int store_open_place(df_store *st, df_error *err) {
    int found = 0;
    int rc = placement_load(&st->place, st->dir, st->n_layers, st->n_experts, st->opts.expert_dirs, &found, err);
    if (rc || !found) return rc;
    if (st->opts.remote_url)
        return df_error_set(err, DF_EINVAL, "%s: experts placed in other folders cannot also stream from --remote",
                            st->dir), DF_EINVAL;
    for (int l = 0; l < st->n_layers; l++)
        for (int e = 0; e < st->n_experts[l]; e++) {
            int f;
            uint64_t off, len;
            placement_where(&st->place, l, e, &f, &off, &len);
            const store_expert *x = &st->experts[l][e];
            if (f >= 0 && (!x->loc.contiguous || off % IO_ALIGN != x->loc.offset % IO_ALIGN || len != x->loc.length))
                return df_error_set(err, DF_EFORMAT, "%s: the placement of expert %d of layer %d does not match the "
                                    "checkpoint (place it again)", st->place.files[f], e, l), DF_EFORMAT;
        }
    return DF_OK;
}

static int store_open_io(df_store *st, df_error *err) {
    int rc = store_open_place(st, err);
    if (rc) return rc;
    const char **paths = xmalloc(sizeof *paths * (size_t)(st->n_shards + st->place.n_folders + 1));
    for (int i = 0; i < st->n_shards; i++) paths[i] = st->shards[i].path;
    for (int f = 0; f < st->place.n_folders; f++) paths[st->n_shards + f] = st->place.files[f];
    io_local_opts lo = {!st->opts.buffered_io, st->opts.io_kind};
    rc = io_local_open_ex(&st->src_expert, st->n_shards + st->place.n_folders, paths, &lo, err);
    if (!rc) rc = io_install_wrap(&st->src_expert, st->dir, st->n_shards, st->opts.remote_url, err);
    if (!rc) rc = io_local_open_ex(&st->src_spine, st->n_shards, paths, &lo, err);
    free(paths);
    st->pool = io_pool_new(st->opts.io_threads > 0 ? st->opts.io_threads : STORE_IO_THREADS);
    return rc;
}

int store_open(df_store **out, const char *dir, df_error *err) { return store_open_ex(out, dir, NULL, err); }

int store_open_ex(df_store **out, const char *dir, const store_opts *opts, df_error *err) {
    *out = NULL;
    df_store *st = xcalloc(1, sizeof *st);
    st->dir = xstrdup(dir);
    if (opts) st->opts = *opts;
    store_refs refs = {0};
    int cfg_layers = 0;
    int rc = store_load_config(st, &cfg_layers, err);
    if (!rc) rc = store_collect(st, &refs, err);
    if (!rc) rc = store_build_tables(st, &refs, cfg_layers, err);
    if (!rc) rc = store_use_int8_spine(st, err);
    if (!rc) rc = store_build_experts(st, err);
    if (!rc) rc = store_open_io(st, err);
    if (!rc) rc = store_plan(st, err);
    if (!rc) st->ra = readahead_new(st->n_layers, st->opts.lookahead, st->cache, st->pool);
    free(refs.v);
    if (rc) {
        store_free(st);
        return rc;
    }
    *out = st;
    return DF_OK;
}

void store_free(df_store *st) {
    if (!st) return;
    readahead_free(st->ra);
    ecache_free(st->cache);
    rtrace_writer_close(st->trace, &(df_error){0});
    if (st->heat && st->opts.heat == DF_HEAT_ON) heat_save(st->heat, st->dir, &(df_error){0});   /* best effort */
    heat_free(st->heat);
    placement_free(&st->place);
    spine_free(st->spine);
    io_pool_free(st->pool);
    io_source_free(st->src_expert);
    io_source_free(st->src_spine);
    free(st->global_region);
    free(st->int8_spans);
    free(st->int8_shard);
    for (int i = 0; i < st->n_shards; i++) st_file_close(&st->shards[i]);
    free(st->shards);
    for (int l = 0; l < st->n_layers; l++) {
        free(st->layers[l].items);
        free(st->layers[l].region);
        free(st->experts[l]);
    }
    free(st->layers);
    free(st->experts);
    free(st->n_experts);
    free(st->expert_shard);
    free(st->globals);
    for (int i = 0; i < st->n_copies; i++) free(st->copies[i]);
    free(st->copies);
    free(st->problems);
    free(st->model_type);
    free(st->config_text);
    free(st->dir);
    free(st);
}

const char *store_dir(const df_store *st) { return st->dir; }
const char *store_config_text(const df_store *st) { return st->config_text; }
const char *store_family(const df_store *st) { return st->model_type; }
int store_layer_count(const df_store *st) { return st->n_layers; }
int store_shard_count(const df_store *st) { return st->n_shards; }

const char *store_shard_path(const df_store *st, int shard) {
    return shard >= 0 && shard < st->n_shards ? st->shards[shard].path : NULL;
}

char *store_read_aux(const df_store *st, const char *name, size_t *len, df_error *err) {
    if (!store_shard_name_ok(name)) {
        df_error_set(err, DF_EINVAL, "%s: not a file name inside the model folder %s", name, st->dir);
        return NULL;
    }
    char *path = df_path_join(st->dir, name);
    char *text = NULL;
    if (access(path, F_OK) != 0)
        df_error_set(err, DF_OK, "%s: no such file in the model folder", path);
    else
        text = df_read_file_max(path, DF_READ_FILE_MAX, len, err);
    free(path);
    return text;
}

const df_tensor *store_global(df_store *st, const char *name) {
    const store_item *it = store_find_item(st->globals, st->n_globals, name);
    return it && it->usable ? &it->view : NULL;
}

int store_global_get(df_store *st, const char *name, const df_tensor **out, df_error *err) {
    *out = NULL;
    const store_item *it = store_find_item(st->globals, st->n_globals, name);
    if (!it) return DF_OK;
    int rc = st_tensor_view(&st->shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    if (!rc) *out = &it->view;
    return rc;
}

int store_layer_acquire(df_store *st, int layer, const df_store_layer **out, df_error *err) {
    *out = NULL;
    if (layer < 0 || layer >= st->n_layers)
        return df_error_set(err, DF_EINVAL, "%s: layer %d out of range (checkpoint has %d layers)", st->dir, layer,
                            st->n_layers), DF_EINVAL;
    df_store_layer *l = &st->layers[layer];
    if (l->bad >= 0) {
        const store_item *it = &l->items[l->bad];
        return st_tensor_view(&st->shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    }
    if (st->spine) {
        uint8_t *base;
        int rc = spine_acquire(st->spine, layer, &base, err);
        if (rc) return rc;
        for (int i = 0; i < l->n; i++)
            store_item_place(&l->items[i], spine_region_data(base, spine_unit_region(st->spine, layer, l->region[i])));
    }
    *out = l;
    return DF_OK;
}

const df_tensor *store_layer_tensor(const df_store_layer *l, const char *suffix) {
    const store_item *it = store_find_item(l->items, l->n, suffix);
    return it && it->usable ? &it->view : NULL;
}

void store_layer_peek(df_store *st, int layer, const df_store_layer **out) {
    *out = NULL;
    if (layer < 0 || layer >= st->n_layers || st->layers[layer].bad >= 0) return;
    df_store_layer *l = &st->layers[layer];
    uint8_t *base = NULL;
    if (st->spine && !spine_peek(st->spine, layer, &base)) return;
    for (int i = 0; st->spine && i < l->n; i++)
        store_item_place(&l->items[i], spine_region_data(base, spine_unit_region(st->spine, layer, l->region[i])));
    *out = l;
}

int store_layer_table(df_store *st, int layer, const df_store_layer **out, df_error *err) {
    *out = NULL;
    if (layer < 0 || layer >= st->n_layers)
        return df_error_set(err, DF_EINVAL, "%s: layer %d out of range (checkpoint has %d layers)", st->dir, layer,
                            st->n_layers), DF_EINVAL;
    const df_store_layer *l = &st->layers[layer];
    if (l->bad >= 0) {
        const store_item *it = &l->items[l->bad];
        return st_tensor_view(&st->shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    }
    *out = l;
    return DF_OK;
}

int store_layer_tensor_file(const df_store *st, const df_store_layer *l, const char *suffix, df_tensor *out) {
    const store_item *it = store_find_item(l->items, l->n, suffix);
    df_error e;
    if (!it || !it->usable || it->int8 || st_tensor_view(&st->shards[it->ref.shard], it->ref.t, out, &e) ||
        !out->data)
        return -1;
    return 0;
}

void store_layer_release(df_store *st, const df_store_layer *l) {
    if (st->spine && l) spine_release(st->spine, l->index);
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

int store_experts_prefetch(df_store *st, int layer, const int *ids, int n, df_error *err) {
    for (int i = 0; i < n; i++) {
        int rc = store_expert_check_range(st, layer, ids[i], err);
        if (rc) return rc;
    }
    atomic_fetch_add(&st->expert_requests, (uint64_t)n);
    if (st->trace && n) {
        int rc = rtrace_writer_record(st->trace, layer, ids, n, err);
        if (rc) return rc;
    }
    if (st->heat && n) heat_add(st->heat, layer, ids, n);
    if (n) ecache_prefetch(st->cache, layer, ids, n);
    return DF_OK;
}

int store_lookahead_plan(df_store *st, int layer) {
    return store_expert_count(st, layer) ? readahead_plan(st->ra, layer) : STORE_LOOKAHEAD_SKIP;
}

void store_experts_hint(df_store *st, int layer, const int *ids, int n, int read) {
    int *ok = xmalloc(sizeof *ok * ((size_t)n + 1)), m = 0;
    for (int i = 0; i < n; i++)
        if (store_expert_locate(st, layer, ids[i])) ok[m++] = ids[i];
    if (m) ecache_hint(st->cache, layer, ok, m, read);
    free(ok);
}

void store_lookahead_layer(df_store *st, int layer, uint64_t *requests, uint64_t *recalled, uint64_t *loads,
                           int *reading) {
    ecache_hint_stats h = {0};
    if (st->cache && store_expert_count(st, layer)) ecache_hint_layer(st->cache, layer, &h);
    *requests = h.requests, *recalled = h.recalled, *loads = h.loads;
    *reading = store_expert_count(st, layer) && readahead_reading(st->ra, layer);
}

int store_expert_acquire(df_store *st, int layer, int e, df_expert *out, df_error *err) {
    int rc = store_expert_check_range(st, layer, e, err);
    if (rc) return rc;
    return ecache_acquire(st->cache, layer, e, out, err);
}

int store_expert_acquire_next(df_store *st, int layer, const int *ids, int n, uint8_t *done, int *which,
                              df_expert *out, df_error *err) {
    for (int i = 0; i < n; i++) {
        int rc = done[i] ? DF_OK : store_expert_check_range(st, layer, ids[i], err);
        if (rc) return *which = i, rc;
    }
    return ecache_acquire_next(st->cache, layer, ids, n, done, which, out, err);
}

int store_head_tiles(const df_store *st, int64_t *rows_per_tile) {
    if (!st->head_tiled) {
        const store_item *h = store_find_item(st->globals, st->n_globals, "lm_head.weight");
        *rows_per_tile = h && h->view.ndim == 2 ? h->view.shape[0] : 0;
        return 1;
    }
    *rows_per_tile = st->head.per;
    return st->head.n;
}

int store_head_tile_acquire(df_store *st, int j, df_tensor *out, df_error *err) {
    if (!st->head_tiled || j < 0 || j >= st->head.n)
        return df_error_set(err, DF_EINVAL, "%s: lm_head tile %d does not exist", st->dir, j), DF_EINVAL;
    return tiles_acquire(st->spine, &st->head, j, out, err);
}

void store_head_tile_release(df_store *st, int j) {
    if (st->head_tiled && j >= 0 && j < st->head.n) tiles_release(st->spine, &st->head, j);
}

void store_warm_wait(df_store *st) {
    if (st->cache) ecache_warm_wait(st->cache);
}

const char *store_heat_note(const df_store *st) { return st->heat_note; }

void store_expert_release(df_store *st, int layer, int e) {
    if (store_expert_locate(st, layer, e)) ecache_release(st->cache, layer, e);
}

void store_get_stats(df_store *st, store_stats *o) {
    memset(o, 0, sizeof *o);
    if (st->cache) {
        ecache_stats c;
        ecache_get_stats(st->cache, &c);
        o->expert_hits = c.hits;
        o->expert_misses = c.misses;
        o->expert_loads = c.loads;
        o->expert_waits = c.waits;
        o->cache_slots = c.slots;
        o->cache_bytes = (uint64_t)c.slots * c.slot_bytes;
        o->hint_loads = c.hint_loads;
        o->hint_requests = c.hint_requests;
        o->hint_recalled = c.hint_recalled;
        o->warm_loads = c.warm_loads;
    }
    o->io_uring = io_source_kind(st->src_expert) == IO_KIND_URING;
    o->expert_requests = atomic_load(&st->expert_requests);
    o->expert_disk_bytes = atomic_load(&st->src_expert->bytes);
    o->spine_disk_bytes = atomic_load(&st->src_spine->bytes);
    o->net_bytes = atomic_load(&st->src_expert->net_bytes);   /* the spine is always local */
    o->direct_fallbacks = atomic_load(&st->src_expert->direct_fallbacks);
    o->mem_budget = st->opts.mem_budget;
    o->reserve_bytes = st->reserve_bytes;
    o->expert_slot_bytes = st->slot_bytes;
    o->spine_mapped = !st->spine;
    o->head_tiles = st->head_tiled ? st->head.n : 0;
    if (st->spine) {
        o->resident_spine_bytes = spine_resident_bytes(st->spine);
        o->stream_buffer_bytes = spine_stream_bytes(st->spine);
        o->streamed_layers = spine_streamed_units(st->spine);
    } else {
        o->resident_spine_bytes = st->spine_bytes;
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* store_describe */

typedef struct store_buf {
    char *p;
    size_t cap, len;
} store_buf;

static void store_printf(store_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void store_printf(store_buf *b, const char *fmt, ...) {
    if (b->len + 1 >= b->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n > 0) b->len = DF_MIN(b->len + (size_t)n, b->cap - 1);
}

static void store_print_bytes(store_buf *b, uint64_t n) {
    if (n >= (1ull << 30)) store_printf(b, "%.2f GiB", (double)n / (1ull << 30));
    else if (n >= (1ull << 20)) store_printf(b, "%.2f MiB", (double)n / (1ull << 20));
    else if (n >= 1024) store_printf(b, "%.2f KiB", (double)n / 1024);
    store_printf(b, n >= 1024 ? " (%llu bytes)" : "%llu bytes", (unsigned long long)n);
}

static void store_describe_experts(const df_store *st, store_buf *b) {
    int64_t n = 0, noncontig = 0, unaligned = 0;
    int moe_layers = 0, emin = 0, emax = 0;
    uint64_t bmin = UINT64_MAX, bmax = 0;
    const store_expert *first = NULL;
    for (int l = 0; l < st->n_layers; l++) {
        int ne = st->n_experts[l];
        if (!ne) continue;
        emin = moe_layers ? DF_MIN(emin, ne) : ne;
        emax = DF_MAX(emax, ne);
        moe_layers++;
        for (int e = 0; e < ne; e++) {
            const store_expert_loc *loc = &st->experts[l][e].loc;
            uint64_t bytes = 0;
            for (int p = 0; p < loc->n_parts; p++) bytes += loc->parts[p].length;
            bmin = DF_MIN(bmin, bytes);
            bmax = DF_MAX(bmax, bytes);
            noncontig += !loc->contiguous;
            unaligned += loc->contiguous && (loc->offset % 4096 || loc->length % 4096);
            if (!first) first = &st->experts[l][e];
            n++;
        }
    }
    if (!n) {
        store_printf(b, "routed experts: none\n");
        return;
    }
    store_printf(b, "routed experts: %lld in %d MoE layers (", (long long)n, moe_layers);
    if (emin == emax) store_printf(b, "%d per layer)\n", emin);
    else store_printf(b, "%d..%d per layer)\n", emin, emax);
    const df_tensor *w[3] = {&first->ex.w1, &first->ex.w2, &first->ex.w3};
    store_printf(b, "  matrices:");
    for (int m = 0; m < 3; m++)
        store_printf(b, " %s %s [%lld, %lld]%s", store_mat_name(m), tensor_dtype_name(w[m]->dtype),
                     (long long)w[m]->shape[0], (long long)w[m]->shape[1], m < 2 ? "," : "\n");
    store_printf(b, "  bytes per expert: ");
    store_print_bytes(b, bmin);
    if (bmax != bmin) {
        store_printf(b, " .. ");
        store_print_bytes(b, bmax);
    }
    store_printf(b, "\n");
    if (!noncontig)
        store_printf(b, "  spans: every expert is one contiguous span (one read each); %s\n",
                     unaligned ? "some spans are not 4 KiB aligned" : "all spans 4 KiB aligned");
    else
        store_printf(b, "  spans: %lld of %lld experts are not one contiguous span; per-tensor reads will be used for "
                     "them\n", (long long)noncontig, (long long)n);
}

static void store_describe_plan(const df_store *st, store_buf *b) {
    store_printf(b, "memory plan for a budget of ");
    store_print_bytes(b, st->opts.mem_budget);
    store_printf(b, ":\n  working reserve ");
    store_print_bytes(b, st->reserve_bytes);
    if (!st->spine) {
        store_printf(b, "\n  spine: served from the file mapping (it fits): ");
        store_print_bytes(b, st->spine_bytes);
    } else {
        store_printf(b, "\n  spine resident: ");
        store_print_bytes(b, spine_resident_bytes(st->spine));
        store_printf(b, "\n  spine streamed: %d layers through two buffers of ", spine_streamed_units(st->spine) -
                     (st->head_tiled ? st->head.n : 0));
        store_print_bytes(b, spine_stream_bytes(st->spine) / 2);
        store_printf(b, "\n  embedding: rows read on demand from the file mapping (not resident)");
        if (st->head_tiled)
            store_printf(b, "\n  lm_head: streamed in %d tiles of %lld rows through the same buffers", st->head.n,
                         (long long)st->head.per);
        else store_printf(b, "\n  lm_head: resident");
    }
    if (st->cache) {
        ecache_stats c;
        ecache_get_stats(st->cache, &c);
        store_printf(b, "\n  expert cache: %d slots of ", c.slots);
        store_print_bytes(b, c.slot_bytes);
        store_printf(b, " (%.1f%% of the %lld routed experts)",
                     100.0 * c.slots / (double)DF_MAX(st->n_experts_total, 1), (long long)st->n_experts_total);
    }
    store_printf(b, "\n  smallest budget this model runs in: ");
    store_print_bytes(b, st->min_budget);
    store_printf(b, " (every layer streamed, lm_head tiled, %llu expert slots)\n", (unsigned long long)st->min_slots);
}

void store_describe(const df_store *st, char *buf, size_t cap) {
    if (!cap) return;
    size_t len = strnlen(buf, cap);
    if (len >= cap) len = cap - 1, buf[len] = 0;
    store_buf b = {buf, cap, len};
    store_printf(&b, "checkpoint: %s (model_type %s%s)\n", st->dir, st->model_type,
                 st->prefixed ? ", text tensors under " STORE_PREFIX : "");
    store_printf(&b, "shards: %d (%s)\n", st->n_shards,
                 st->indexed ? "model.safetensors.index.json" : "model.safetensors");
    store_printf(&b, "tensors: %lld\n", (long long)st->n_tensors);
    if (st->n_ignored) {
        store_printf(&b, "ignored: %lld non-text tensors, ", (long long)st->n_ignored);
        store_print_bytes(&b, st->ignored_bytes);
        store_printf(&b, "\n");
    }
    store_printf(&b, "total bytes: ");
    store_print_bytes(&b, st->total_bytes);
    store_printf(&b, "\nspine bytes: ");
    store_print_bytes(&b, st->spine_bytes);
    store_printf(&b, "\nrouted-expert bytes: ");
    store_print_bytes(&b, st->expert_bytes);
    store_printf(&b, "\nlayers: %d\n", st->n_layers);
    if (st->n_copies)
        store_printf(&b, "misaligned tensors copied to aligned memory: %d\n", st->n_copies);
    if (st->n_int8) {
        store_printf(&b, "int8 spine: %d matrices from %d file%s (%s), ", st->n_int8, st->n_int8_files,
                     st->n_int8_files > 1 ? "s" : "", st->n_int8_files > 1 ? INT8_SPINE_INDEX : INT8_SPINE_FILE);
        store_print_bytes(&b, st->int8_bytes);
        store_printf(&b, " in place of ");
        store_print_bytes(&b, st->int8_replaced_bytes);
        store_printf(&b, "\n");
    }
    store_describe_experts(st, &b);
    store_describe_plan(st, &b);
    if (st->heat) {
        char line[256];
        heat_summary(st->heat, line, sizeof line);
        store_printf(&b, "%s\n", line);
        if (st->heat_note[0]) store_printf(&b, "warning: %s\n", st->heat_note);
    }
    store_printf(&b, "dtypes (text tensors):");
    for (int i = 0; i < st->n_dtypes; i++)
        store_printf(&b, " %s %lld%s", st->dtypes[i].name, (long long)st->dtypes[i].count,
                     i + 1 < st->n_dtypes ? "," : "");
    store_printf(&b, "\n");
    for (int i = 0; i < st->n_shards; i++) {
        const st_file *f = &st->shards[i];
        uint64_t region = f->size - f->data_start;
        if (f->covered != region)
            store_printf(&b, "problem: %s: %llu of %llu data bytes belong to no tensor\n", f->path,
                         (unsigned long long)(region - f->covered), (unsigned long long)region);
    }
    if (st->problems) {
        const char *p = st->problems;
        while (*p) {
            const char *nl = strchr(p, '\n');
            store_printf(&b, "problem: %.*s\n", (int)(nl - p), p);
            p = nl + 1;
        }
    }
    if (st->n_problems > STORE_MAX_PROBLEMS)
        store_printf(&b, "problem: ... and %d more\n", st->n_problems - STORE_MAX_PROBLEMS);
    int any = st->problems != NULL;
    for (int i = 0; i < st->n_shards; i++) any |= st->shards[i].covered != st->shards[i].size - st->shards[i].data_start;
    if (!any) store_printf(&b, "problems: none found\n");
}
