/* test_tiles.c — big spine pieces streamed through the spine's two buffers give logits bit-identical to the
 * spine in memory: lm_head in row tiles (the bundled model, decode rows and a prefill with every row, and a K3
 * fixture, with tile sizes that do and do not divide the vocabulary), and layers read in parts of a few tensors
 * (asked for, or chosen by the planner for a budget too small for two whole layers or where parts leave less
 * to read) on K3, Kimi-Linear with MLA and the bundled model, with a 1-slot expert cache and a prompt longer
 * than one pass of parts; a part that cannot be read after a KDA mixer has begun updating its states resets the
 * session instead of keeping it. The profile counts the output head apart. */
#include <string.h>
#include <unistd.h>

#include "engine_fixture.h"
#include "format/safetensors.h"
#include "format/st_write.h"
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

/* The profile's phases add up to its total, and lm_head's share is the output head's alone: a pass that asks
 * for no logits adds none, one that does adds some (resident, and in row tiles). */
static void profile_head(int64_t tile_rows) {
    df_engine_opts o;
    ef_opts(&o, "models/default", NULL);
    o.head_tile_rows = tile_rows;
    df_engine *eng = NULL;
    df_session *s = NULL;
    df_error err = {0};
    int rc = df_engine_open(&eng, &o, &err);
    if (!rc) rc = df_session_init(&s, eng, &err);
    float *lg = rc ? NULL : xmalloc(sizeof *lg * (size_t)df_engine_info(eng)->vocab_size);
    df_profile p0 = {0}, p1 = {0}, p2 = {0};
    if (!rc) rc = df_session_eval(s, toks, 4, NULL, 0, &err);
    if (!rc) df_engine_profile(eng, &p0);
    if (!rc) rc = df_session_eval(s, toks + 4, 1, lg, 0, &err);
    if (!rc) df_engine_profile(eng, &p1);
    if (!rc) rc = df_session_eval(s, toks + 5, 3, NULL, 0, &err);
    if (!rc) df_engine_profile(eng, &p2);
    double parts = p2.spine_read + p2.expert_read + p2.attention + p2.expert_compute + p2.spine_compute + p2.lm_head;
    CHECK(!rc && p0.lm_head == 0 && p1.lm_head > 0 && p2.lm_head == p1.lm_head && p2.total > p1.total &&
              p2.spine_compute >= 0 && fabs(parts - p2.total) <= 1e-9 * p2.total,
          "profile (lm_head %s): lm_head %.3g ms only in the pass with logits (%.3g, %.3g, %.3g); phases sum to "
          "the total, %.6f = %.6f s (%s)", tile_rows ? "in tiles" : "resident", p1.lm_head * 1e3, p0.lm_head * 1e3,
          p1.lm_head * 1e3, p2.lm_head * 1e3, parts, p2.total, rc ? err.msg : "ok");
    free(lg);
    df_session_free(s);
    df_engine_free(eng);
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

/* dir: src's config.json (linked) and a model.safetensors of src's tensors with `last` moved to the end of the
 * file; the file offset of that tensor's bytes, or 0 on failure. */
static uint64_t write_with_last(const char *dir, const char *src, const char *last) {
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    st_file f;
    df_error err = {0};
    if (ef_link_model(dir, src) || st_file_open(&f, path, &err)) return 0;
    st_write_tensor *ts = xcalloc((size_t)f.n_tensors, sizeof *ts);
    const void **data = xcalloc((size_t)f.n_tensors, sizeof *data);
    int n = 0;
    for (int pass = 0; pass < 2; pass++)   /* the others, then `last` */
        for (int i = 0; i < f.n_tensors; i++) {
            const st_tensor *t = &f.tensors[i];
            if ((strcmp(t->name, last) == 0) != pass) continue;
            ts[n] = (st_write_tensor){t->name, t->dtype_name, t->ndim, {0}, t->end - t->begin};
            memcpy(ts[n].shape, t->shape, sizeof ts[n].shape);
            data[n++] = t->data;
        }
    uint64_t off = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);   /* the link to src's file, which must not be written through */
    st_file g;
    if (n && !strcmp(ts[n - 1].name, last) && !st_write_file(path, ts, data, n, NULL, 4096, &err) &&
        !st_file_open(&g, path, &err)) {
        off = st_tensor_offset(&g, st_file_find(&g, last));
        st_file_close(&g);
    }
    free(ts);
    free(data);
    st_file_close(&f);
    return off;
}

/* Layer 0 of k3-tiny is KDA: its output projection is read after the mixer has updated its conv and
 * recurrent states. With that tensor unreadable (the file cut before it after the first pass), the next token
 * fails, and the session must be reset rather than kept at a position its layer-0 state no longer matches. */
static void torn_mixer(void) {
    char dir[] = "/tmp/df-torn-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "torn: temp folder");
    const char *o_proj = "language_model.model.layers.0.self_attn.o_proj.weight";
    uint64_t off = write_with_last(dir, "tests/fixtures/k3-tiny", o_proj);
    CHECK(off > 0, "torn: k3-tiny rewritten with layer 0's o_proj last (at byte %llu)", (unsigned long long)off);
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.spine_part_bytes = 1;
    df_engine *eng = NULL;
    df_session *s = NULL;
    df_error err = {0};
    int rc = off ? df_engine_open(&eng, &o, &err) : -1;
    if (!rc) rc = df_session_init(&s, eng, &err);
    if (!rc) rc = df_session_eval(s, toks, 3, NULL, 0, &err);
    CHECK(!rc, "torn: 3 tokens evaluated with layers in parts (%s)", rc ? err.msg : "ok");
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = rc ? rc : truncate(path, (off_t)off);
    int64_t pos = -1;
    if (!rc) {
        rc = df_session_eval(s, toks + 3, 1, NULL, 0, &err);
        df_session_tokens(s, &pos);
    }
    CHECK(rc < 0 && pos == 0, "torn: a token whose layer-0 o_proj cannot be read fails (%s) and resets the session "
          "(position %lld)", err.msg, (long long)pos);
    df_session_free(s);
    df_engine_free(eng);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    compare("models/default", 1024, 0, 6);
    compare("models/default", 1000, 1, 7);   /* the last tile shorter; layers streamed as well */
    compare("tests/fixtures/k3-tiny", 7, 0, 74);   /* 512 rows */
    profile_head(0);
    profile_head(1024);

    compare_parts("tests/fixtures/k3-tiny", "a budget too small for two whole layers (64.6 MiB)", 0,
                  (uint64_t)(64.6 * (1 << 20)), 0, toks, N, 4);
    compare_parts("tests/fixtures/k3-tiny", "whole layers would fit, parts leave less to read (65.05 MiB)", 0,
                  (uint64_t)(65.05 * (1 << 20)), 0, toks, N, 4);
    compare_parts("tests/fixtures/k3-tiny", "one tensor a part, 1 expert slot", 1, 0, 1, toks, N, 4);
    compare_parts("tests/fixtures/kl-mxfp4", "one tensor a part (KDA and MLA layers)", 1, 0, 0, toks, N, 4);
    compare_parts("models/default", "parts of 1 MiB, 2 expert slots", 1 << 20, 0, 2, toks, N, 4);
    int32_t *lng = xmalloc(sizeof *lng * LONG);
    for (int i = 0; i < LONG; i++) lng[i] = (int32_t)((i * 7919 + 13) % 6000);
    compare_parts("models/default", "a 298-token prompt, more than one pass of parts", 1, 0, 0, lng, LONG, LONG - 2);
    free(lng);
    torn_mixer();
    TEST_EXIT();
}
