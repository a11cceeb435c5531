/* test_prompt_cache.c — the server's prompt cache against a hostile folder: families of crafted .tok files
 * (counts that overflow a length check, sizes, magics, checksums), FIFOs, symlinks and devices under the
 * cache's names, symlinks planted where a writer's temp file would go, files of its naming with no entry
 * (counted against the cap and evicted), and entries saved by other weights or another spine (refused:
 * the cache is keyed by df_engine_fingerprint). A hang fails through alarm() instead of stalling the run. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "test.h"
#include "engine_fixture.h"
#include "format/int8_spine.h"
#include "server/prompt_cache.h"

static char root[128];

/* The cache's token hash, written independently of it: FNV-1a over the little-endian bytes. */
static uint64_t ref_hash(const int32_t *ids, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (uint8_t)((uint32_t)ids[i] >> (8 * b))) * 1099511628211ull;
    return h;
}

static void put_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n) fwrite(data, 1, n, f);
        fclose(f);
    }
}

static int copy_file(const char *from, const char *to) {
    size_t n = 0;
    df_error e = {0};
    char *b = df_read_file(from, &n, &e);
    if (!b) return -1;
    put_file(to, b, n);
    free(b);
    return 0;
}

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = df_path_join(dir, de->d_name);
        struct stat sb;
        if (!lstat(p, &sb) && S_ISDIR(sb.st_mode)) rm_tree(p);
        else unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Bytes of the regular files in dir whose names start with a hex digit or a dot (the cache's naming), and
 * how many files there are in all. */
static uint64_t own_bytes(const char *dir, int *files) {
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t sum = 0;
    *files = 0;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        (*files)++;
        char *p = df_path_join(dir, de->d_name);
        struct stat sb;
        if (!lstat(p, &sb) && S_ISREG(sb.st_mode) && strchr("0123456789abcdef.", de->d_name[0])) sum += sb.st_size;
        free(p);
    }
    if (d) closedir(d);
    return sum;
}

static char *entry_name(const char *dir, uint64_t h, int64_t n, const char *ext) {
    char name[128];
    snprintf(name, sizeof name, "%016llx-%lld.%s", (unsigned long long)h, (long long)n, ext);
    return df_path_join(dir, name);
}

/* A .tok: magic, then count, hash and (when key_too) key, then `body` bytes of tokens. */
static void put_tok(const char *path, uint32_t magic, uint64_t count, uint64_t hash, int key_too, uint64_t key,
                    const int32_t *ids, size_t body) {
    uint8_t *b = xcalloc(1, 28 + body);
    size_t at = 0;
    memcpy(b, &magic, 4), at += 4;
    memcpy(b + at, &count, 8), at += 8;
    memcpy(b + at, &hash, 8), at += 8;
    if (key_too) memcpy(b + at, &key, 8), at += 8;
    if (ids) memcpy(b + at, ids, body);
    put_file(path, b, at + body);
    free(b);
}

/* Crafted token files: counts near 2^62 that wrap count*4, counts that disagree with the name or the size,
 * old and new magics, a wrong checksum. Every one is dropped; none crashes the open. */
static void test_crafted_tok(void) {
    char *dir = df_path_join(root, "crafted");
    mkdir(dir, 0755);
    const int64_t names[] = {1, 3, 1 << 20, ((int64_t)1 << 62) + 1, ((int64_t)1 << 62) + 5, INT64_MAX,
                             ((int64_t)1 << 26) + 1, ((int64_t)1 << 61) + 7};
    const uint32_t magics[] = {0x54504644u /* the old "DFPT" */, 0x32504644u /* "DFP2" */};
    int made = 0;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (size_t a = 0; a < sizeof names / sizeof *names; a++)
        for (int m = 0; m < 2; m++)
            for (int v = 0; v < 4; v++) {
                int64_t n = names[a];
                uint64_t count = v == 0 ? (uint64_t)n : v == 1 ? (uint64_t)n + (1ull << 62) : v == 2 ? 0 : (uint64_t)n * 4;
                /* the body a count-times-4 check that wraps would accept: (n * 4) mod 2^64, if small */
                size_t body = (size_t)(((uint64_t)n * 4) % 64);
                uint64_t h = 0x1234567800000000ull + (uint64_t)made;
                char *tok = entry_name(dir, h, n, "tok"), *kv = entry_name(dir, h, n, "kv");
                put_tok(tok, magics[m], count, n <= 8 ? ref_hash(ids, n) : h, m, 42, ids, DF_MIN(body, sizeof ids));
                put_file(kv, "state", 5);
                free(tok);
                free(kv);
                made++;
            }
    /* a well-formed file of the right count whose tokens do not hash to its name */
    char *tok = entry_name(dir, 0xabcdefull, 2, "tok"), *kv = entry_name(dir, 0xabcdefull, 2, "kv");
    put_tok(tok, 0x32504644u, 2, 0xabcdefull, 1, 42, ids, 8);
    put_file(kv, "state", 5);
    free(tok);
    free(kv);
    prompt_cache *pc = NULL;
    df_error err = {0};
    int rc = pcache_open(&pc, dir, 42, 1 << 30, 1, &err);
    int entries = -1, enabled;
    uint64_t bytes;
    const char *why;
    if (!rc) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    CHECK(!rc && entries == 0, "%d crafted token files (wrapping counts, wrong sizes, magics, checksums) are all "
          "dropped at open without a crash (%d entries)", made + 1, entries);
    pcache_free(pc);
    rm_tree(dir);
    free(dir);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "not ok - the prompt cache blocked on a FIFO (alarm)\n";
    if (write(1, msg, sizeof msg - 1)) _exit(1);
    _exit(1);
}

