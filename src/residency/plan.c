/* plan.c — the residency plan: how the memory budget splits into a working reserve, the spine (served from
 * the file mapping when it all fits, else the top-level tensors and the biggest layers resident and the rest
 * streamed through two buffers, whole or, when two whole layers do not fit, in parts of a few tensors; lm_head
 * in row tiles when it does not fit either) and expert cache slots; then
 * the replacement policy, saved heat and the routing trace the options ask for. */
#include "store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "budget.h"
#include "policy.h"

/* The memory plan: working reserve, then the spine (mapped if it all fits, else top-level tensors and the
 * biggest layers resident and the rest streamed through two buffers, whole or in parts), then expert slots. */

/* The order the model uses a layer's matrices in (mixer, then FFN: see kda.c, mla.c, moe.c), so that a layer
 * streamed in parts reads each part once per pass. Anything else (vectors, copied at bind) comes first. */
static const tensor_kind store_use_order[] = {
    TN_ATTN_Q, TN_MLA_Q_A, TN_MLA_Q_B, TN_ATTN_K, TN_ATTN_V, TN_MLA_KV_A, TN_MLA_KV_B, TN_KDA_F_A, TN_KDA_B,
    TN_KDA_F_B, TN_ATTN_G, TN_KDA_G_A, TN_KDA_G_B, TN_ATTN_O, TN_FFN_GATE, TN_FFN_UP, TN_FFN_DOWN, TN_MOE_ROUTER,
    TN_SHARED_GATE, TN_SHARED_UP, TN_SHARED_DOWN, TN_LATENT_DOWN, TN_LATENT_UP};

static int store_use_rank(const char *key) {
    for (size_t k = 0; k < sizeof store_use_order / sizeof *store_use_order; k++)
        if (!strcmp(key, tensor_name_suffix(store_use_order[k]))) return (int)k + 1;
    return 0;
}

int plan_global_skipped(const df_store *st, const store_item *it) {
    return !strcmp(it->key, tensor_name_suffix(TN_EMBED)) ||
           (st->head_tiled && !strcmp(it->key, tensor_name_suffix(TN_LM_HEAD)));
}

/* Builds the spine units of a layer (or, with layer == n_layers, the one unit of the globals): its tensors in
 * the order they are used, a new unit starting wherever the next tensor would take one past cap bytes (one
 * unit when cap is UINT64_MAX). u has room for one unit per tensor; returns the units written. */
static int store_layer_units(df_store *st, int layer, uint64_t cap, spine_unit *u) {
    int glob = layer == st->n_layers, n = glob ? st->n_globals : st->layers[layer].n;
    store_item *items = glob ? st->globals : st->layers[layer].items;
    int *region = xmalloc(sizeof *region * (size_t)(n + 1)), *part = xmalloc(sizeof *part * (size_t)(n + 1));
    int *order = xmalloc(sizeof *order * (size_t)(n + 1)), *rank = xmalloc(sizeof *rank * (size_t)(n + 1));
    int n_units = 0;
    for (int j = 0; j < n; j++) rank[j] = store_use_rank(items[j].key);
    for (int i = 0, k = 0; k <= (int)(sizeof store_use_order / sizeof *store_use_order); k++)
        for (int j = 0; j < n; j++)
            if (rank[j] == k) order[i++] = j;
    free(rank);
    for (int i = 0; i < n; i++) region[i] = part[i] = -1;
    for (int o = 0; o < n; o++) {
        int i = order[o];
        if (items[i].foreign || (glob && plan_global_skipped(st, &items[i]))) continue;
        for (int j = 0; j < n && region[i] < 0; j++)   /* the same bytes under another key */
            if (j != i && region[j] >= 0 && items[j].ref.t == items[i].ref.t) region[i] = region[j], part[i] = part[j];
        if (region[i] >= 0) continue;
        store_ref r = items[i].ref;
        spine_region reg = {r.shard, store_ref_offset(st, r), r.t->end - r.t->begin, r.t->elem_size, 0};
        spine_unit *cur = n_units ? &u[n_units - 1] : NULL;
        if (!cur || (cur->n && spine_unit_bytes(cur) + spine_unit_bytes(&(spine_unit){.n = 1, .r = &reg}) > cap)) {
            cur = &u[n_units++];
            *cur = (spine_unit){.r = xcalloc((size_t)n + 1, sizeof *cur->r)};
        }
        region[i] = cur->n;
        part[i] = n_units - 1;
        cur->r[cur->n++] = reg;
    }
    if (!n_units) u[n_units++] = (spine_unit){.r = xcalloc(1, sizeof *u->r)};
    for (int k = 0; k < n_units; k++) {
        if (glob) snprintf(u[k].name, sizeof u[k].name, "the top-level tensors");
        else if (n_units == 1) snprintf(u[k].name, sizeof u[k].name, "layer %d", layer);
        else snprintf(u[k].name, sizeof u[k].name, "layer %d part %d of %d", layer, k + 1, n_units);
    }
    free(order);
    if (glob) {
        free(part);
        free(st->global_region);
        st->global_region = region;
    } else {
        df_store_layer *l = &st->layers[layer];
        free(l->region);
        free(l->part);
        l->region = region;
        l->part = part;
        l->n_parts = n_units;
        l->held = -1;
    }
    return n_units;
}

