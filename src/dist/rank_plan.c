/* rank_plan.c — the rank plan of rank_plan.h: reading and checking DIR/.deltafin/ranks, the default e mod N
 * plan, building one by heat (with replication of the hottest experts), writing it, and choosing the holder
 * that computes a replicated expert in a pass. */
#include "rank_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "install/dcache.h"

#define PLAN_MAGIC "deltafin-ranks 1"

void rank_plan_free(rank_plan *p) {
    for (int r = 0; p->folders && r < p->n_ranks; r++) free(p->folders[r]);
    free(p->folders);
    free(p->base);
    free(p->holders);
    free(p->spine_rank);
    memset(p, 0, sizeof *p);
}

static void plan_shape(rank_plan *p, int n_ranks, int n_layers, const int *n_experts) {
    memset(p, 0, sizeof *p);
    p->n_ranks = n_ranks;
    p->n_layers = n_layers;
    p->base = xcalloc((size_t)n_layers + 1, sizeof *p->base);
    for (int l = 0; l < n_layers; l++) p->base[l + 1] = p->base[l] + n_experts[l];
    p->holders = xcalloc((size_t)p->base[n_layers] + 1, sizeof *p->holders);
    p->folders = xcalloc((size_t)n_ranks, sizeof *p->folders);
}

static void plan_checksum(rank_plan *p) {
    uint64_t h = df_hash64(&p->n_ranks, sizeof p->n_ranks, 0x5eed);
    h = df_hash64(p->holders, (size_t)p->base[p->n_layers] * sizeof *p->holders, h);
    if (p->spine_rank) h = df_hash64(p->spine_rank, (size_t)p->n_layers * sizeof *p->spine_rank, h ^ 0x5b1e);
    p->checksum = h;
}

static int plan_parse(rank_plan *p, char *text, const char *path, const int *n_experts, df_error *err) {
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, PLAN_MAGIC))
        return df_error_set(err, DF_EFORMAT, "%s: not a deltafin rank plan", path), DF_EFORMAT;
    int ranks = 0, layers_seen = 0, folders = 0, ended = 0;
    while ((line = strtok_r(NULL, "\n", &save)) && !ended) {
        int a, n = 0;
        char name[1100];
        if (sscanf(line, "ranks %d", &a) == 1) {
            ranks = a;
            if (ranks != p->n_ranks)
                return df_error_set(err, DF_EINVAL, "%s: the plan is for %d ranks, the job has %d (run deltafin place "
                                    "--ranks %d again)", path, ranks, p->n_ranks, p->n_ranks), DF_EINVAL;
        } else if (sscanf(line, "folder %d %1099s", &a, name) == 2 && a == folders && a < p->n_ranks) {
            p->folders[folders++] = xstrdup(name);
        } else if (sscanf(line, "layer %d%n", &a, &n) == 1 && a == layers_seen && a < p->n_layers) {
            char *at = line + n, *end;
            for (int e = 0; e < n_experts[a]; e++) {
                errno = 0;
                unsigned long long m = strtoull(at, &end, 16);
                if (end == at || errno || !m || (p->n_ranks < 64 && m >> p->n_ranks))
                    return df_error_set(err, DF_EFORMAT, "%s: layer %d: expert %d has no valid holder mask (%d ranks)",
                                        path, a, e, p->n_ranks), DF_EFORMAT;
                p->holders[p->base[a] + e] = m;
                at = end;
            }
            while (*at == ' ') at++;
            if (*at)
                return df_error_set(err, DF_EFORMAT, "%s: layer %d lists more than its %d experts", path, a,
                                    n_experts[a]), DF_EFORMAT;
            layers_seen++;
        } else if (!strcmp(line, "end")) {
            ended = 1;
        } else {
            return df_error_set(err, DF_EFORMAT, "%s: unexpected line '%.80s'", path, line), DF_EFORMAT;
        }
    }
    if (!ended || ranks != p->n_ranks || folders != p->n_ranks || layers_seen != p->n_layers)
        return df_error_set(err, DF_EFORMAT, "%s: incomplete rank plan (%d of %d layers, %d of %d folders%s; run "
                            "deltafin place --ranks again)", path, layers_seen, p->n_layers, folders, p->n_ranks,
                            ended ? "" : ", no end line"), DF_EFORMAT;
    return DF_OK;
}

int rank_plan_load(rank_plan *p, const char *dir, int n_layers, const int *n_experts, int n_ranks, df_error *err) {
    if (n_ranks < 1 || n_ranks > RANK_PLAN_MAX)
        return df_error_set(err, DF_EINVAL, "%d ranks: expert parallelism takes 1 to %d", n_ranks, RANK_PLAN_MAX),
               DF_EINVAL;
    plan_shape(p, n_ranks, n_layers, n_experts);
    char *path = df_path_join(dir, RANK_PLAN_FILE);
    int rc = DF_OK;
    if (access(path, F_OK)) {   /* no plan: e mod N, from the model folder */
        for (int l = 0; l < n_layers; l++)
            for (int e = 0; e < n_experts[l]; e++) p->holders[p->base[l] + e] = 1ull << (e % n_ranks);
    } else {
        char *text = df_read_file_max(path, DF_JSON_FILE_MAX, NULL, err);
        rc = text ? plan_parse(p, text, path, n_experts, err) : err->code;
        free(text);
        p->from_file = 1;
    }
    free(path);
    if (rc) rank_plan_free(p);
    else plan_checksum(p);
    return rc;
}

typedef struct plan_order {
    double heat;
    int e;
} plan_order;

static int plan_order_cmp(const void *a, const void *b) {
    const plan_order *x = a, *y = b;
    return x->heat < y->heat ? 1 : x->heat > y->heat ? -1 : x->e - y->e;
}

