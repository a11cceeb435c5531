/* cmd_place.c — `deltafin place -m DIR --to A,B[,...] [--weights 2,1]`: copies the routed experts into folders
 * on other devices (place.h), each getting a share of the expected reads proportional to its weight (hot experts
 * by saved heat spread first), so that decoding reads from all devices at once. Resumes an interrupted run. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "cli_opts.h"
#include "common/util.h"
#include "dist/rank_plan.h"
#include "install/dcache.h"
#include "residency/expert_index.h"
#include "residency/heat.h"
#include "residency/place.h"

#define PLACE_MAX_FOLDERS 64
#define PLACE_PROBE_BYTES (256u << 20)
#define PLACE_PROBE_BLOCK (8u << 20)

/* Read bandwidth of the device under folder, in MB/s: writes a probe file, reads it back with O_DIRECT (past
 * the page cache, as the engine reads experts), removes it. 0 with a message when it cannot be measured. */
static double place_probe(const char *folder) {
    char *path = df_path_join(folder, ".deltafin-probe");
    void *buf = NULL;
    double mbps = 0;
    int fd = -1;
    if (posix_memalign(&buf, 4096, PLACE_PROBE_BLOCK)) buf = NULL;
    if (buf) fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        memset(buf, 0x5a, PLACE_PROBE_BLOCK);
        int ok = 1;
        for (uint64_t at = 0; ok && at < PLACE_PROBE_BYTES; at += PLACE_PROBE_BLOCK)
            ok = pwrite(fd, buf, PLACE_PROBE_BLOCK, (off_t)at) == (ssize_t)PLACE_PROBE_BLOCK;
        ok = ok && !fsync(fd);
        close(fd);
        fd = ok ? open(path, O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
        if (ok && fd < 0 && errno == EINVAL) fd = open(path, O_RDONLY | O_CLOEXEC);   /* no O_DIRECT here */
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            double t0 = df_now();
            for (uint64_t at = 0; ok && at < PLACE_PROBE_BYTES; at += PLACE_PROBE_BLOCK)
                ok = pread(fd, buf, PLACE_PROBE_BLOCK, (off_t)at) == (ssize_t)PLACE_PROBE_BLOCK;
            double s = df_now() - t0;
            if (ok && s > 0) mbps = PLACE_PROBE_BYTES / s / 1e6;
            close(fd);
        }
    }
    if (mbps <= 0) fprintf(stderr, "deltafin place: %s: could not measure its read bandwidth (%s)\n", folder,
                           strerror(errno));
    unlink(path);
    free(path);
    free(buf);
    return mbps;
}

/* `--ranks N`: a rank plan by heat (rank_plan.h) and each rank's experts, replicas included, copied into its own
 * folder, which gets its own placement (FOLDER/.deltafin/placement); placed anew each time. */
static int place_ranks(const char *dir, int n, char *const *abs, const double *weights, int L, const int *ne,
                       const place_src *const *src, const float *hv, df_error *err) {
    rank_plan p;
    rank_plan_build(&p, n, weights, L, ne, hv);
    int rc = DF_OK;
    place_src **mine = xcalloc((size_t)L + 1, sizeof *mine);
    for (int l = 0; l < L; l++) mine[l] = xcalloc((size_t)ne[l] + 1, sizeof *mine[l]);
    for (int r = 0; !rc && r < n; r++) {
        char *meta = df_path_join(abs[r], PLACE_FILE), *data = df_path_join(abs[r], PLACE_DATA);
        unlink(meta);
        unlink(data);
        free(meta);
        free(data);
        for (int l = 0; l < L; l++)
            for (int e = 0; e < ne[l]; e++) {
                mine[l][e] = src[l][e];
                if (!rank_plan_holds(&p, r, l, e)) mine[l][e].length = 0;
            }
        int64_t placed = 0;
        double one = 1;
        const char *f = abs[r];
        rc = placement_write(abs[r], 1, &f, &one, L, ne, (const place_src *const *)mine, hv, 0, &placed, err);
        double share = 0, total = 0;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < ne[l]; e++) {
                double h = (hv ? hv[p.base[l] + e] : 0) + 1;
                uint64_t m = p.holders[p.base[l] + e];
                total += h;
                if ((m >> r) & 1) share += h / __builtin_popcountll(m);
            }
        if (!rc) printf("rank %d: %s: %lld experts, %.1f %% of the expected reads\n", r, abs[r], (long long)placed,
                        100 * share / (total > 0 ? total : 1));
    }
    if (!rc) rc = rank_plan_write(&p, dir, (const char *const *)abs, err);
    for (int l = 0; l < L; l++) free(mine[l]);
    free(mine);
    rank_plan_free(&p);
    return rc;
}

