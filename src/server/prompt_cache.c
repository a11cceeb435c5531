/* prompt_cache.c — prompt states kept on disk (prompt_cache.h). Each entry is two files named by a hash of
 * its tokens and their count: NAME.kv, the session state written (atomically, checksummed) by
 * df_session_save, and NAME.tok, the tokens it holds (magic, count, checksum, the key of what computed the
 * state), written after it by rename, so an entry with a .tok is complete. The tokens of every entry are
 * kept in memory to find the longest cached prefix of a prompt; a restored state is checked against them
 * before it is used. The .kv file's modification time is its last use, so the least recently used entries
 * go first across restarts too.
 *
 * Everything in the folder is outside input: names are parsed strictly, files are looked at with lstat and
 * opened only as regular files of a bounded size (a FIFO never blocks), and every field is checked before
 * any arithmetic on it. Files of the cache's own naming that are no complete entry of this key (a .kv
 * without its .tok, a damaged or foreign .tok, a writer's leftover temp file) count against the cap and go
 * first; other files are not the cache's and are left alone. */
#include "server/prompt_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/prompt_cache_file.h"

#define PCACHE_MAX_ENTRIES 1024

typedef struct pc_entry {
    uint64_t hash;
    int64_t n;
    int32_t *tokens;
    uint64_t bytes;          /* both files */
    double used;             /* last use (the .kv's mtime) */
} pc_entry;

/* A file of the cache's naming that is no entry: counted against the cap, removed first. */
typedef struct pc_orphan {
    char *name;
    uint64_t bytes;
    double mtime;
} pc_orphan;

struct prompt_cache {
    pthread_mutex_t mu;      /* the index: the worker changes it, /props reads it */
    char *dir;
    uint64_t key;            /* df_engine_fingerprint of the engine whose states are kept */
    uint64_t max_bytes, total;   /* total: entries and orphans */
    pc_orphan *orphans;
    int n_orphans, cap_orphans;
    int min_tokens;
    pc_entry *e;
    int n, cap;
    int off;                 /* saving failed as unsupported: nothing more is tried */
    char why[256];
};

/* Wall-clock seconds, comparable with file modification times. */
static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void entry_path(const prompt_cache *pc, uint64_t hash, int64_t n, const char *ext, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%lld.%s", pc->dir, (unsigned long long)hash, (long long)n, ext);
}

/* Size of a regular file (not through a symlink), 0 when it is anything else or absent. */
static uint64_t file_size(const char *path, double *mtime) {
    struct stat st;
    if (lstat(path, &st) || !S_ISREG(st.st_mode)) return 0;
    if (mtime) *mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
    return (uint64_t)st.st_size;
}

/* Reads NAME.tok: a regular file of at most the size its name allows, then pc_tokens_parse. */
static int32_t *read_tokens(const char *path, int64_t want_n, uint64_t want_hash, uint64_t key, const char **why) {
    df_error e = {0};
    size_t len = 0;
    *why = "not a token file of this cache";
    if (want_n <= 0 || want_n > PC_MAX_TOKENS) return NULL;
    char *buf = df_read_file_max(path, PC_TOK_HEAD + 4 * (size_t)want_n, &len, &e);
    if (!buf) {
        *why = e.code == DF_EIO ? "not a regular file or unreadable" : "larger than its name says";
        return NULL;
    }
    int32_t *ids = pc_tokens_parse((const uint8_t *)buf, len, want_n, want_hash, key, why);
    free(buf);
    return ids;
}

static void add_orphan(prompt_cache *pc, const char *name, uint64_t bytes, double mtime) {
    if (pc->n_orphans == pc->cap_orphans) {
        pc->cap_orphans = pc->cap_orphans ? 2 * pc->cap_orphans : 16;
        pc->orphans = xrealloc(pc->orphans, (size_t)pc->cap_orphans * sizeof *pc->orphans);
    }
    pc->orphans[pc->n_orphans++] = (pc_orphan){xstrdup(name), bytes, mtime};
    pc->total += bytes;
}

static void remove_orphan(prompt_cache *pc, int i) {
    char *path = df_path_join(pc->dir, pc->orphans[i].name);
    unlink(path);
    free(path);
    pc->total -= DF_MIN(pc->total, pc->orphans[i].bytes);
    free(pc->orphans[i].name);
    pc->orphans[i] = pc->orphans[--pc->n_orphans];
}

/* An orphan of that name is about to be replaced by a new entry's file: uncounted, not deleted. */
static void forget_orphan(prompt_cache *pc, const char *path) {
    const char *name = strrchr(path, '/') + 1;
    for (int i = 0; i < pc->n_orphans; i++)
        if (!strcmp(pc->orphans[i].name, name)) {
            pc->total -= DF_MIN(pc->total, pc->orphans[i].bytes);
            free(pc->orphans[i].name);
            pc->orphans[i--] = pc->orphans[--pc->n_orphans];
        }
}