void rank_plan_build(rank_plan *p, int n_ranks, const double *weights, int n_layers, const int *n_experts,
                     const float *heat) {
    plan_shape(p, n_ranks, n_layers, n_experts);
    double *load = xcalloc((size_t)n_ranks, sizeof *load), wsum = 0;
    for (int r = 0; r < n_ranks; r++) wsum += weights ? weights[r] : 1;
    plan_order *ord = NULL;
    for (int l = 0; l < n_layers; l++) {
        int ne = n_experts[l];
        if (!ne) continue;
        ord = xrealloc(ord, sizeof *ord * (size_t)ne);
        double total = 0;
        /* +1: every expert is read at least once, so a cold one still counts */
        for (int e = 0; e < ne; e++) total += ord[e].heat = (heat ? heat[p->base[l] + e] : 0) + 1, ord[e].e = e;
        qsort(ord, (size_t)ne, sizeof *ord, plan_order_cmp);
        memset(load, 0, sizeof *load * (size_t)n_ranks);
        for (int i = 0; i < ne; i++) {
            /* copies: enough that each carries at most a rank's fair share of the layer */
            int copies = (int)DF_MIN((double)n_ranks, DF_MAX(1.0, ord[i].heat / (total / n_ranks) + 0.999));
            uint64_t mask = 0;
            for (int c = 0; c < copies; c++) {
                int best = -1;
                for (int r = 0; r < n_ranks; r++) {
                    if ((mask >> r) & 1) continue;
                    double w = weights ? weights[r] : 1, bw = best >= 0 && weights ? weights[best] : 1;
                    if (best < 0 || (load[r] + ord[i].heat / copies) / w < (load[best] + ord[i].heat / copies) / bw)
                        best = r;
                }
                mask |= 1ull << best;
                load[best] += ord[i].heat / copies;
            }
            p->holders[p->base[l] + ord[i].e] = mask;
        }
    }
    (void)wsum;
    free(ord);
    free(load);
    plan_checksum(p);
}

void rank_plan_split_spine(rank_plan *p, const int64_t *layer_bytes, int64_t top_bytes) {
    int L = p->n_layers, N = p->n_ranks;
    free(p->spine_rank);
    p->spine_rank = xcalloc((size_t)L + 1, sizeof *p->spine_rank);
    int64_t total = top_bytes;
    for (int l = 0; l < L; l++) total += layer_bytes[l];
    /* Contiguous runs: a layer goes to the rank whose 1/N of the bytes holds its midpoint, rank 0's share
     * starting with its top-level tensors, so the shares differ by at most about one layer. */
    int64_t acc = top_bytes;
    for (int l = 0; l < L; l++) {
        double mid = (double)acc + 0.5 * (double)layer_bytes[l];
        int r = total > 0 ? (int)(mid * N / (double)total) : 0;
        p->spine_rank[l] = (int16_t)DF_MIN(r, N - 1);
        acc += layer_bytes[l];
    }
    plan_checksum(p);
}

void rank_plan_spine_layers(const rank_plan *p, int r, int *first, int *count) {
    *first = *count = 0;
    for (int l = 0; p->spine_rank && l < p->n_layers; l++)
        if (p->spine_rank[l] == r && !(*count)++) *first = l;
}

int rank_plan_write(const rank_plan *p, const char *dir, const char *const *folders, df_error *err) {
    size_t cap = 64 + (size_t)p->n_ranks * 1100 + (size_t)p->base[p->n_layers] * 17 + (size_t)p->n_layers * 24, at = 0;
    char *text = xmalloc(cap);
    at += (size_t)snprintf(text + at, cap - at, PLAN_MAGIC "\nranks %d\n", p->n_ranks);
    for (int r = 0; r < p->n_ranks; r++) {
        if (strlen(folders[r]) > 1000 || strpbrk(folders[r], " \n")) {
            free(text);
            return df_error_set(err, DF_EINVAL, "folder '%s': paths with spaces are not supported", folders[r]),
                   DF_EINVAL;
        }
        at += (size_t)snprintf(text + at, cap - at, "folder %d %s\n", r, folders[r]);
    }
    for (int l = 0; l < p->n_layers; l++) {
        at += (size_t)snprintf(text + at, cap - at, "layer %d", l);
        for (int64_t k = p->base[l]; k < p->base[l + 1]; k++)
            at += (size_t)snprintf(text + at, cap - at, " %llx", (unsigned long long)p->holders[k]);
        at += (size_t)snprintf(text + at, cap - at, "\n");
    }
    at += (size_t)snprintf(text + at, cap - at, "end\n");
    char *meta = df_path_join(dir, ".deltafin"), *path = df_path_join(dir, RANK_PLAN_FILE);
    int rc = df_mkdir_p(meta, err);
    if (!rc) rc = dc_write_atomic(path, 0, text, at, err);
    free(meta);
    free(path);
    free(text);
    return rc;
}

void rank_plan_assign(const rank_plan *p, int layer, const int *uniq, const int *rows, int n, unsigned turn,
                      int *rank) {
    int64_t load[RANK_PLAN_MAX] = {0};
    for (int u = 0; u < n; u++) {
        uint64_t h = p->holders[p->base[layer] + uniq[u]];
        int best = -1, tied[RANK_PLAN_MAX], n_tied = 0;
        for (int r = 0; r < p->n_ranks; r++)
            if (((h >> r) & 1) && (best < 0 || load[r] < load[best])) best = r;
        for (int r = 0; best >= 0 && r < p->n_ranks; r++)
            if (((h >> r) & 1) && load[r] == load[best]) tied[n_tied++] = r;
        if (n_tied > 1) best = tied[turn % (unsigned)n_tied];
        rank[u] = best < 0 ? 0 : best;
        load[rank[u]] += rows[u];
    }
}
