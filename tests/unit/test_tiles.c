/* test_tiles.c — lm_head streamed in row tiles through the spine's buffers gives logits bit-identical to the
 * resident lm_head: the bundled model (decode rows and a prefill with every row) and a K3 fixture, with tile
 * sizes that do and do not divide the vocabulary. */
#include <string.h>

#include "engine_fixture.h"
#include "test.h"

enum { N = 10 };

/* Logits of a prefill of 4 tokens (every row) then 6 decode tokens; caller frees. */
static float *logits(const char *dir, int64_t tile_rows, int stream, int *V, df_stats *st, df_error *err) {
    static const int32_t toks[N] = {1, 12, 40, 77, 15, 9, 30, 45, 61, 2};
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.head_tile_rows = tile_rows;
    o.spine_stream = stream;
    return ef_logits(&o, toks, 4, 0, toks + 4, N - 4, V, st, err);
}

static void compare(const char *dir, int64_t tile_rows, int stream, int want_tiles) {
    int V = 0;
    df_stats s0, s1;
    df_error err = {0};
    float *ref = logits(dir, 0, 0, &V, &s0, &err);
    float *tiled = ref ? logits(dir, tile_rows, stream, &V, &s1, &err) : NULL;
    CHECK(tiled && !memcmp(ref, tiled, (size_t)N * (size_t)V * sizeof(float)) && s0.head_tiles == 0 &&
              s1.head_tiles == want_tiles,
          "%s: lm_head in %d tiles of %lld rows%s: logits bit-identical to resident (%s)", dir,
          tiled ? s1.head_tiles : 0, (long long)tile_rows, stream ? ", layers streamed too" : "",
          tiled ? "compared" : err.msg);
    free(ref);
    free(tiled);
}

int main(void) {
    compare("models/default", 1024, 0, 6);
    compare("models/default", 1000, 1, 7);   /* the last tile shorter; layers streamed as well */
    compare("tests/fixtures/k3-tiny", 7, 0, 74);   /* 512 rows */
    TEST_EXIT();
}