static int store_cmp_size_desc(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;   /* pairs (bytes, layer) */
    return x[0] < y[0] ? 1 : x[0] > y[0] ? -1 : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Chooses resident units among u[0..n) (largest first) so that they and two stream buffers fit avail; returns
 * the bytes made resident. A buffer holds the largest unit left streamed and at least buf_floor bytes; with
 * cut, exactly buf_floor (the units are whole layers, and those left streamed will be cut into parts of at
 * most that). */
static uint64_t store_choose_resident(const df_store *st, spine_unit *const *u, int n, uint64_t avail,
                                      uint64_t buf_floor, int cut) {
    uint64_t (*by)[2] = xmalloc(sizeof *by * (size_t)(n + 1));
    for (int i = 0; i < n; i++) by[i][0] = spine_unit_bytes(u[i]), by[i][1] = (uint64_t)i;
    qsort(by, (size_t)n, sizeof *by, store_cmp_size_desc);
    uint64_t used = 0, skipped_max = 0;
    for (int j = 0; j < n && !st->opts.spine_stream && !st->opts.spine_part_bytes; j++) {
        uint64_t rest = cut ? buf_floor : DF_MAX(DF_MAX(skipped_max, j + 1 < n ? by[j + 1][0] : 0), buf_floor);
        if (used + by[j][0] + 2 * rest <= avail) {
            used += by[j][0];
            u[by[j][1]]->resident = 1;
        } else {
            skipped_max = DF_MAX(skipped_max, by[j][0]);
        }
    }
    free(by);
    return used;
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
        const uint8_t *mask = st->opts.expert_mask;   /* a rank warms only the experts it computes */
        int cap = mask ? (int)st->n_experts_total : cs.slots;
        int *layers = xmalloc(sizeof *layers * (size_t)(cap + 1)), *ids = xmalloc(sizeof *ids * (size_t)(cap + 1));
        float *w = xmalloc(sizeof *w * (size_t)(cap + 1));
        int n = heat_top(st->heat, cap, layers, ids, w), k = 0;
        for (int i = 0; i < n && k < cs.slots; i++)
            if (!mask || mask[store_expert_index(st, layers[i], ids[i])])
                layers[k] = layers[i], ids[k] = ids[i], w[k++] = w[i];
        if (k) ecache_warm(st->cache, k, layers, ids, w);
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

/* The largest tensor of any layer, as a spine unit's bytes: the smallest parts layers can be cut into. */
static uint64_t store_largest_tensor(const df_store *st) {
    uint64_t big = 0;
    for (int l = 0; l < st->n_layers; l++)
        for (int i = 0; i < st->layers[l].n; i++) {
            if (st->layers[l].items[i].foreign) continue;
            store_ref r = st->layers[l].items[i].ref;
            spine_region reg = {.off = store_ref_offset(st, r), .len = r.t->end - r.t->begin};
            big = DF_MAX(big, spine_unit_bytes(&(spine_unit){.n = 1, .r = &reg}));
        }
    return big;
}

/* The buffer bytes the largest of lm_head's tiles takes, as tiled now. */
static uint64_t store_tile_bytes(const df_store *st, const store_item *h) {
    spine_unit *t = xcalloc((size_t)st->head.n, sizeof *t);
    tiles_units(&st->head, h->ref.shard, store_ref_offset(st, h->ref), h->ref.t->elem_size, t);
    uint64_t big = 0;
    for (int j = 0; j < st->head.n; j++) {
        big = DF_MAX(big, spine_unit_bytes(&t[j]));
        free(t[j].r);
    }
    free(t);
    return big;
}

/* Counts what a plan streams (layers, those of them in parts, lm_head tiles kept resident); returns the largest
 * streamed unit, which sizes the two buffers. */
static uint64_t store_plan_tally(df_store *st, const spine_unit *u, int n) {
    uint64_t big = 0;
    for (int j = 0; j < n; j++)
        if (!u[j].resident) big = DF_MAX(big, spine_unit_bytes(&u[j]));
    st->streamed_layers = st->split_layers = st->head_resident = 0;
    for (int l = 0; l < st->n_layers; l++) {
        const df_store_layer *L = &st->layers[l];
        int streamed = 0;
        for (int j = L->unit0; j < L->unit0 + L->n_parts; j++) streamed |= !u[j].resident;
        st->streamed_layers += streamed;
        st->split_layers += streamed && L->n_parts > 1;
    }
    for (int j = 0; st->head_tiled && j < st->head.n; j++) st->head_resident += u[st->head.first_unit + j].resident;
    return big;
}

/* Spine units for streaming, in the order a pass uses them: each layer's (whole, or with part_cap > 0 a
 * streamed layer's parts of about part_cap bytes), the top-level tensors (resident, without the embedding,
 * which stays mapped), and with tiled lm_head its tiles; chooses resident layers. Returns the bytes this plan
 * needs (reserve, resident spine, two stream buffers, the minimum cache). */
static uint64_t store_stream_plan(df_store *st, uint64_t budget, uint64_t min_cache, int tiled, uint64_t part_cap,
                                  spine_unit **out, int *n_units) {
    const store_item *h = tiled && store_head_tileable(st)
                              ? store_find_item(st->globals, st->n_globals, tensor_name_suffix(TN_LM_HEAD)) : NULL;
    st->head_tiled = h != NULL;
    uint64_t row = h ? tensor_row_bytes(&h->view) : 0, floor = 0;
    if (h) {   /* tiles of the requested rows, else of the largest streamed unit (at least 64 MiB, for big reads) */
        floor = st->opts.head_tile_rows > 0 ? (uint64_t)st->opts.head_tile_rows * row : 64ull << 20;
        tiles_init(&st->head, &h->view, row, floor, 0);
        floor = store_tile_bytes(st, h);   /* as a buffer holds them (a small lm_head has smaller tiles) */
    }
    if (part_cap) part_cap = DF_MAX(part_cap, store_largest_tensor(st));
    int cap = 1 + (h ? st->head.n : 0);
    for (int l = 0; l < st->n_layers; l++) cap += st->layers[l].n + 1;
    spine_unit *u = xcalloc((size_t)cap, sizeof *u), *whole = xcalloc((size_t)st->n_layers + 1, sizeof *whole), g;
    for (int l = 0; l < st->n_layers; l++) store_layer_units(st, l, UINT64_MAX, &whole[l]);
    store_layer_units(st, st->n_layers, UINT64_MAX, &g);
    g.resident = 1;
    uint64_t fixed = st->reserve_bytes + min_cache + spine_unit_bytes(&g), need = fixed, big = 0;
    spine_unit **pick = xmalloc(sizeof *pick * (size_t)cap);
    for (int l = 0; l < st->n_layers; l++) pick[l] = &whole[l];
    if (fixed < budget)
        need += store_choose_resident(st, pick, st->n_layers, budget - fixed, DF_MAX(floor, part_cap), part_cap > 0);
    int k = 0, n_pick = 0;
    for (int l = 0; l < st->n_layers; l++) {
        st->layers[l].unit0 = k;
        if (whole[l].resident || !part_cap) {
            if (!whole[l].resident) big = DF_MAX(big, spine_unit_bytes(&whole[l]));
            u[k++] = whole[l];
            continue;
        }
        free(whole[l].r);
        int n = store_layer_units(st, l, part_cap, &u[k]);
        for (int j = 0; j < n; j++) pick[n_pick++] = &u[k + j];
        k += n;
    }
    st->global_unit = k;
    u[k++] = g;
    if (h) {   /* beside whole layers, tiles as large as the largest; beside parts they stay small, kept like parts */
        if (!part_cap && st->opts.head_tile_rows <= 0 && big > floor) tiles_init(&st->head, &h->view, row, big, k);
        st->head.first_unit = k;
        tiles_units(&st->head, h->ref.shard, store_ref_offset(st, h->ref), h->ref.t->elem_size, u + k);
        for (int j = 0; part_cap && j < st->head.n; j++) pick[n_pick++] = &u[k + j];
        k += st->head.n;   /* re-tiled to the largest unit: no more tiles than allocated for */
    }
    /* Parts and tiles too: a resident byte saves a read every pass, more than a byte of expert slots can */
    if (n_pick && need < budget) need += store_choose_resident(st, pick, n_pick, budget - need, 0, 0);
    free(pick);
    free(whole);
    *out = u;
    *n_units = k;
    return need + 2 * store_plan_tally(st, u, k);
}

/* Bytes a pass reads of the spine under a plan: its streamed units. */
static uint64_t store_streamed_bytes(const spine_unit *u, int n) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        if (!u[i].resident) b += spine_unit_bytes(&u[i]);
    return b;
}

static void store_units_free(spine_unit *u, int n) {
    for (int i = 0; i < n; i++) free(u[i].r);
    free(u);
}

/* The smallest budget the planner accepts: every layer streamed in parts, lm_head tiled when it can be, the
 * minimum cache, and the working reserve, which is a 16th of the budget within [64 MiB, 1 GiB]. Run before the
 * real plan, which rebuilds the units. */
static uint64_t store_min_budget(df_store *st, uint64_t min_cache) {
    spine_unit *u = NULL;
    int n = 0;
    uint64_t need = store_stream_plan(st, 0, min_cache, 1, 1, &u, &n) - st->reserve_bytes;
    store_units_free(u, n);
    st->head_tiled = st->streamed_layers = st->split_layers = st->head_resident = 0;
    for (int l = 0; l < st->n_layers; l++) st->layers[l].n_parts = 1;
    if (need + (64ull << 20) <= (1ull << 30)) return need + (64ull << 20);
    if (need / 15 * 16 <= (16ull << 30)) return (need + 14) / 15 * 16;
    return need + (1ull << 30);
}

/* The budget's split before any spine plan: the working reserve, the expert slots' size and the minimum cache.
 * Returns what the weights, the cache and the reserve share (the budget less the session state). */
static uint64_t plan_sizes(df_store *st, uint64_t *min_cache) {
    uint64_t full = st->opts.mem_budget ? st->opts.mem_budget : budget_default_bytes(), state = st->opts.state_bytes;
    st->opts.mem_budget = full;
    uint64_t budget = state < full ? full - state : 0;
    st->reserve_bytes = DF_MIN(DF_MAX(budget / 16, 64ull << 20), 1ull << 30);
    st->slot_bytes = 0;
    st->n_experts_total = 0;
    for (int l = 0; l < st->n_layers; l++)
        for (int e = 0; e < st->n_experts[l]; e++) {
            store_expert *x = &st->experts[l][e];
            experts_plan_read(st, x);
            st->slot_bytes = DF_MAX(st->slot_bytes, io_round_up(experts_slot_need(st, x), IO_ALIGN));
            st->n_experts_total++;
        }
    uint64_t min_slots = (uint64_t)DF_MIN(st->n_experts_total, STORE_MIN_SLOTS);
    if (st->opts.cache_slots > 0) min_slots = (uint64_t)st->opts.cache_slots;
    st->min_slots = min_slots;
    *min_cache = min_slots * st->slot_bytes;
    return budget;
}


/* Whether the spine this process holds stays in memory under the budget: it fits as it is, or a streaming plan
 * (whole layers, or layers in parts with lm_head in tiles, the embedding left on its mapping) reads none of it
 * in a pass. */
int store_spine_fits(df_store *st) {
    uint64_t min_cache, budget = plan_sizes(st, &min_cache);
    if (st->reserve_bytes + st->spine_bytes + min_cache <= budget) return 1;
    int fits = 0;
    for (int cut = 0; cut < 2 && !fits; cut++) {
        spine_unit *u = NULL;
        int n = 0;
        uint64_t need = store_stream_plan(st, budget, min_cache, cut, cut, &u, &n);
        fits = need <= budget && store_streamed_bytes(u, n) == 0;
        store_units_free(u, n);
        st->head_tiled = st->streamed_layers = st->split_layers = st->head_resident = 0;
        for (int l = 0; l < st->n_layers; l++) st->layers[l].n_parts = 1;
    }
    return fits;
}

int plan_build(df_store *st, df_error *err) {
    uint64_t min_cache, budget = plan_sizes(st, &min_cache), full = st->opts.mem_budget, state = st->opts.state_bytes;
    char b1[32], b2[32];
    if (state >= full) {
        store_print_gib(b1, sizeof b1, full);
        store_print_gib(b2, sizeof b2, state);
        return df_error_set(err, DF_ENOMEM, "%s: memory budget %s is too small for a session of %lld tokens (its state "
                            "takes %s); lower --ctx or raise --mem", st->dir, b1, (long long)st->opts.state_tokens,
                            b2), DF_ENOMEM;
    }
    uint64_t min_slots = st->min_slots, spine_used = st->spine_bytes;
    st->min_budget = store_min_budget(st, min_cache) + state;
    if (st->opts.experts_only) spine_used = 0;   /* never touched: mapped, nothing read, nothing budgeted */
    else if (st->opts.spine_stream || st->opts.head_tile_rows > 0 || st->opts.spine_part_bytes ||
             st->reserve_bytes + st->spine_bytes + min_cache > budget) {
        int n_units = 0, tiled = st->opts.head_tile_rows > 0;
        spine_unit *u = NULL;
        uint64_t part = st->opts.spine_part_bytes, need = store_stream_plan(st, budget, min_cache, tiled, part, &u,
                                                                              &n_units);
        if (need > budget && !tiled && store_head_tileable(st)) {   /* lm_head resident does not fit: tile it */
            store_units_free(u, n_units);
            need = store_stream_plan(st, budget, min_cache, tiled = 1, part, &u, &n_units);
        }
        if (!part) {   /* layers in parts, if whole ones do not fit or leave more to read every pass */
            uint64_t whole = need <= budget ? store_streamed_bytes(u, n_units) : UINT64_MAX;
            store_units_free(u, n_units);
            need = store_stream_plan(st, budget, min_cache, 1, 1, &u, &n_units);
            if (whole != UINT64_MAX && (need > budget || store_streamed_bytes(u, n_units) >= whole)) {
                store_units_free(u, n_units);   /* the whole-layer plan again, as it was */
                need = store_stream_plan(st, budget, min_cache, tiled, 0, &u, &n_units);
            }
        }
        if (need > budget) {
            store_print_gib(b1, sizeof b1, full);
            store_print_gib(b2, sizeof b2, need + state);
            store_units_free(u, n_units);
            return df_error_set(err, DF_ENOMEM, "%s: memory budget %s is too small for this model: streaming its "
                                "spine needs at least %s (working reserve, top-level tensors, two buffers of the "
                                "largest streamed tensor or lm_head tile, %llu expert slots and the session state); "
                                "the smallest budget it runs in is %.2f GiB", st->dir, b1, b2, (unsigned long long)min_slots,
                                (double)st->min_budget / (1ull << 30)), DF_ENOMEM;
        }
        int rc = spine_new(&st->spine, st->src_spine, st->pool, n_units, u, err);
        if (rc) return rc;
        spine_used = spine_resident_bytes(st->spine) + spine_stream_bytes(st->spine);
        uint8_t *gbase = NULL;
        spine_acquire(st->spine, st->global_unit, &gbase, err);
        for (int i = 0; i < st->n_globals; i++)
            if (st->global_region[i] >= 0)
                store_item_place(&st->globals[i], spine_region_data(gbase, spine_unit_region(st->spine, st->global_unit,
                                                                                            st->global_region[i])));
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
    st->cache = ecache_new(st->n_layers, st->n_experts, (int)slots, st->slot_bytes, STORE_POPULATE_AHEAD, st->pool,
                           experts_load, st);
    return store_policy_open(st, err);
}
