/* plan.c — the residency plan: how the memory budget splits into a working reserve, the spine (served from
 * the file mapping when it all fits, else the top-level tensors and the biggest layers resident and the rest
 * streamed through two buffers, lm_head in row tiles when even that does not fit) and expert cache slots; then
 * the replacement policy, saved heat and the routing trace the options ask for. */
#include "store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "budget.h"
#include "policy.h"

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
        if (layer == st->n_layers && !strcmp(items[i].key, tensor_name_suffix(TN_EMBED))) continue;
        if (layer == st->n_layers && st->head_tiled && !strcmp(items[i].key, tensor_name_suffix(TN_LM_HEAD)))
            continue;
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
    if (!st->opts.trace_routing) return DF_OK;
    return rtrace_writer_open(&st->trace, st->opts.trace_routing, st->n_layers, st->n_experts, err);
}

/* lm_head can be tiled when it is a plain matrix (the int8 copy keeps its row scales apart). */
static int store_head_tileable(const df_store *st) {
    const store_item *h = store_find_item(st->globals, st->n_globals, tensor_name_suffix(TN_LM_HEAD));
    return h && h->usable && !h->int8 && h->view.ndim == 2 && h->view.shape[0] >= 2;
}

/* Spine units for streaming: one per layer, the top-level tensors (resident, without the embedding, which
 * stays mapped), and with tiled lm_head its tiles; chooses resident layers. Returns the bytes this plan needs
 * (reserve, resident spine, two stream buffers, the minimum cache). */
static uint64_t store_stream_plan(df_store *st, uint64_t budget, uint64_t min_cache, int tiled, spine_unit **out,
                                  int *n_units) {
    const store_item *h = tiled && store_head_tileable(st)
                              ? store_find_item(st->globals, st->n_globals, tensor_name_suffix(TN_LM_HEAD)) : NULL;
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
    *n_units = st->n_layers + 1 + (h ? st->head.n : 0);   /* re-tiled to the largest layer: at most n */
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

int plan_build(df_store *st, df_error *err) {
    uint64_t full = st->opts.mem_budget ? st->opts.mem_budget : budget_default_bytes(), state = st->opts.state_bytes;
    char b1[32], b2[32];
    st->opts.mem_budget = full;
    if (state >= full) {
        store_print_gib(b1, sizeof b1, full);
        store_print_gib(b2, sizeof b2, state);
        return df_error_set(err, DF_ENOMEM, "%s: memory budget %s is too small for a session of %lld tokens (its state "
                            "takes %s); lower --ctx or raise --mem", st->dir, b1, (long long)st->opts.state_tokens,
                            b2), DF_ENOMEM;
    }
    uint64_t budget = full - state;   /* what the weights, the cache and the working reserve share */
    st->reserve_bytes = DF_MIN(DF_MAX(budget / 16, 64ull << 20), 1ull << 30);
    for (int l = 0; l < st->n_layers; l++)
        for (int e = 0; e < st->n_experts[l]; e++) {
            store_expert *x = &st->experts[l][e];
            experts_plan_read(st, x);
            st->slot_bytes = DF_MAX(st->slot_bytes, io_round_up(experts_slot_need(st, x), IO_ALIGN));
            st->n_experts_total++;
        }
    uint64_t min_slots = (uint64_t)DF_MIN(st->n_experts_total, STORE_MIN_SLOTS);
    if (st->opts.cache_slots > 0) min_slots = (uint64_t)st->opts.cache_slots;
    uint64_t min_cache = min_slots * st->slot_bytes, spine_used = st->spine_bytes;
    st->min_slots = min_slots;
    st->min_budget = store_min_budget(st, min_cache) + state;
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
            store_print_gib(b1, sizeof b1, full);
            store_print_gib(b2, sizeof b2, need + state);
            for (int l = 0; l < n_units; l++) free(u[l].r);
            free(u);
            return df_error_set(err, DF_ENOMEM, "%s: memory budget %s is too small for this model: streaming its "
                                "spine needs at least %s (working reserve, top-level tensors, two buffers of the "
                                "largest streamed layer or lm_head tile, %llu expert slots and the session state); "
                                "the smallest budget it runs in is %.2f GiB", st->dir, b1, b2, (unsigned long long)min_slots,
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
        store_print_gib(b1, sizeof b1, full);
        return df_error_set(err, DF_ENOMEM, "%s: memory budget %s leaves no room for an expert slot (%llu bytes)",
                            st->dir, b1, (unsigned long long)st->slot_bytes), DF_ENOMEM;
    }
    st->cache = ecache_new(st->n_layers, st->n_experts, (int)slots, st->slot_bytes, st->pool, experts_load, st);
    return store_policy_open(st, err);
}
