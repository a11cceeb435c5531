/* store.c — the storage seam over local files (store.h): opens a model folder (config.json plus
 * model.safetensors or a sharded index) by reading its checkpoint (format/checkpoint.h) into tables (catalog.c),
 * building the routed-expert table (experts.c), readers and memory plan (plan.c), and serves spine tensors,
 * lm_head tiles and statistics. Shards are mapped for their headers; the spine is served from the mapping when it
 * fits the budget, else from budgeted buffers (spine.c); routed experts are always read into the slot cache
 * (cache.c). */
#include "store_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "install/remote.h"

/* Experts placed in other folders: checked against the checkpoint's spans, read from file n_shards + folder. */
static int store_open_place(df_store *st, df_error *err) {
    int found = 0;
    const char *pdir = st->opts.placement_dir ? st->opts.placement_dir : st->dir;
    int rc = placement_load(&st->place, pdir, st->n_layers, st->n_experts, st->opts.expert_dirs, &found, err);
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
    const char **paths = xmalloc(sizeof *paths * (size_t)(st->ck.n_shards + st->place.n_folders + 1));
    for (int i = 0; i < st->ck.n_shards; i++) paths[i] = st->ck.shards[i].path;
    for (int f = 0; f < st->place.n_folders; f++) paths[st->ck.n_shards + f] = st->place.files[f];
    io_local_opts lo = {!st->opts.buffered_io, st->opts.io_kind};
    rc = io_local_open_ex(&st->src_expert, st->ck.n_shards + st->place.n_folders, paths, &lo, err);
    if (!rc) rc = io_install_wrap(&st->src_expert, st->dir, st->ck.n_shards, st->opts.remote_url, err);
    if (!rc) rc = io_local_open_ex(&st->src_spine, st->ck.n_shards, paths, &lo, err);
    free(paths);
    st->pool = io_pool_new(st->opts.io_threads > 0 ? st->opts.io_threads : STORE_IO_THREADS);
    return rc;
}

static int warm_range_cmp(const void *a, const void *b) {
    const uint8_t *x = ((const warm_range *)a)->p, *y = ((const warm_range *)b)->p;
    return (x > y) - (x < y);
}

/* Adds the items' mapped bytes, sorted by address (store_preload_ranges); of the top-level ones (glob), those the
 * globals' unit holds. */
static int store_warm_items(const df_store *st, const store_item *it, int n, int glob, warm_range *r, int k) {
    int k0 = k;
    for (int i = 0; i < n; i++) {
        const st_file *f = it[i].ref.t ? &st->ck.shards[it[i].ref.shard] : NULL;
        if (!f || !f->map || !it[i].usable || it[i].foreign || (glob && plan_global_skipped(st, &it[i]))) continue;
        r[k++] = (warm_range){f->map + store_ref_offset(st, it[i].ref), it[i].ref.t->end - it[i].ref.t->begin};
    }
    qsort(r + k0, (size_t)(k - k0), sizeof *r, warm_range_cmp);
    return k;
}

int store_preload_ranges(const df_store *st, warm_range **out) {
    int cap = st->n_globals, k = 0;
    for (int l = 0; l < st->n_layers; l++) cap += st->layers[l].n;
    warm_range *r = xmalloc(sizeof *r * (size_t)(cap ? cap : 1));
    for (int l = 0; l < st->n_layers; l++) k = store_warm_items(st, st->layers[l].items, st->layers[l].n, 0, r, k);
    *out = r;
    return store_warm_items(st, st->globals, st->n_globals, 1, r, k);
}

int store_open(df_store **out, const char *dir, df_error *err) { return store_open_ex(out, dir, NULL, err); }

int store_open_ex(df_store **out, const char *dir, const store_opts *opts, df_error *err) {
    *out = NULL;
    df_store *st = xcalloc(1, sizeof *st);
    st->dir = xstrdup(dir);
    if (opts) st->opts = *opts;
    int rc = ckpt_open(&st->ck, dir, err);
    if (!rc) rc = catalog_build_tables(st, err);
    ckpt_drop_tensors(&st->ck);
    if (!rc) rc = catalog_use_int8_spine(st, err);
    if (!rc) catalog_mark_foreign(st);
    if (!rc) rc = experts_build(st, err);
    if (!rc && st->opts.catalog_only) {   /* tables and sizes only: nothing is read or planned */
        rc = store_open_place(st, err);
        if (rc) store_free(st);
        else *out = st;
        return rc;
    }
    if (!rc) rc = store_open_io(st, err);
    if (!rc) rc = plan_build(st, err);
    if (!rc) st->ra = readahead_new(st->n_layers, st->opts.lookahead, st->cache, st->pool);
    if (!rc && !st->spine && st->opts.preload == DF_PRELOAD_ON) {
        warm_range *r;
        int n = store_preload_ranges(st, &r);
        st->warm = spine_warm_start(r, n);
        free(r);
    }
    if (rc) {
        store_free(st);
        return rc;
    }
    *out = st;
    return DF_OK;
}

