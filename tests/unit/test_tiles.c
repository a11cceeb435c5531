/* test_tiles.c — lm_head streamed in row tiles through the spine's buffers gives logits bit-identical to the
 * resident lm_head: the bundled model (decode rows and a prefill with every row) and a K3 fixture, with tile
 * sizes that do and do not divide the vocabulary. */
#include <string.h>

#include "common/util.h"
#include "test.h"

enum { N = 10 };

/* Logits of a prefill of 4 tokens (every row) then 6 decode tokens; caller frees. */
static float *logits(const char *dir, int64_t tile_rows, int stream, int *V, df_stats *st, df_error *err) {
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.model_dir = dir;
    o.n_threads = 2;
    o.head_tile_rows = tile_rows;
    o.spine_stream = stream;
    df_engine *eng = NULL;
    df_session *s = NULL;
    int rc = df_engine_open(&eng, &o, err);
    if (!rc) rc = df_session_init(&s, eng, err);
    float *out = NULL;
    if (!rc) {
        *V = df_engine_info(eng)->vocab_size;
        int32_t toks[N] = {1, 12, 40, 77, 15, 9, 30, 45, 61, 2};
        out = xmalloc((size_t)N * (size_t)*V * sizeof(float));
        rc = df_session_eval(s, toks, 4, out, 1, err);
        for (int i = 4; !rc && i < N; i++) rc = df_session_eval(s, &toks[i], 1, out + (size_t)i * *V, 0, err);
        df_engine_stats(eng, st);
    }
    df_session_free(s);
    df_engine_free(eng);
    if (rc) free(out), out = NULL;
    return out;
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