/* FIFOs under every name the cache opens, and a FIFO swapped in for a saved entry's state. */
static void test_fifos(df_engine *eng) {
    char *dir = df_path_join(root, "fifo");
    mkdir(dir, 0755);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = 1 + i * 3;
    uint64_t h = ref_hash(ids, 20);
    char *tok = entry_name(dir, h, 20, "tok"), *kv = entry_name(dir, h, 20, "kv");
    char *tok2 = entry_name(dir, h + 1, 5, "tok"), *kv2 = entry_name(dir, h + 1, 5, "kv");
    char *tmp1 = df_path_join(dir, ".00000000000000aa-3.tok.tmp-abcdef");
    char *tmp2 = df_path_join(dir, "00000000000000aa-3.tok.77.tmp");
    put_file(kv2, "state", 5);
    int fifos = !mkfifo(tok2, 0644) + !mkfifo(tmp1, 0644) + !mkfifo(tmp2, 0644);
    alarm(30);
    prompt_cache *pc = NULL;
    df_error err = {0};
    int rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), 1 << 30, 1, &err);
    CHECK(!rc && fifos == 3 && access(tok2, F_OK) && access(tmp1, F_OK),
          "FIFOs as a token file and as temp files: the open goes on and drops them (%s)", rc ? err.msg : "ok");
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    df_session_eval(s, ids, 20, NULL, 0, &err);
    int saved = pc && pcache_save(pc, s, ids, 20);
    df_session_reset(s);
    unlink(kv);
    int fifo_kv = !mkfifo(kv, 0644);
    int64_t got = pc ? pcache_restore(pc, s, ids, 30, 0) : -1;
    int entries = -1, enabled;
    uint64_t bytes;
    const char *why;
    if (pc) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    CHECK(saved && fifo_kv && got == 0 && entries == 0,
          "a FIFO in place of a saved state: the restore returns at once and drops the entry (restored %lld)",
          (long long)got);
    pcache_free(pc);
    unlink(kv);
    mkfifo(kv, 0644);   /* and at the next open, with its token file intact */
    pc = NULL;
    rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), 1 << 30, 1, &err);
    if (pc) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    CHECK(!rc && entries == 0 && access(kv, F_OK), "a FIFO state file at open is dropped with its entry");
    /* and the library's own loader, asked directly */
    mkfifo(kv, 0644);
    int lrc = df_session_load(s, kv, &err);
    CHECK(lrc && strstr(err.msg, "not a regular file"), "df_session_load refuses a FIFO at once: %s", err.msg);
    alarm(0);
    df_session_free(s);
    pcache_free(pc);
    free(tok), free(kv), free(tok2), free(kv2), free(tmp1), free(tmp2);
    rm_tree(dir);
    free(dir);
}

/* Symlinks to a victim file at every name a writer could have used, predictable temp names included: the
 * save replaces links with its own files and the victim keeps its bytes. */