void store_free(df_store *st) {
    if (!st) return;
    spine_warm_free(st->warm);   /* before the mappings it reads go */
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
    ckpt_free(&st->ck);
    for (int l = 0; l < st->n_layers; l++) {
        free(st->layers[l].items);
        free(st->layers[l].region);
        free(st->layers[l].part);
        free(st->experts[l]);
    }
    free(st->layers);
    free(st->experts);
    free(st->n_experts);
    free(st->expert_base);
    free(st->expert_shard);
    free(st->globals);
    for (int i = 0; i < st->n_copies; i++) free(st->copies[i]);
    free(st->copies);
    free(st->problems);
    free(st->dir);
    free(st);
}

const char *store_dir(const df_store *st) { return st->dir; }
const char *store_config_text(const df_store *st) { return st->ck.config_text; }
const char *store_family(const df_store *st) { return st->ck.model_type; }
int store_layer_count(const df_store *st) { return st->n_layers; }
int store_shard_count(const df_store *st) { return st->ck.n_shards; }

const char *store_shard_path(const df_store *st, int shard) {
    return shard >= 0 && shard < st->ck.n_shards ? st->ck.shards[shard].path : NULL;
}

uint64_t store_weights_id(const df_store *st) {
    uint64_t h = df_hash64(&st->opts.spine, sizeof st->opts.spine, 0x5748u);
    for (int i = 0; i < st->ck.n_shards; i++) {
        const st_file *f = &st->ck.shards[i];
        const char *slash = strrchr(f->path, '/'), *name = slash ? slash + 1 : f->path;
        struct stat sb;
        int64_t id[4] = {(int64_t)f->size, -1, -1, (int64_t)f->header_len};
        if (!stat(f->path, &sb)) id[1] = (int64_t)sb.st_mtim.tv_sec, id[2] = (int64_t)sb.st_mtim.tv_nsec;
        h = df_hash64(name, strlen(name) + 1, h);
        h = df_hash64(id, sizeof id, h);
        if (f->map && f->header_len) h = df_hash64(f->map + 8, (size_t)f->header_len, h);
    }
    return h;
}

