/* test_tiles.c — big spine pieces streamed through the spine's two buffers give logits bit-identical to the
 * spine in memory: lm_head in row tiles (the bundled model, decode rows and a prefill with every row, and a K3
 * fixture, with tile sizes that do and do not divide the vocabulary), and layers read in parts of a few tensors
 * (asked for, or chosen by the planner for a budget too small for two whole layers) on K3, Kimi-Linear with
 * MLA and the bundled model, with a 1-slot expert cache and a prompt longer than one pass of parts. */
#include <string.h>

#include "engine_fixture.h"
#include "test.h"

enum { N = 10, LONG = 300 };

/* Logits of a prefill of np tokens (every row) then n - np decode tokens; caller frees. */
static float *logits(const df_engine_opts *o, const int32_t *toks, int n, int np, int *V, df_stats *st,
                     df_error *err) {
    return ef_logits(o, toks, np, 0, toks + np, n - np, V, st, err);
}

static const int32_t toks[N] = {1, 12, 40, 77, 15, 9, 30, 45, 61, 2};

static void compare(const char *dir, int64_t tile_rows, int stream, int want_tiles) {
    int V = 0;
    df_stats s0, s1;
    df_error err = {0};
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    float *ref = logits(&o, toks, N, 4, &V, &s0, &err);
    o.head_tile_rows = tile_rows;
    o.spine_stream = stream;
    float *tiled = ref ? logits(&o, toks, N, 4, &V, &s1, &err) : NULL;
    CHECK(tiled && !memcmp(ref, tiled, (size_t)N * (size_t)V * sizeof(float)) && s0.head_tiles == 0 &&
              s1.head_tiles == want_tiles,
          "%s: lm_head in %d tiles of %lld rows%s: logits bit-identical to resident (%s)", dir,
          tiled ? s1.head_tiles : 0, (long long)tile_rows, stream ? ", layers streamed too" : "",
          tiled ? "compared" : err.msg);
    free(ref);
    free(tiled);
}

/* Layers in parts: of at most part_bytes each (1: one tensor each), or with part_bytes 0 as the planner cuts
 * them for mem bytes of budget; against the spine in memory. n tokens, np of them prefill. */
static void compare_parts(const char *dir, const char *label, int64_t part_bytes, uint64_t mem, int slots,
                          const int32_t *t, int n, int np) {
    int V = 0;
    df_stats s0, s1;
    df_error err = {0};
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    float *ref = logits(&o, t, n, np, &V, &s0, &err);
    o.spine_part_bytes = part_bytes;
    o.mem_budget = mem;
    o.cache_slots = slots;
    float *got = ref ? logits(&o, t, n, np, &V, &s1, &err) : NULL;
    int same = got && !memcmp(ref, got, (size_t)n * (size_t)V * sizeof(float));
    CHECK(same && s0.split_layers == 0 && s1.split_layers > 0 && s1.split_layers <= s1.streamed_layers,
          "%s: %s: %d of %d streamed layers read in parts, logits bit-identical to the spine in memory (%s)", dir,
          label, got ? s1.split_layers : 0, got ? s1.streamed_layers : 0, got ? (same ? "same" : "differ") : err.msg);
    free(ref);
    free(got);
}

int main(void) {
    compare("models/default", 1024, 0, 6);
    compare("models/default", 1000, 1, 7);   /* the last tile shorter; layers streamed as well */
    compare("tests/fixtures/k3-tiny", 7, 0, 74);   /* 512 rows */

    compare_parts("tests/fixtures/k3-tiny", "a budget too small for two whole layers (64.6 MiB)", 0,
                  (uint64_t)(64.6 * (1 << 20)), 0, toks, N, 4);
    compare_parts("tests/fixtures/k3-tiny", "one tensor a part, 1 expert slot", 1, 0, 1, toks, N, 4);
    compare_parts("tests/fixtures/kl-mxfp4", "one tensor a part (KDA and MLA layers)", 1, 0, 0, toks, N, 4);
    compare_parts("models/default", "parts of 1 MiB, 2 expert slots", 1 << 20, 0, 2, toks, N, 4);
    int32_t *lng = xmalloc(sizeof *lng * LONG);
    for (int i = 0; i < LONG; i++) lng[i] = (int32_t)((i * 7919 + 13) % 6000);
    compare_parts("models/default", "a 298-token prompt, more than one pass of parts", 1, 0, 0, lng, LONG, LONG - 2);
    free(lng);
    TEST_EXIT();
}
