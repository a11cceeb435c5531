/* prompt_cache.c — prompt states kept on disk (prompt_cache.h). Each entry is two files named by a hash of
 * its tokens and their count: NAME.kv, the session state written (atomically, checksummed) by
 * df_session_save, and NAME.tok, the tokens it holds (magic, count, checksum), written after it by rename,
 * so an entry with a .tok is complete. The tokens of every entry are kept in memory to find the longest
 * cached prefix of a prompt; a restored state is checked against them before it is used. The .kv file's
 * modification time is its last use, so the least recently used entries go first across restarts too. */
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

#define PCACHE_MAGIC 0x54504644u   /* "DFPT" */
#define PCACHE_MAX_ENTRIES 1024

typedef struct pc_entry {
    uint64_t hash;
    int64_t n;
    int32_t *tokens;
    uint64_t bytes;          /* both files */
    double used;             /* last use (the .kv's mtime) */
} pc_entry;

struct prompt_cache {
    pthread_mutex_t mu;      /* the index: the worker changes it, /props reads it */
    char *dir;
    uint64_t max_bytes, total;
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

static uint64_t hash_tokens(const int32_t *ids, int64_t n) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a over the little-endian bytes */
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint8_t)((uint32_t)ids[i] >> (8 * b));
            h *= 1099511628211ull;
        }
    return h;
}

static void entry_path(const prompt_cache *pc, uint64_t hash, int64_t n, const char *ext, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%lld.%s", pc->dir, (unsigned long long)hash, (long long)n, ext);
}

static uint64_t file_size(const char *path, double *mtime) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) return 0;
    if (mtime) *mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
    return (uint64_t)st.st_size;
}

static int mkdirs(const char *dir) {
    char *p = xstrdup(dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) break;
            *s = '/';
        }
    int rc = mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
    free(p);
    return rc;
}

/* Reads NAME.tok: the tokens, validated (magic, count against the name and the size, checksum). */
static int32_t *read_tokens(const char *path, int64_t want_n, uint64_t want_hash) {
    df_error e = {0};
    size_t len = 0;
    char *buf = df_read_file(path, &len, &e);
    int32_t *ids = NULL;
    uint32_t magic;
    uint64_t n, sum;
    if (buf && len >= 20) {
        memcpy(&magic, buf, 4);
        memcpy(&n, buf + 4, 8);
        memcpy(&sum, buf + 12, 8);
        if (magic == PCACHE_MAGIC && (int64_t)n == want_n && n > 0 && len == 20 + n * 4) {
            ids = xmalloc(n * 4);
            memcpy(ids, buf + 20, n * 4);
            if (hash_tokens(ids, (int64_t)n) != sum || sum != want_hash) {
                free(ids);
                ids = NULL;
            }
        }
    }
    free(buf);
    return ids;
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

/* Least recently used entries go until the cap holds. */
static void evict(prompt_cache *pc, uint64_t room) {
    while (pc->n && (pc->total + room > pc->max_bytes || pc->n >= PCACHE_MAX_ENTRIES)) {
        int old = 0;
        for (int i = 1; i < pc->n; i++)
            if (pc->e[i].used < pc->e[old].used) old = i;
        remove_entry(pc, old);
    }
}

int pcache_open(prompt_cache **out, const char *dir, uint64_t max_bytes, int min_tokens, df_error *err) {
    *out = NULL;
    if (mkdirs(dir)) {
        df_error_set(err, DF_EIO, "cannot create the prompt cache folder '%s': %s", dir, strerror(errno));
        return DF_EIO;
    }
    DIR *d = opendir(dir);
    if (!d) {
        df_error_set(err, DF_EIO, "cannot read the prompt cache folder '%s': %s", dir, strerror(errno));
        return DF_EIO;
    }
    prompt_cache *pc = xcalloc(1, sizeof *pc);
    pthread_mutex_init(&pc->mu, NULL);
    pc->dir = xstrdup(dir);
    pc->max_bytes = max_bytes;
    pc->min_tokens = min_tokens > 1 ? min_tokens : 1;
    struct dirent *de;
    while ((de = readdir(d))) {
        unsigned long long h;
        long long n;
        int used = 0;
        if (sscanf(de->d_name, "%16llx-%lld.tok%n", &h, &n, &used) != 2 || de->d_name[used] || n <= 0) continue;
        char kv[4200], tok[4200];
        entry_path(pc, h, n, "kv", kv, sizeof kv);
        entry_path(pc, h, n, "tok", tok, sizeof tok);
        double mtime = 0;
        uint64_t kv_bytes = file_size(kv, &mtime);
        int32_t *ids = kv_bytes ? read_tokens(tok, n, h) : NULL;
        if (!ids) {   /* incomplete or damaged: not an entry */
            unlink(tok);
            continue;
        }
        add_entry(pc, h, n, ids, kv_bytes + file_size(tok, NULL), mtime);
    }
    closedir(d);
    evict(pc, 0);
    *out = pc;
    return DF_OK;
}

void pcache_free(prompt_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->n; i++) free(pc->e[i].tokens);
    free(pc->e);
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
    uint64_t h = hash_tokens(ids, n);
    int written = 0;
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].hash == h && pc->e[i].n == n) goto out;   /* kept already */
    if (pc->off) goto out;
    char kv[4200], tok[4200], tmp[4300];
    entry_path(pc, h, n, "kv", kv, sizeof kv);
    entry_path(pc, h, n, "tok", tok, sizeof tok);
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
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", tok, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    uint32_t magic = PCACHE_MAGIC;
    uint64_t count = (uint64_t)n;
    int ok = f && fwrite(&magic, 4, 1, f) == 1 && fwrite(&count, 8, 1, f) == 1 && fwrite(&h, 8, 1, f) == 1 &&
             fwrite(ids, 4, (size_t)n, f) == (size_t)n;
    if (f) ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok &= fclose(f) == 0;
    if (!ok || rename(tmp, tok)) {
        unlink(tmp);
        unlink(kv);
        fprintf(stderr, "deltafin serve: prompt cache: cannot write '%s'\n", tok);
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
    *bytes = pc->total;
    *enabled = !pc->off;
    *why = pc->off ? pc->why : NULL;
    pthread_mutex_unlock(&pc->mu);
}
