/* test_heat.c — per-expert heat across runs: values survive a save and load; a writer killed at random moments
 * never leaves a torn file (the old or the new table is read, whole); corrupt, truncated or foreign files are
 * ignored with a note; and on the bundled model, heat saved by one engine warms the next one's cache in the
 * background without changing a single logit. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine_fixture.h"
#include "st_fixture.h"
#include "residency/heat.h"
#include "test.h"

enum { HL = 3 };
static const int hne[HL] = {0, 5, 7};

static char tmp[] = "/tmp/deltafin-test-heat-XXXXXX";

static char *heat_path(void) { return df_path_join(tmp, HEAT_FILE); }

static void test_roundtrip(void) {
    char note[512];
    heat *h = heat_load(tmp, HL, hne, note, sizeof note);
    int top_l[12], top_e[12];
    float top_w[12];
    CHECK(note[0] == 0 && heat_top(h, 12, top_l, top_e, top_w) == 0, "no file: empty heat, no note");
    int a[3] = {4, 1, 4}, b[2] = {6, 6};
    heat_add(h, 1, a, 2);
    heat_add(h, 1, a + 2, 1);
    heat_add(h, 2, b, 2);
    heat_add(h, 2, b, 1);
    df_error err = {0};
    CHECK(heat_save(h, tmp, &err) == DF_OK, "saved: %s", err.msg);
    heat_free(h);
    h = heat_load(tmp, HL, hne, note, sizeof note);
    int n = heat_top(h, 12, top_l, top_e, top_w);
    /* layer 2 expert 6: 3 requests, layer 1 expert 4: 2, layer 1 expert 1: 1; the load decays them by 0.75 */
    CHECK(note[0] == 0 && n == 3 && top_l[0] == 2 && top_e[0] == 6 && top_l[1] == 1 && top_e[1] == 4 &&
              top_e[2] == 1 && fabsf(top_w[0] - 2.25f) < 1e-6f && fabsf(top_w[2] - 0.75f) < 1e-6f,
          "reloaded hottest first with decayed heat (%d experts, top %d/%d at %.2f)", n, n ? top_l[0] : -1,
          n ? top_e[0] : -1, n ? top_w[0] : 0.0);
    char line[256];
    heat_summary(h, line, sizeof line);
    CHECK(strstr(line, "over 3 of 12 experts") != NULL, "summary: %s", line);
    char *path = heat_path();
    size_t n0 = 0, n1 = 0;
    char *before = df_read_file(path, &n0, &err);
    CHECK(heat_save(h, tmp, &err) == DF_OK, "a run that asked for nothing saves nothing");
    char *after = df_read_file(path, &n1, &err);
    CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "heat of a run without requests not decayed");
    free(before);
    free(after);
    free(path);
    heat_free(h);
}

/* A child saves tables whose entries are all equal (and grow with every save); the parent kills it at random
 * moments and checks that what is on disk is always one whole table. */
static void test_kill(void) {
    int rounds = 0, whole = 0;
    unsigned seed = (unsigned)time(NULL);
    char *path = heat_path();
    unlink(path);   /* every table the children write is then uniform */
    free(path);
    for (int r = 0; r < 25; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            char note[512];
            heat *h = heat_load(tmp, HL, hne, note, sizeof note);
            int all1[5] = {0, 1, 2, 3, 4}, all2[7] = {0, 1, 2, 3, 4, 5, 6};
            for (;;) {
                heat_add(h, 1, all1, 5);
                heat_add(h, 2, all2, 7);
                heat_save(h, tmp, &(df_error){0});
            }
        }
        usleep(1000 + rand_r(&seed) % 20000);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        char note[512];
        heat *h = heat_load(tmp, HL, hne, note, sizeof note);
        int l[12], e[12];
        float w[12];
        int n = heat_top(h, 12, l, e, w), same = n == 12 || n == 0;   /* 0: killed before its first save */
        for (int i = 1; i < n; i++) same &= w[i] == w[0];
        whole += note[0] == 0 && same;
        rounds++;
        heat_free(h);
    }
    CHECK(whole == rounds, "killed writer: %d of %d files read back whole and valid", whole, rounds);
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static int truncate_new(const char *path, off_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = ftruncate(fileno(f), size);
    fclose(f);
    return rc;
}

