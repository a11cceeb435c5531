/* test_rank_plan.c — the rank plan of expert parallelism: built from a skewed (Zipf) heat, the busiest rank's
 * share of simulated expert computations stays within 1.15x the mean at 2, 4 and 8 ranks where dealing experts
 * e mod N does not; the hottest experts are replicated; the holder chosen for a replicated expert depends only on
 * the selection; the file round-trips and bad files are refused with a message naming the fault. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/util.h"
#include "dist/rank_plan.h"
#include "test.h"

#define L 4
#define E 160
#define KMAX 8

static uint64_t rng = 88172645463325252ull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Simulated decode tokens, each layer choosing k distinct experts drawn by popularity: with a plan, the busiest
 * rank's computations over the mean; without, the selection counts (what DIR/.deltafin/heat holds). */
static double simulate(const rank_plan *p, const double *pop, int k, int n_ranks, float *counts) {
    double load[RANK_PLAN_MAX] = {0};
    for (int t = 0; t < 3000; t++)
        for (int l = 0; l < L; l++) {
            int uniq[KMAX], rows[KMAX], rank[KMAX], n = 0;
            unsigned char taken[E] = {0};
            double total = 0;
            for (int e = 0; e < E; e++) total += pop[e];
            while (n < k) {
                double x = uniform() * total;
                int e = 0;
                while (e < E - 1 && (x -= pop[e]) > 0) e++;
                if (taken[e]) continue;
                taken[e] = 1;
                n++;
            }
            n = 0;
            for (int e = 0; e < E; e++)
                if (taken[e]) uniq[n] = e, rows[n++] = 1;
            if (counts) {
                for (int u = 0; u < n; u++) counts[l * E + uniq[u]]++;
                continue;
            }
            rank_plan_assign(p, l, uniq, rows, n, (unsigned)t, rank);
            for (int u = 0; u < n; u++) load[rank[u]]++;
        }
    if (counts) return 0;
    double mx = 0, sum = 0;
    for (int r = 0; r < n_ranks; r++) mx = fmax(mx, load[r]), sum += load[r];
    return mx / (sum / n_ranks);
}

int main(void) {
    int ne[L];
    double pop[E];   /* Zipf popularity falling with the id: the worst case for dealing e mod N */
    for (int e = 0; e < E; e++) pop[e] = 1.0 / pow(e + 1, 1.1);
    for (int l = 0; l < L; l++) ne[l] = E;
    static float heat[L * E], heat2[L * E];
    simulate(NULL, pop, KMAX, 1, heat);
    simulate(NULL, pop, 2, 1, heat2);
    for (int n = 2; n <= 8; n *= 2) {
        rank_plan p, mod, p2;
        rank_plan_build(&p, n, NULL, L, ne, heat);
        char dir[] = "/tmp/df_rplan_XXXXXX";
        CHECK(mkdtemp(dir) != NULL, "temp dir");
        rank_plan_load(&mod, dir, L, ne, n, &(df_error){0});   /* no file: e mod N */
        double f = simulate(&p, pop, KMAX, n, NULL), fm = simulate(&mod, pop, KMAX, n, NULL);
        CHECK(f <= 1.15, "%d ranks, top-%d: busiest rank computes %.3fx the mean by the heat plan (<= 1.15)", n, KMAX, f);
        CHECK(fm > f, "%d ranks, top-%d: dealing e mod N gives %.3fx", n, KMAX, fm);
        /* top-2: the hottest expert alone is more than a rank's share, so it is replicated */
        rank_plan_build(&p2, n, NULL, L, ne, heat2);
        double f2 = simulate(&p2, pop, 2, n, NULL);
        int replicas = __builtin_popcountll(p2.holders[0]);
        CHECK(f2 <= 1.15 && (n < 8 || replicas >= 2), "%d ranks, top-2: busiest %.3fx the mean, the hottest expert "
              "held by %d ranks", n, f2, replicas);
        rank_plan_free(&p2);
        int hottest = 0;
        int uniq[3] = {hottest, hottest == 0 ? 1 : 0, hottest == 2 ? 3 : 2}, rows[3] = {5, 1, 2}, a[3], b[3];
        rank_plan_assign(&p, 0, uniq, rows, 3, 7, a);
        rank_plan_assign(&p, 0, uniq, rows, 3, 7, b);
        CHECK(!memcmp(a, b, sizeof a) && rank_plan_holds(&p, a[0], 0, hottest), "%d ranks: assignment repeatable, "
              "by a holder", n);
        const char *folders[8] = {"/f0", "/f1", "/f2", "/f3", "/f4", "/f5", "/f6", "/f7"};
        df_error err = {0};
        rank_plan q;
        int rc = rank_plan_write(&p, dir, folders, &err);
        if (!rc) rc = rank_plan_load(&q, dir, L, ne, n, &err);
        CHECK(!rc && q.checksum == p.checksum && !memcmp(q.holders, p.holders, sizeof *p.holders * L * E) &&
              !strcmp(q.folders[n - 1], folders[n - 1]), "%d ranks: the plan file round-trips (%s)", n, err.msg);
        if (!rc) rank_plan_free(&q);
        err = (df_error){0};
        rc = rank_plan_load(&q, dir, L, ne, n + 1, &err);
        CHECK(rc && strstr(err.msg, "the plan is for"), "%d ranks: another rank count refused: %s", n, err.msg);
        char path[256], cmd[600];
        snprintf(path, sizeof path, "%s/" RANK_PLAN_FILE, dir);
        snprintf(cmd, sizeof cmd, "sed -i 's/^layer 2 [0-9a-f]*/layer 2 0/' %s", path);
        err = (df_error){0};
        rc = system(cmd) ? -1 : rank_plan_load(&q, dir, L, ne, n, &err);
        CHECK(rc && strstr(err.msg, "layer 2: expert 0 has no valid holder"), "%d ranks: a holderless expert "
              "refused: %s", n, err.msg);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
        /* the spine by layers: contiguous runs, rank 0's counting the top-level tensors, shares within a layer */
        int ne8[8] = {E, E, E, E, E, E, E, E};
        int64_t lb[8] = {300, 100, 100, 100, 100, 100, 100, 100}, share[8] = {0};
        rank_plan sp;
        rank_plan_build(&sp, n, NULL, 8, ne8, NULL);
        uint64_t before = sp.checksum;
        rank_plan_split_spine(&sp, lb, 200);
        int contiguous = 1;
        int64_t worst = 0;
        for (int l = 1; l < 8; l++) contiguous &= sp.spine_rank[l] >= sp.spine_rank[l - 1];
        share[0] = 200;
        for (int l = 0; l < 8; l++) share[sp.spine_rank[l]] += lb[l];
        for (int r = 0; r < n; r++) worst = DF_MAX(worst, llabs(share[r] - 1200 / n));
        CHECK(contiguous && worst <= 300 && sp.checksum != before && sp.spine_rank[7] == n - 1,
              "%d ranks: spine split by layers contiguously, shares within %lld bytes of 1/N (a layer is 100-300)",
              n, (long long)worst);
        rank_plan_free(&sp);
        rank_plan_free(&p);
        rank_plan_free(&mod);
    }
    TEST_EXIT();
}