static void test_symlinks(df_engine *eng) {
    char *dir = df_path_join(root, "links"), *victim = df_path_join(root, "victim");
    mkdir(dir, 0755);
    put_file(victim, "precious", 8);
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = 2 + i;
    uint64_t h = ref_hash(ids, 16);
    char *tok = entry_name(dir, h, 16, "tok"), *kv = entry_name(dir, h, 16, "kv");
    char planted[6][700];
    snprintf(planted[0], sizeof planted[0], "%s.%d.tmp", tok, (int)getpid());
    snprintf(planted[1], sizeof planted[1], "%s.tmp.%ld", kv, (long)getpid());
    snprintf(planted[2], sizeof planted[2], "%s.tmp", tok);
    snprintf(planted[3], sizeof planted[3], "%s.tmp", kv);
    snprintf(planted[4], sizeof planted[4], "%s", tok);
    snprintf(planted[5], sizeof planted[5], "%s", kv);
    prompt_cache *pc = NULL;
    df_error err = {0};
    int rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), 1 << 30, 1, &err);
    int links = 0;   /* planted after the open, as by another process while the server runs */
    for (int i = 0; i < 6; i++) links += !symlink(victim, planted[i]);
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    df_session_eval(s, ids, 16, NULL, 0, &err);
    int saved = !rc && pcache_save(pc, s, ids, 16);
    df_session_reset(s);
    int64_t got = saved ? pcache_restore(pc, s, ids, 16, 0) : -1;
    size_t n = 0;
    char *v = df_read_file(victim, &n, &err);
    CHECK(links == 6 && saved && got == 16 && v && n == 8 && !memcmp(v, "precious", 8),
          "symlinks at the entry's names and at predictable temp names: the save writes its own files, the victim "
          "is untouched (%zu bytes) and the entry restores (%lld tokens)", n, (long long)got);
    free(v);
    df_session_free(s);
    pcache_free(pc);
    free(tok), free(kv);
    rm_tree(dir);
    unlink(victim);
    free(dir);
    free(victim);
}

/* Files of the cache's naming without an entry (states without tokens, leftover temp files, damaged token
 * files) count against the cap and go first; a file not of the cache's naming is left alone. */
static void test_orphans(df_engine *eng) {
    char *dir = df_path_join(root, "orphans");
    mkdir(dir, 0755);
    uint8_t *blob = xcalloc(1, 4000);
    for (int i = 0; i < 5; i++) {
        char *kv = entry_name(dir, 0x100ull + (uint64_t)i, 7, "kv");
        put_file(kv, blob, 4000);
        free(kv);
    }
    const char *temps[] = {".0000000000000abc-9.tok.tmp-q1w2e3", ".0000000000000abc-9.kv.tmp-zzzzzz",
                           "0000000000000abc-9.tok.4242.tmp", "0000000000000abc-9.kv.tmp.4242"};
    for (int i = 0; i < 4; i++) {
        char *p = df_path_join(dir, temps[i]);
        put_file(p, blob, 4000);
        free(p);
    }
    char *foreign = df_path_join(dir, "notes.txt");
    put_file(foreign, blob, 4000);
    uint64_t cap = 10000;
    prompt_cache *pc = NULL;
    df_error err = {0};
    int rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), cap, 1, &err);
    int files, entries = -1, enabled;
    uint64_t bytes = 0;
    const char *why;
    if (!rc) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    uint64_t on_disk = own_bytes(dir, &files);   /* notes.txt is not counted: 'n' is no hex digit */
    CHECK(!rc && on_disk <= cap && bytes == on_disk && !access(foreign, F_OK),
          "36000 bytes of orphaned cache files under a 10000-byte cap: %llu left, counted %llu, the foreign "
          "file kept", (unsigned long long)on_disk, (unsigned long long)bytes);
    /* a real entry then fills the cap: what is left of the orphans goes before it */
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = 5 + i;
    df_session *s = NULL;
    df_session_init(&s, eng, &err);
    df_session_eval(s, ids, 12, NULL, 0, &err);
    pcache_free(pc);
    pc = NULL;
    rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), 1 << 30, 1, &err);
    int saved = !rc && pcache_save(pc, s, ids, 12);
    if (saved) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    int counted = saved && bytes == own_bytes(dir, &files) && bytes > on_disk;
    pcache_free(pc);
    pc = NULL;
    rc = pcache_open(&pc, dir, df_engine_fingerprint(eng), bytes - 1, 1, &err);   /* below entry + orphans */
    int e2 = -1;
    uint64_t b2 = 0;
    if (!rc) pcache_usage(pc, &e2, &b2, &enabled, &why);
    CHECK(counted && e2 == 1 && b2 == own_bytes(dir, &files),
          "orphans are evicted before the least recently used entry (%d entry, %llu bytes)", e2,
          (unsigned long long)b2);
    df_session_free(s);
    pcache_free(pc);
    free(blob);
    free(foreign);
    rm_tree(dir);
    free(dir);
}

/* An entry is used only by the engine that saved it: the same config.json over rewritten weights, or the
 * int8 spine after bf16 in the same folder, give another fingerprint, and the cache refuses the entry. */