static void test_corrupt(void) {
    char *path = heat_path(), note[512];
    size_t len = 0;
    df_error err = {0};
    uint8_t *good = (uint8_t *)df_read_file(path, &len, &err);
    CHECK(good && len == 8 + 4 + 4 * HL + 4 * 12 + 8, "heat file is %zu bytes for 12 experts", len);
    if (!good) return;
    uint8_t *bad = xmalloc(len);
    static const struct {
        const char *what;
        int at;
        int cut;
    } cases[] = {{"checksum mismatch", 40, 0}, {"truncated", -1, 5}, {"not a heat file", 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memcpy(bad, good, len);
        if (cases[c].at >= 0) bad[cases[c].at] ^= 0x5A;
        write_bytes(path, bad, len - (size_t)cases[c].cut);
        heat *h = heat_load(tmp, HL, hne, note, sizeof note);
        int l[12], e[12];
        float w[12];
        CHECK(strstr(note, cases[c].what) && strstr(note, "ignored") && strstr(note, path) &&
                  heat_top(h, 12, l, e, w) == 0,
              "corrupt file ignored with a note: %s", note);
        heat_free(h);
    }
    /* not a file of the expected size: a FIFO (nobody writes: a plain read would block for good), a folder,
     * a device, and a file far larger than the shape allows */
    alarm(30);
    for (int k = 0; k < 4; k++) {
        unlink(path);
        rmdir(path);
        int made = k == 0 ? !mkfifo(path, 0644) : k == 1 ? !mkdir(path, 0755) : k == 2 ? !symlink("/dev/zero", path)
                                                                                     : !truncate_new(path, 1 << 30);
        heat *h = heat_load(tmp, HL, hne, note, sizeof note);
        int l[12], e[12];
        float w[12];
        CHECK(made && strstr(note, "ignored") && strstr(note, path) && heat_top(h, 12, l, e, w) == 0,
              "a %s as the heat file is ignored at once: %s", (const char *[]){"FIFO", "folder", "device",
              "1 GiB file"}[k], note);
        heat_free(h);
    }
    alarm(0);
    rmdir(path);
    unlink(path);
    write_bytes(path, good, len);
    int other[HL] = {0, 5, 8};
    heat *h = heat_load(tmp, HL, other, note, sizeof note);
    CHECK(strstr(note, "another model") != NULL, "another model's heat ignored: %s", note);
    heat_free(h);
    free(bad);
    free(good);
    free(path);
}

/* ---- the engine: saved heat warms the next open ------------------------------------------------------ */

static float *run_engine(const char *dir, int heat_mode, int slots, df_stats *st, df_error *err) {
    df_engine_opts o;
    ef_opts(&o, dir, NULL);
    o.heat = heat_mode;
    o.cache_slots = slots;
    df_engine *eng = NULL;
    df_session *s = NULL;
    int rc = df_engine_open(&eng, &o, err);
    if (!rc && heat_mode == DF_HEAT_ON) df_engine_warm_wait(eng);
    if (!rc) rc = df_session_init(&s, eng, err);
    float *out = NULL;
    enum { N = 12 };
    if (!rc) {
        int V = df_engine_info(eng)->vocab_size;
        out = xmalloc((size_t)N * V * sizeof(float));
        int32_t toks[N] = {5888, 12, 400, 77, 1500, 9, 3000, 45, 610, 2, 1200, 88};
        for (int i = 0; !rc && i < N; i++) rc = df_session_eval(s, &toks[i], 1, out + (size_t)i * V, 0, err);
        df_engine_stats(eng, st);
    }
    df_session_free(s);
    df_engine_free(eng);
    if (rc) free(out), out = NULL;
    return out;
}

static void test_engine(void) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/model", tmp);
    if (ef_link_model(dir, "models/default")) {
        CHECK(0, "could not make %s", dir);
        return;
    }
    df_stats s0, s1, s2;
    df_error err = {0};
    float *cold = run_engine(dir, DF_HEAT_OFF, 40, &s0, &err);
    float *first = cold ? run_engine(dir, DF_HEAT_ON, 40, &s1, &err) : NULL;   /* records heat, nothing to warm */
    float *warm = first ? run_engine(dir, DF_HEAT_ON, 40, &s2, &err) : NULL;
    size_t bytes = (size_t)12 * 6144 * sizeof(float);
    CHECK(warm && !memcmp(cold, first, bytes) && !memcmp(cold, warm, bytes),
          "engine: logits bit-identical without heat, recording heat, and warmed from it: %s", warm ? "yes" : err.msg);
    CHECK(warm && s1.warm_loads == 0 && s2.warm_loads == 40 && s2.expert_misses < s0.expert_misses,
          "engine: warming read 40 hottest experts in the background (%llu), fewer misses after (%llu vs %llu)",
          warm ? (unsigned long long)s2.warm_loads : 0ull, warm ? (unsigned long long)s2.expert_misses : 0ull,
          warm ? (unsigned long long)s0.expert_misses : 0ull);
    free(cold);
    free(first);
    free(warm);
}

int main(void) {
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        TEST_EXIT();
    }
    test_roundtrip();
    test_kill();
    test_corrupt();
    test_engine();
    fx_rmtree(tmp);
    TEST_EXIT();
}
