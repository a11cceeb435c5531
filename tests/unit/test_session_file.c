/* test_session_file.c — df_session_save / df_session_load: a saved and reloaded session continues with
 * bit-identical logits (every fixture: KDA, MLA, K3 block residuals) and holds the same tokens; damaged,
 * truncated, foreign and other-model files are refused with a clear message and leave the session as it
 * was; the write is atomic (no temporary file left, an existing file replaced whole). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "engine_fixture.h"

static df_engine *open_fixture(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    df_error err = {0};
    df_engine *eng = ef_open(dir, NULL, &err);
    if (!eng) printf("# %s: %s\n", name, err.msg);
    return eng;
}

static void make_ids(int32_t *ids, int n, int V) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(1 + ((i + 5) * 71) % (V - 1));
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) ? -1 : (long)sb.st_size;
}

/* Files beside path named after it (temp files: ".NAME.tmp-XXXXXX"), path itself and planted links aside. */
static int leftovers(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[512], base[256];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    snprintf(base, sizeof base, ".%s.tmp", slash + 1);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += !strncmp(de->d_name, base, strlen(base));
    if (d) closedir(d);
    return n;
}

/* Rewrites path with byte `at` flipped (at >= 0) or cut to `keep` bytes (keep >= 0). */
static void damage(const char *src, const char *dst, long at, long keep) {
    FILE *f = fopen(src, "rb");
    long n = file_size(src);
    uint8_t *b = xmalloc((size_t)n);
    if (!f || fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (f) fclose(f);
    if (at >= 0 && at < n) b[at] ^= 0x40;
    if (keep >= 0 && keep < n) n = keep;
    f = fopen(dst, "wb");
    if (f) {
        fwrite(b, 1, (size_t)n, f);
        fclose(f);
    }
    free(b);
}

static void round_trip(const char *name, const char *path) {
    df_engine *eng = open_fixture(name);
    if (!eng) {
        CHECK(0, "%s opens", name);
        return;
    }
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[24];
    make_ids(ids, 24, V);
    df_session *s = NULL, *t = NULL;
    df_session_init(&s, eng, &err);
    df_session_init(&t, eng, &err);
    float *ls = xmalloc((size_t)V * sizeof(float)), *lt = xmalloc((size_t)V * sizeof(float));
    int rc = df_session_eval(s, ids, 9, NULL, 0, &err);
    if (!rc) rc = df_session_eval(s, ids + 9, 4, ls, 0, &err);
    if (!rc) rc = df_session_save(s, path, &err);
    df_session_eval(t, ids + 3, 5, NULL, 0, &err);         /* t holds something else before the load */
    if (!rc) rc = df_session_load(t, path, &err);
    int64_t ns = 0, nt = 0;
    const int32_t *hs = df_session_tokens(s, &ns), *ht = df_session_tokens(t, &nt);
    CHECK(!rc && ns == 13 && nt == 13 && !memcmp(hs, ht, 13 * sizeof(int32_t)), "%s: loaded session holds the "
          "saved tokens (%s)", name, rc ? err.msg : "ok");

    int64_t reused = 0;
    rc = df_session_sync(t, ids, 13, lt, &reused, &err);
    CHECK(!rc && reused == 13 && !memcmp(ls, lt, (size_t)V * sizeof(float)),
          "%s: sync of the saved tokens answers the saved logits without evaluating", name);
    rc = df_session_eval(s, ids + 13, 3, ls, 0, &err);
    if (!rc) rc = df_session_eval(t, ids + 13, 3, lt, 0, &err);
    CHECK(!rc && !memcmp(ls, lt, (size_t)V * sizeof(float)), "%s: continuation after load bit-identical", name);
    df_session_free(s);
    df_session_free(t);
    free(ls);
    free(lt);
    df_engine_free(eng);
}

/* Loads that must fail; the session must keep its state. */
static void refusals(const char *path, const char *other_model) {
    df_engine *eng = open_fixture("kl-fp32");
    if (!eng) return;
    df_error err = {0};
    int V = df_engine_info(eng)->vocab_size;
    int32_t ids[24];
    make_ids(ids, 24, V);
    df_session *s = NULL, *probe = NULL;
    df_session_init(&s, eng, &err);
    df_session_init(&probe, eng, &err);
    df_session_eval(s, ids, 11, NULL, 0, &err);
    char tmpname[600], victim[600];   /* a symlink where a predictable temp name would be */
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%d", path, (int)getpid());
    snprintf(victim, sizeof victim, "%s.victim", path);
    FILE *vf = fopen(victim, "wb");
    if (vf) fputs("precious", vf), fclose(vf);
    int linked = !symlink(victim, tmpname);
    int rc = df_session_save(s, path, &err);
    CHECK(!rc && linked && file_size(path) > 0 && file_size(victim) == 8 && leftovers(path) == 0,
          "saved atomically through an exclusive temp file: no temporary file left, a planted symlink not followed");
    unlink(tmpname);
    unlink(victim);
    df_session_eval(probe, ids, 6, NULL, 0, &err);          /* the session the bad loads must not change */
    float *want = xmalloc((size_t)V * sizeof(float)), *got = xmalloc((size_t)V * sizeof(float));
    {
        df_session *ref = NULL;
        df_session_init(&ref, eng, &err);
        df_session_eval(ref, ids, 6, NULL, 0, &err);
        df_session_eval(ref, ids + 20, 1, want, 0, &err);
        df_session_free(ref);
    }
    char bad[600];
    snprintf(bad, sizeof bad, "%s.bad", path);
    long n = file_size(path);
    struct {
        long at, keep;
        int code;
        const char *what, *msg;
    } cases[] = {
        {n - 5, -1, DF_EFORMAT, "a flipped payload byte", "checksum"},
        {40, -1, DF_EFORMAT, "a flipped header byte (payload size)", "bad header"},
        {24, -1, DF_EFORMAT, "a flipped header byte (position)", "bad header"},
        {60, -1, DF_EFORMAT, "a flipped token byte", "checksum"},
        {-1, n - 100, DF_EFORMAT, "a truncated file", "truncated"},
        {-1, 20, DF_EFORMAT, "a file cut inside the header", "too short"},
        {2, -1, DF_EFORMAT, "a bad magic", "not a deltafin session file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        damage(path, bad, cases[i].at, cases[i].keep);
        err.msg[0] = 0;
        rc = df_session_load(probe, bad, &err);
        CHECK(rc == cases[i].code && strstr(err.msg, cases[i].msg) && df_session_pos(probe) == 6,
              "%s is refused, session unchanged: %s", cases[i].what, err.msg);
    }
    rc = df_session_load(probe, "/nonexistent/session", &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "/nonexistent/session"), "a missing file: %s", err.msg);

    df_engine *other = open_fixture(other_model);
    if (other) {
        df_session *o = NULL;
        df_session_init(&o, other, &err);
        df_session_eval(o, ids, 4, NULL, 0, &err);
        df_session_save(o, bad, &err);
        rc = df_session_load(probe, bad, &err);
        CHECK(rc == DF_EINVAL && strstr(err.msg, "another model") && df_session_pos(probe) == 6,
              "a state saved by another model (%s) is refused: %s", other_model, err.msg);
        df_session_free(o);
        df_engine_free(other);
    }
    rc = df_session_eval(probe, ids + 20, 1, got, 0, &err);
    CHECK(!rc && !memcmp(got, want, (size_t)V * sizeof(float)), "after the refused loads the session continues as "
          "if they never happened");
    unlink(bad);
    unlink(path);
    free(want);
    free(got);
    df_session_free(s);
    df_session_free(probe);
    df_engine_free(eng);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "/tmp/df_session_file_%d.state", (int)getpid());
    char names[EF_MAX_FIXTURES][256];
    int n = ef_list_fixtures("tests/fixtures", "config.json", names);
    CHECK(n >= 0, "tests/fixtures is readable");
    if (n < 0) TEST_EXIT();
    for (int i = 0; i < n; i++) round_trip(names[i], path);
    unlink(path);
    refusals(path, "kl-qlora-fp32");
    TEST_EXIT();
}
