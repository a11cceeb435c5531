/* describe.c — store_describe, the text of `deltafin info`: tensors and bytes of spine vs experts, dtypes,
 * expert spans, the memory plan and the problems found while loading. */
#include "store_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "format/int8_spine.h"

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
        store_printf(b, " %s %s [%lld, %lld]%s", experts_mat_name(m), tensor_dtype_name(w[m]->dtype),
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
    if (st->opts.state_bytes) {
        store_printf(b, "\n  session state: ");
        store_print_bytes(b, st->opts.state_bytes);
        store_printf(b, " for a context of %lld tokens (--ctx)", (long long)st->opts.state_tokens);
    }
    if (!st->spine) {
        store_printf(b, "\n  spine: served from the file mapping (it fits): ");
        store_print_bytes(b, st->spine_bytes);
    } else {
        store_printf(b, "\n  spine resident: ");
        store_print_bytes(b, spine_resident_bytes(st->spine));
        store_printf(b, "\n  spine streamed: %d layers through two buffers of ", st->streamed_layers);
        store_print_bytes(b, spine_stream_bytes(st->spine) / 2);
        if (st->split_layers)
            store_printf(b, "\n  %d of them read in %d parts (a few tensors at a time, in the order they are used)",
                         st->split_layers, spine_streamed_units(st->spine) - (st->head_tiled ? st->head.n : 0) -
                                               (st->streamed_layers - st->split_layers));
        store_printf(b, "\n  embedding: rows read on demand from the file mapping (not resident)");
        if (st->head_resident)
            store_printf(b, "\n  lm_head: in %d tiles of %lld rows, %d of them resident, the others streamed through "
                         "the same buffers", st->head.n, (long long)st->head.per, st->head_resident);
        else if (st->head_tiled)
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
    store_printf(b, " (every layer streamed in parts, lm_head tiled, %llu expert slots)\n",
                 (unsigned long long)st->min_slots);
}

void store_describe(const df_store *st, char *buf, size_t cap) {
    if (!cap) return;
    size_t len = strnlen(buf, cap);
    if (len >= cap) len = cap - 1, buf[len] = 0;
    store_buf b = {buf, cap, len};
    store_printf(&b, "checkpoint: %s (model_type %s%s)\n", st->dir, st->ck.model_type,
                 st->ck.family == TENSOR_FAMILY_K3 ? ", text tensors under " TENSOR_K3_PREFIX : "");
    store_printf(&b, "shards: %d (%s)\n", st->ck.n_shards,
                 st->ck.indexed ? "model.safetensors.index.json" : "model.safetensors");
    store_printf(&b, "tensors: %lld\n", (long long)st->n_tensors);
    if (st->n_ignored) {
        store_printf(&b, "ignored: %lld non-text tensors, ", (long long)st->n_ignored);
        store_print_bytes(&b, st->ignored_bytes);
        store_printf(&b, "\n");
    }
    if (st->n_unknown) {
        store_printf(&b, "unknown: %lld tensors not in the tensor-name table (ignored), ", (long long)st->n_unknown);
        store_print_bytes(&b, st->unknown_bytes);
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
    for (int i = 0; i < st->ck.n_shards; i++) {
        const st_file *f = &st->ck.shards[i];
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
    for (int i = 0; i < st->ck.n_shards; i++) any |= st->ck.shards[i].covered != st->ck.shards[i].size - st->ck.shards[i].data_start;
    if (!any) store_printf(&b, "problems: none found\n");
}