static void test_key(void) {
    char *model = df_path_join(root, "model"), *dir = df_path_join(root, "keyed");
    mkdir(model, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    int copied = 0;
    for (int i = 0; i < 2; i++) {
        char from[256], *to = df_path_join(model, files[i]);
        snprintf(from, sizeof from, "tests/fixtures/kl-bf16/%s", files[i]);
        copied += !copy_file(from, to);
        free(to);
    }
    df_error err = {0};
    df_engine *a = copied == 2 ? ef_open(model, NULL, &err) : NULL;
    if (!a) {
        CHECK(0, "kl-bf16 copy opens: %s", err.msg);
        free(model), free(dir);
        return;
    }
    uint64_t fa = df_engine_fingerprint(a);
    df_engine *again = ef_open(model, NULL, &err);
    uint64_t fa2 = again ? df_engine_fingerprint(again) : 0;
    df_engine_free(again);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = 3 + 2 * i;
    prompt_cache *pc = NULL;
    int rc = pcache_open(&pc, dir, fa, 1 << 30, 1, &err);
    df_session *s = NULL;
    df_session_init(&s, a, &err);
    df_session_eval(s, ids, 20, NULL, 0, &err);
    int saved = !rc && pcache_save(pc, s, ids, 20);
    pcache_free(pc);
    df_session_free(s);
    df_engine_free(a);
    CHECK(fa == fa2 && saved, "the same folder opened twice has one fingerprint, and a state is saved");

    /* new weights under the same config.json: the file rewritten (same bytes, a new modification time) */
    char *st = df_path_join(model, "model.safetensors");
    struct timespec ts[2] = {{1000000000, 0}, {1000000000, 0}};
    utimensat(AT_FDCWD, st, ts, 0);
    df_engine *b = ef_open(model, NULL, &err);
    uint64_t fb = b ? df_engine_fingerprint(b) : fa;
    pc = NULL;
    rc = b ? pcache_open(&pc, dir, fb, 1 << 30, 1, &err) : -1;
    int entries = -1, enabled;
    uint64_t bytes;
    const char *why;
    if (!rc) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    CHECK(fb != fa && entries == 0, "rewritten weights give another fingerprint and the old entry is refused "
          "(%d entries)", entries);
    pcache_free(pc);

    /* the int8 spine after bf16, in the same folder */
    int8_write_stats ws;
    rc = int8_spine_write(model, 0, NULL, &ws, &err);
    df_engine_opts o;
    ef_opts(&o, model, NULL);
    o.spine = DF_SPINE_INT8;
    df_engine *c = NULL;
    if (!rc) rc = df_engine_open(&c, &o, &err);
    uint64_t fc = c ? df_engine_fingerprint(c) : fb;
    saved = 0;
    if (b) {
        pc = NULL;
        df_session_init(&s, b, &err);
        df_session_eval(s, ids, 20, NULL, 0, &err);
        saved = !pcache_open(&pc, dir, fb, 1 << 30, 1, &err) && pcache_save(pc, s, ids, 20);
        pcache_free(pc);
        df_session_free(s);
    }
    pc = NULL;
    entries = -1;
    if (c && !pcache_open(&pc, dir, fc, 1 << 30, 1, &err)) pcache_usage(pc, &entries, &bytes, &enabled, &why);
    int64_t got = -1;
    if (c && pc) {   /* and even asked by its tokens, the int8 engine restores nothing */
        df_session_init(&s, c, &err);
        got = pcache_restore(pc, s, ids, 20, 0);
        df_session_free(s);
    }
    CHECK(!rc && fc != fb && saved && entries == 0 && got == 0,
          "the int8 spine in the same folder has another fingerprint: the bf16 entry is refused (%s)",
          rc ? err.msg : "ok");
    pcache_free(pc);
    df_engine_free(b);
    df_engine_free(c);
    free(st);
    rm_tree(model);
    rm_tree(dir);
    free(model);
    free(dir);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    snprintf(root, sizeof root, "/tmp/df_pcache_%d", (int)getpid());
    mkdir(root, 0755);
    df_error err = {0};
    df_engine *eng = ef_open("tests/fixtures/kl-fp32", NULL, &err);
    CHECK(eng != NULL, "fixture opens (%s)", eng ? "ok" : err.msg);
    test_crafted_tok();
    if (eng) {
        test_fifos(eng);
        test_symlinks(eng);
        test_orphans(eng);
    }
    test_key();
    df_engine_free(eng);
    rm_tree(root);
    TEST_EXIT();
}