static void remove_entry(prompt_cache *pc, int i) {
    char path[4200];
    entry_path(pc, pc->e[i].hash, pc->e[i].n, "tok", path, sizeof path);
    unlink(path);
    entry_path(pc, pc->e[i].hash, pc->e[i].n, "kv", path, sizeof path);
    unlink(path);
    pc->total -= DF_MIN(pc->total, pc->e[i].bytes);
    free(pc->e[i].tokens);
    pc->e[i] = pc->e[--pc->n];
}

static void add_entry(prompt_cache *pc, uint64_t hash, int64_t n, int32_t *tokens, uint64_t bytes, double used) {
    if (pc->n == pc->cap) {
        pc->cap = pc->cap ? 2 * pc->cap : 16;
        pc->e = xrealloc(pc->e, (size_t)pc->cap * sizeof *pc->e);
    }
    pc->e[pc->n++] = (pc_entry){hash, n, tokens, bytes, used};
    pc->total += bytes;
}

/* Orphans, then the least recently used entries, go until the cap holds. */
static void evict(prompt_cache *pc, uint64_t room) {
    while (pc->n_orphans && pc->total + room > pc->max_bytes) {
        int old = 0;
        for (int i = 1; i < pc->n_orphans; i++)
            if (pc->orphans[i].mtime < pc->orphans[old].mtime) old = i;
        remove_orphan(pc, old);
    }
    while (pc->n && (pc->total + room > pc->max_bytes || pc->n >= PCACHE_MAX_ENTRIES)) {
        int old = 0;
        for (int i = 1; i < pc->n; i++)
            if (pc->e[i].used < pc->e[old].used) old = i;
        remove_entry(pc, old);
    }
}

int pcache_open(prompt_cache **out, const char *dir, uint64_t key, uint64_t max_bytes, int min_tokens,
                df_error *err) {
    *out = NULL;
    if (df_mkdir_p(dir, err)) return DF_EIO;   /* the message names the folder */
    DIR *d = opendir(dir);
    if (!d) {
        df_error_set(err, DF_EIO, "cannot read the prompt cache folder '%s': %s", dir, strerror(errno));
        return DF_EIO;
    }
    prompt_cache *pc = xcalloc(1, sizeof *pc);
    pthread_mutex_init(&pc->mu, NULL);
    pc->dir = xstrdup(dir);
    pc->key = key;
    pc->max_bytes = max_bytes;
    pc->min_tokens = min_tokens > 1 ? min_tokens : 1;
    struct dirent *de;
    char **kvs = NULL;   /* .kv files, judged once every .tok is known */
    int n_kvs = 0;
    while ((de = readdir(d))) {
        unsigned long long h;
        long long n;
        int is_tok;
        if (!pc_name_parse(de->d_name, &h, &n, &is_tok)) continue;
        char *path = df_path_join(dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb)) {
            free(path);
            continue;
        }
        if (!S_ISREG(sb.st_mode)) {   /* a FIFO, device, symlink or folder under the cache's names */
            fprintf(stderr, "deltafin serve: prompt cache: %s dropped: not a regular file\n", path);
            if (!S_ISDIR(sb.st_mode)) unlink(path);
            free(path);
            continue;
        }
        double mtime = (double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9;
        if (!is_tok) {
            size_t l = strlen(de->d_name);
            if (l > 3 && !strcmp(de->d_name + l - 3, ".kv") && de->d_name[0] != '.') {
                kvs = xrealloc(kvs, sizeof *kvs * (size_t)(n_kvs + 1));
                kvs[n_kvs++] = xstrdup(de->d_name);
            } else {
                add_orphan(pc, de->d_name, (uint64_t)sb.st_size, mtime);   /* a writer's temp file */
            }
            free(path);
            continue;
        }
        char kv[4200];
        entry_path(pc, h, n, "kv", kv, sizeof kv);
        double used = 0;
        uint64_t kv_bytes = file_size(kv, &used);
        const char *why = "its state file (.kv) is missing";
        int32_t *ids = kv_bytes ? read_tokens(path, n, h, key, &why) : NULL;
        if (!ids) {   /* incomplete, damaged or another engine's: not an entry; its .kv becomes an orphan */
            fprintf(stderr, "deltafin serve: prompt cache: %s dropped: %s\n", path, why);
            unlink(path);
        } else {
            add_entry(pc, h, n, ids, kv_bytes + (uint64_t)sb.st_size, used);
        }
        free(path);
    }
    closedir(d);
    for (int i = 0; i < n_kvs; i++) {   /* a .kv without an entry is an orphan */
        int owned = 0;
        for (int j = 0; j < pc->n && !owned; j++) {
            char name[64];
            snprintf(name, sizeof name, "%016llx-%lld.kv", (unsigned long long)pc->e[j].hash, (long long)pc->e[j].n);
            owned = !strcmp(name, kvs[i]);
        }
        double mtime = 0;
        char *path = df_path_join(dir, kvs[i]);
        uint64_t bytes = file_size(path, &mtime);
        if (!owned) add_orphan(pc, kvs[i], bytes, mtime);
        free(path);
        free(kvs[i]);
    }
    free(kvs);
    evict(pc, 0);
    *out = pc;
    return DF_OK;
}