char *store_read_aux(const df_store *st, const char *name, size_t *len, df_error *err) {
    if (!ckpt_file_name_ok(name)) {
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
    int rc = st_tensor_view(&st->ck.shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    if (!rc) *out = &it->view;
    return rc;
}

/* Points the items of a layer's part at the buffer holding it. */
static void store_layer_place(df_store *st, df_store_layer *l, int p, const uint8_t *base) {
    for (int i = 0; i < l->n; i++)
        if (l->part[i] == p)
            store_item_place(&l->items[i], spine_region_data(base, spine_unit_region(st->spine, l->unit0 + p,
                                                                                     l->region[i])));
}

/* Holds part p of a streamed layer instead of the part held before. */
static int store_layer_hold(df_store *st, df_store_layer *l, int p, df_error *err) {
    if (l->held == p) return DF_OK;
    if (l->held >= 0) spine_release(st->spine, l->unit0 + l->held);
    l->held = -1;
    uint8_t *base;
    int rc = spine_acquire(st->spine, l->unit0 + p, &base, err);
    if (rc) return rc;
    l->held = p;
    store_layer_place(st, l, p, base);
    return DF_OK;
}

static int store_layer_check_index(const df_store *st, int layer, df_error *err) {
    if (layer >= 0 && layer < st->n_layers) return DF_OK;
    return df_error_set(err, DF_EINVAL, "%s: layer %d out of range (checkpoint has %d layers)", st->dir, layer,
                        st->n_layers), DF_EINVAL;
}

int store_layer_acquire(df_store *st, int layer, const df_store_layer **out, df_error *err) {
    *out = NULL;
    int rc = store_layer_check_index(st, layer, err);
    if (rc) return rc;
    df_store_layer *l = &st->layers[layer];
    if (l->bad >= 0) {
        const store_item *it = &l->items[l->bad];
        return st_tensor_view(&st->ck.shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    }
    if (st->spine) {   /* a layer in parts starts with its first; store_layer_need moves on */
        l->held = -1;
        rc = store_layer_hold(st, l, 0, err);
        if (rc) return rc;
    }
    *out = l;
    return DF_OK;
}

static const store_item *store_item_of(const df_store_layer *l, const df_tensor *t) {
    const store_item *it = (const store_item *)(const void *)((const char *)t - offsetof(store_item, view));
    DF_ASSERT(it >= l->items && it < l->items + l->n);
    return it;
}

/* The part of a layer streamed in parts that holds t; -1 for a foreign matrix, which none holds. */
static int store_item_part(const df_store_layer *l, const df_tensor *t) {
    const store_item *it = store_item_of(l, t);
    return it->foreign ? -1 : l->part[it - l->items];
}

const char *store_layer_tensor_key(const df_store_layer *l, const df_tensor *t) { return store_item_of(l, t)->key; }
int store_layer_holds(const df_store_layer *l, const df_tensor *t) { return !store_item_of(l, t)->foreign; }

static uint64_t store_items_bytes(const store_item *it, int n) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        if (it[i].usable && !it[i].foreign) b += it[i].ref.t->end - it[i].ref.t->begin;
    return b;
}

uint64_t store_spine_bytes_of(const df_store *st, int layer) {
    if (layer == st->n_layers) return store_items_bytes(st->globals, st->n_globals);
    return store_items_bytes(st->layers[layer].items, st->layers[layer].n);
}

int store_layer_ready(const df_store *st, const df_store_layer *layer, const df_tensor *t) {
    const df_store_layer *l = &st->layers[layer->index];
    if (store_item_of(l, t)->foreign) return 0;
    return !st->spine || l->n_parts <= 1 || l->held == store_item_part(l, t);
}

int store_layer_need(df_store *st, const df_store_layer *layer, const df_tensor *t, df_error *err) {
    df_store_layer *l = &st->layers[layer->index];
    if (!st->spine || l->n_parts <= 1 || store_item_of(l, t)->foreign) return DF_OK;   /* foreign: not here */
    return store_layer_hold(st, l, store_item_part(l, t), err);
}

int store_layer_check(df_store *st, int layer, df_error *err) {
    const df_store_layer *l;
    int rc = store_layer_acquire(st, layer, &l, err);
    for (int p = 1; !rc && p < l->n_parts && st->spine; p++) rc = store_layer_hold(st, &st->layers[layer], p, err);
    if (l) store_layer_release(st, l);
    return rc;
}

const df_tensor *store_layer_tensor(const df_store_layer *l, const char *suffix) {
    const store_item *it = store_find_item(l->items, l->n, suffix);
    return it && it->usable ? &it->view : NULL;
}

int store_layer_table(df_store *st, int layer, const df_store_layer **out, df_error *err) {
    *out = NULL;
    int rc = store_layer_check_index(st, layer, err);
    if (rc) return rc;
    const df_store_layer *l = &st->layers[layer];
    if (l->bad >= 0) {
        const store_item *it = &l->items[l->bad];
        return st_tensor_view(&st->ck.shards[it->ref.shard], it->ref.t, &(df_tensor){0}, err);
    }
    *out = l;
    return DF_OK;
}

int store_layer_tensor_file(const df_store *st, const df_store_layer *l, const char *suffix, df_tensor *out) {
    const store_item *it = store_find_item(l->items, l->n, suffix);
    df_error e;
    if (!it || !it->usable || it->int8 || st_tensor_view(&st->ck.shards[it->ref.shard], it->ref.t, out, &e) ||
        !out->data)
        return -1;
    return 0;
}

void store_layer_release(df_store *st, const df_store_layer *layer) {
    if (!st->spine || !layer) return;
    df_store_layer *l = &st->layers[layer->index];
    if (l->held >= 0) spine_release(st->spine, l->unit0 + l->held);
    l->held = -1;
}


int store_head_tiles(const df_store *st, int64_t *rows_per_tile) {
    if (!st->head_tiled) {
        const store_item *h = store_find_item(st->globals, st->n_globals, tensor_name_suffix(TN_LM_HEAD));
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
        o->lookahead_loads = c.lookahead_loads;
        o->lookahead_requests = c.lookahead_requests;
        o->lookahead_recalled = c.lookahead_recalled;
        o->warm_loads = c.warm_loads;
    }
    o->io_uring = io_source_kind(st->src_expert) == IO_KIND_URING;
    o->io_busy_s = st->pool ? io_pool_busy_seconds(st->pool, 0) : 0;
    o->expert_requests = atomic_load(&st->expert_requests);
    o->expert_disk_bytes = atomic_load(&st->src_expert->bytes);
    o->spine_disk_bytes = atomic_load(&st->src_spine->bytes);
    o->net_bytes = atomic_load(&st->src_expert->net_bytes);   /* the spine is always local */
    o->direct_fallbacks = atomic_load(&st->src_expert->direct_fallbacks);
    o->mem_budget = st->opts.mem_budget;
    o->reserve_bytes = st->reserve_bytes;
    o->expert_bytes = st->slot_bytes;
    o->spine_mapped = !st->spine;
    o->head_tiles = st->head_tiled ? st->head.n : 0;
    o->spine_bytes = st->opts.experts_only ? 0 : st->spine_bytes;
    o->foreign_spine_bytes = st->foreign_bytes;
    if (st->spine) {
        o->resident_spine_bytes = spine_resident_bytes(st->spine);
        o->stream_buffer_bytes = spine_stream_bytes(st->spine);
        o->streamed_layers = st->streamed_layers;
        o->split_layers = st->split_layers;
    } else {
        o->resident_spine_bytes = st->spine_bytes;
    }
}