int cmd_place(int argc, char **argv) {
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"to", 1, 0, 't'}, {"weights", 1, 0, 'w'},
                                       {"ranks", 1, 0, 'r'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *dir = NULL, *to = NULL, *wt = NULL;
    int c;
    long ranks = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:w:h", lo, NULL)) != -1) {
        if (c == 'm') dir = optarg;
        else if (c == 't') to = optarg;
        else if (c == 'w') wt = optarg;
        else if (c == 'r') {
            if (cli_parse_int("--ranks", optarg, 1, RANK_PLAN_MAX, &ranks) < 0) return 2;
        } else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: deltafin place -m DIR --to A,B[,...] [--weights W1,W2,...|auto]\n"
                    "  copies the routed experts into A/" PLACE_DATA ", B/..., each folder getting a share of the\n"
                    "  expected reads proportional to its weight (default equal; auto: each device's O_DIRECT read\n"
                    "  bandwidth, measured on a 256 MiB probe file)\n"
                    "usage: deltafin place -m DIR --ranks N --to F0,...,F(N-1) [--weights ...]\n"
                    "  expert parallelism (mpirun -np N): a rank plan by saved heat in DIR/.deltafin/ranks, the\n"
                    "  hottest experts replicated; rank r's experts copied into Fr (its own disk), placed anew\n");
            return c == 'h' ? 0 : 2;
        }
    }
    char defm[4096];
    if (!dir) dir = cli_default_model(defm, sizeof defm);
    if (!to) {
        fprintf(stderr, "deltafin place: --to A,B: the folders to place the experts in\n");
        return 2;
    }
    char *list = xstrdup(to), *abs[PLACE_MAX_FOLDERS];
    double weights[PLACE_MAX_FOLDERS];
    int n = 0, rc = 0;
    df_error err = {0};
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        char real[PATH_MAX];
        if (n == PLACE_MAX_FOLDERS || df_mkdir_p(tok, &err) || !realpath(tok, real)) {
            fprintf(stderr, "deltafin place: folder %s: %s\n", tok, err.msg[0] ? err.msg : "cannot be used");
            rc = 1;
            break;
        }
        abs[n] = xstrdup(real);
        weights[n++] = 1;
    }
    free(list);
    if (!rc && ranks && n != ranks) {
        fprintf(stderr, "deltafin place: --ranks %ld needs %ld folders in --to, one per rank; got %d\n", ranks, ranks, n);
        rc = 2;
    }
    if (!rc && wt && !strcmp(wt, "auto")) {
        for (int f = 0; f < n && !rc; f++) {
            weights[f] = place_probe(abs[f]);
            if (weights[f] <= 0) rc = 1;
            else fprintf(stderr, "deltafin place: %s reads at %.0f MB/s\n", abs[f], weights[f]);
        }
    } else if (!rc && wt) {
        char *w = xstrdup(wt), *end;
        int k = 0;
        for (char *save = NULL, *tok = strtok_r(w, ",", &save); tok; tok = strtok_r(NULL, ",", &save), k++) {
            double v = strtod(tok, &end);
            if (k >= n || *end || !(v > 0)) k = n + 1;
            else weights[k] = v;
        }
        if (k != n) {
            fprintf(stderr, "deltafin place: --weights: expected %d positive numbers, one per folder\n", n);
            rc = 2;
        }
        free(w);
    }
    df_store *st = NULL;
    store_opts so = {.mem_budget = 1ull << 40, .cache_slots = 1, .spine_stream = 0};
    if (!rc && store_open_ex(&st, dir, &so, &err)) {
        fprintf(stderr, "deltafin place: %s\n", err.msg);
        rc = 1;
    }
    if (!rc) {
        int L = store_layer_count(st), *ne = xmalloc(sizeof *ne * (size_t)(L + 1));
        place_src **src = xcalloc((size_t)L + 1, sizeof *src);
        int64_t total = 0;
        for (int l = 0; l < L; l++) {
            ne[l] = store_expert_count(st, l);
            src[l] = xcalloc((size_t)ne[l] + 1, sizeof *src[l]);
            for (int e = 0; e < ne[l]; e++) {
                const store_expert_loc *loc = store_expert_locate(st, l, e);
                if (loc->contiguous) src[l][e] = (place_src){loc->path, loc->offset, loc->length};
                total++;
            }
        }
        char note[512];
        heat *h = heat_load(dir, L, ne, note, sizeof note);
        float *hv = xcalloc((size_t)total + 1, sizeof *hv);
        int *hl = xmalloc(sizeof *hl * (size_t)(total + 1)), *he = xmalloc(sizeof *he * (size_t)(total + 1));
        float *hw = xmalloc(sizeof *hw * (size_t)(total + 1));
        int64_t *base = xcalloc((size_t)L + 1, sizeof *base);
        for (int l = 0; l < L; l++) base[l + 1] = base[l] + ne[l];
        int nh = heat_top(h, (int)total, hl, he, hw);
        for (int i = 0; i < nh; i++) hv[base[hl[i]] + he[i]] = hw[i];
        int64_t placed = 0;
        double t0 = df_now();
        if (ranks) rc = place_ranks(dir, n, abs, weights, L, ne, (const place_src *const *)src, nh ? hv : NULL, &err);
        else rc = placement_write(dir, n, (const char *const *)abs, weights, L, ne, (const place_src *const *)src,
                                  nh ? hv : NULL, 1, &placed, &err);
        if (rc) fprintf(stderr, "deltafin place: %s\n", err.msg);
        else if (ranks) printf("%s: rank plan for %ld ranks written to %s/.deltafin/ranks%s\n", dir, ranks, dir,
                               nh ? " (by saved heat)" : "");
        else printf("%s: %lld of %lld routed experts placed over %d folders in %.1f s%s\n", dir, (long long)placed,
                    (long long)total, n, df_now() - t0, nh ? " (spread by saved heat)" : "");
        rc = rc ? 1 : 0;
        heat_free(h);
        free(hv), free(hl), free(he), free(hw), free(base);
        for (int l = 0; l < L; l++) free(src[l]);
        free(src);
        free(ne);
        store_free(st);
    }
    for (int i = 0; i < n; i++) free(abs[i]);
    return rc;
}