void pcache_free(prompt_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->n; i++) free(pc->e[i].tokens);
    for (int i = 0; i < pc->n_orphans; i++) free(pc->orphans[i].name);
    free(pc->e);
    free(pc->orphans);
    free(pc->dir);
    pthread_mutex_destroy(&pc->mu);
    free(pc);
}

int64_t pcache_restore(prompt_cache *pc, df_session *sess, const int32_t *ids, int64_t n, int64_t have) {
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        int best = -1;
        for (int i = 0; i < pc->n; i++) {
            const pc_entry *e = &pc->e[i];
            if (e->n > have && e->n <= n && (best < 0 || e->n > pc->e[best].n) &&
                !memcmp(e->tokens, ids, (size_t)e->n * sizeof(int32_t)))
                best = i;
        }
        if (best < 0) break;
        pc_entry *e = &pc->e[best];
        char kv[4200];
        entry_path(pc, e->hash, e->n, "kv", kv, sizeof kv);
        df_error err = {0};
        int rc = df_session_load(sess, kv, &err);
        int64_t got = 0;
        const int32_t *h = rc ? NULL : df_session_tokens(sess, &got);
        if (!rc && got == e->n && !memcmp(h, e->tokens, (size_t)got * sizeof(int32_t))) {
            utimensat(AT_FDCWD, kv, NULL, 0);
            e->used = wall_now();
            pthread_mutex_unlock(&pc->mu);
            return got;
        }
        df_session_reset(sess);
        if (rc == DF_EUNSUPPORTED) break;
        fprintf(stderr, "deltafin serve: prompt cache entry %s dropped: %s\n", kv,
                rc ? err.msg : "its state does not hold the tokens it was saved for");
        remove_entry(pc, best);
    }
    pthread_mutex_unlock(&pc->mu);
    return have;
}

int pcache_save(prompt_cache *pc, const df_session *sess, const int32_t *ids, int64_t n) {
    if (n < pc->min_tokens) return 0;
    pthread_mutex_lock(&pc->mu);
    uint64_t h = pc_hash_tokens(ids, n);
    int written = 0;
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].hash == h && pc->e[i].n == n) goto out;   /* kept already */
    if (pc->off) goto out;
    if (n > PC_MAX_TOKENS) goto out;
    char kv[4200], tok[4200];
    entry_path(pc, h, n, "kv", kv, sizeof kv);
    entry_path(pc, h, n, "tok", tok, sizeof tok);
    forget_orphan(pc, kv);
    df_error err = {0};
    int rc = df_session_save(sess, kv, &err);
    if (rc) {
        if (rc == DF_EUNSUPPORTED) {
            pc->off = 1;
            snprintf(pc->why, sizeof pc->why, "%s", err.msg);
        }
        fprintf(stderr, "deltafin serve: prompt cache: %s%s\n", err.msg, pc->off ? " (prompt cache off)" : "");
        goto out;
    }
    uint8_t head[PC_TOK_HEAD];
    pc_tokens_head(head, n, h, pc->key);
    char *tmp;   /* exclusive, unpredictable: a symlink planted in the folder is never written through */
    int fd = df_temp_create(tok, &tmp, &err);
    int e1 = fd < 0 ? EIO : df_write_all(fd, head, sizeof head);
    if (fd >= 0 && !e1) e1 = df_write_all(fd, ids, (size_t)n * sizeof(int32_t));
    if (fd < 0 || df_temp_commit(fd, tmp, tok, e1, &err)) {
        unlink(kv);
        fprintf(stderr, "deltafin serve: prompt cache: cannot write '%s': %s\n", tok, err.msg);
        goto out;
    }
    uint64_t bytes = file_size(kv, NULL) + file_size(tok, NULL);
    evict(pc, bytes);
    int32_t *copy = xmalloc((size_t)n * sizeof(int32_t));
    memcpy(copy, ids, (size_t)n * sizeof(int32_t));
    add_entry(pc, h, n, copy, bytes, wall_now());
    if (pc->total > pc->max_bytes) evict(pc, 0);   /* one entry larger than the cap is not kept */
    written = 1;
out:
    pthread_mutex_unlock(&pc->mu);
    return written;
}

int pcache_active(prompt_cache *pc) {
    pthread_mutex_lock(&pc->mu);
    int on = !pc->off;
    pthread_mutex_unlock(&pc->mu);
    return on;
}

void pcache_usage(prompt_cache *pc, int *entries, uint64_t *bytes, int *enabled, const char **why) {
    pthread_mutex_lock(&pc->mu);
    *entries = pc->n;
    *bytes = pc->total;   /* orphans included: what the folder holds against the cap */
    *enabled = !pc->off;
    *why = pc->off ? pc->why : NULL;
    pthread_mutex_unlock(&pc->mu);
}
