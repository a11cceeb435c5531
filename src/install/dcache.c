/* dcache.c — the install manifest and the expert disk cache of a partial install (see dcache.h). */
#include "dcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/util.h"
#include "io/io.h"
#include "common/hash.h"

#define DC_CACHE_DIR ".deltafin/cache"
#define DC_TMP_PREFIX ".tmp-"
#define DC_TRAILER 16                    /* magic, then the XXH64 of the entry's bytes (little-endian) */
#define DC_TRAILER_MAGIC "DFXXH64\n"

/* ---------------------------------------------------------------------------------------------------- */
/* Files */


static int dc_fsync_dir(const char *path) {
    char *d = xstrdup(path);
    char *slash = strrchr(d, '/');
    if (slash) *slash = 0;
    int fd = open(slash ? d : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
    if (fd >= 0) close(fd);
    free(d);
    return rc;
}

static int dc_write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* pad zero bytes, data, then tail (tail_len bytes), published atomically. */
/* What a size-capped entry's writer settles when its file appears: under mu, the rename moves its bytes from
 * pending to used, so an eviction in between never counts them twice (and deletes entries for room that
 * exists). */
typedef struct dc_publish {
    pthread_mutex_t *mu;
    uint64_t *pending;
    int64_t *used;
    uint64_t need;
    int done;
} dc_publish;

static int dc_write_parts(const char *path, uint64_t pad, const void *data, size_t len, const void *tail,
                          size_t tail_len, dc_publish *pub, df_error *err) {
    size_t pl = strlen(path);
    char *tmp = xmalloc(pl + 64);
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    int fd;
    for (;;) {   /* the lock on the temp file is its lease: cleaners remove only unlocked ones */
        snprintf(tmp, pl + 64, "%.*s" DC_TMP_PREFIX "%ld-XXXXXX", (int)dl, path, (long)getpid());
        fd = mkstemp(tmp);
        if (fd < 0) break;
        struct stat sb;   /* no locks on this file system: cleaners cannot lock it either, so it is safe */
        if (flock(fd, LOCK_EX) != 0 || fstat(fd, &sb) != 0 || sb.st_nlink > 0) break;
        close(fd);   /* a cleaner took it between mkstemp and flock: make another */
    }
    if (fd < 0) {
        df_error_set(err, DF_EIO, "%s: cannot create a temp file next to it: %s", path, strerror(errno));
        free(tmp);
        return DF_EIO;
    }
    int e = 0;
    static const uint8_t zeros[IO_ALIGN];
    if (pad) e = dc_write_all(fd, zeros, (size_t)DF_MIN(pad, sizeof zeros));
    if (!e) e = dc_write_all(fd, data, len);
    if (!e && tail_len) e = dc_write_all(fd, tail, tail_len);
    if (!e && fchmod(fd, 0644)) e = errno;
    if (!e && fsync(fd)) e = errno;
    if (close(fd) && !e) e = errno;
    if (pub) pthread_mutex_lock(pub->mu);
    if (!e && rename(tmp, path)) e = errno;
    if (pub && !e) {
        *pub->pending -= pub->need;
        if (*pub->used >= 0) *pub->used += (int64_t)pub->need;
        pub->done = 1;
    }
    if (pub) pthread_mutex_unlock(pub->mu);
    if (!e) dc_fsync_dir(path);
    if (e) {
        unlink(tmp);
        df_error_set(err, DF_EIO, "%s: %s%s (nothing written)", path,
                     e == ENOSPC || e == EFBIG || e == EDQUOT ? "disk full: " : "write failed: ", strerror(e));
    }
    free(tmp);
    return e ? DF_EIO : DF_OK;
}

int dc_write_atomic(const char *path, uint64_t pad, const void *data, size_t len, df_error *err) {
    return dc_write_parts(path, pad, data, len, NULL, 0, NULL, err);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Manifest */

static const char *const dc_state_names[] = {"pending", "spine", "complete"};

void dc_manifest_free(dc_manifest *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->shards[i].name);
        free(m->shards[i].holes);
        free(m->shards[i].sha256);
    }
    free(m->shards);
    free(m->source);
    memset(m, 0, sizeof *m);
}

dc_shard *dc_manifest_find(const dc_manifest *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->shards[i].name, name)) return &m->shards[i];
    return NULL;
}

int dc_shard_hole(const dc_shard *s, uint64_t off, uint64_t len) {
    int lo = 0, hi = s->n_holes;   /* first hole ending after off */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->holes[mid].off + s->holes[mid].len <= off) lo = mid + 1;
        else hi = mid;
    }
    if (lo == s->n_holes || s->holes[lo].off >= off + len) return -1;
    const dc_span *h = &s->holes[lo];
    return h->off <= off && off + len <= h->off + h->len ? lo : -2;
}

static int dc_bad(const char *path, const char *what, df_error *err) {
    return df_error_set(err, DF_EFORMAT, "%s: %s (rerun deltafin fetch to rebuild it)", path, what), DF_EFORMAT;
}

static int dc_cmp_span(const void *a, const void *b) {
    const dc_span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int dc_parse_shard(json_t *js, dc_shard *s, const char *path, df_error *err) {
    const char *name = json_string_value(json_object_get(js, "name"));
    const char *state = json_string_value(json_object_get(js, "state"));
    json_t *size = json_object_get(js, "size"), *holes = json_object_get(js, "holes");
    if (!name || !state || !json_is_integer(size) || json_integer_value(size) < 0 || !json_is_array(holes))
        return dc_bad(path, "shard entry lacks name, state, size or holes", err);
    /* the name joins the model folder and the cache folder: a path that climbs out of them is refused */
    int climbs = !*name || name[0] == '/' || strlen(name) > 1024;
    for (const char *p = name; !climbs && *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        climbs = (p[0] == '.' && (p[1] == '/' || !p[1])) || (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2])) ||
                 p[0] == '/';
    if (climbs) return dc_bad(path, "a shard name is not a path inside the model folder", err);
    s->name = xstrdup(name);
    s->size = (uint64_t)json_integer_value(size);
    const char *sha = json_string_value(json_object_get(js, "sha256"));
    if (sha && strlen(sha) != 64) return dc_bad(path, "sha256 is not 64 hex digits", err);
    s->sha256 = sha ? xstrdup(sha) : NULL;
    s->verified = json_is_true(json_object_get(js, "verified"));
    s->state = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(state, dc_state_names[k])) s->state = k;
    if (s->state < 0) return dc_bad(path, "unknown shard state", err);
    s->n_holes = (int)json_array_size(holes);
    s->holes = xcalloc((size_t)s->n_holes + 1, sizeof *s->holes);
    for (int i = 0; i < s->n_holes; i++) {
        json_t *h = json_array_get(holes, (size_t)i);
        json_t *o = json_array_get(h, 0), *l = json_array_get(h, 1);
        if (!json_is_integer(o) || !json_is_integer(l) || json_integer_value(o) < 0 || json_integer_value(l) <= 0)
            return dc_bad(path, "bad hole", err);
        s->holes[i] = (dc_span){(uint64_t)json_integer_value(o), (uint64_t)json_integer_value(l)};
    }
    qsort(s->holes, (size_t)s->n_holes, sizeof *s->holes, dc_cmp_span);
    for (int i = 0; i < s->n_holes; i++)
        if ((i && s->holes[i - 1].off + s->holes[i - 1].len > s->holes[i].off) ||
            s->holes[i].off + s->holes[i].len > s->size)
            return dc_bad(path, "holes overlap or lie past the end of the shard", err);
    return DF_OK;
}

int dc_manifest_load(const char *dir, dc_manifest *m, int *found, df_error *err) {
    memset(m, 0, sizeof *m);
    *found = 0;
    char *path = df_path_join(dir, DC_MANIFEST);
    if (access(path, F_OK)) {
        free(path);
        return DF_OK;
    }
    *found = 1;
    df_error je = {0};
    json_t *root = df_json_load_file(path, 0, &je);
    int rc = DF_OK;
    json_t *shards = root ? json_object_get(root, "shards") : NULL;
    if (!root || !json_is_array(shards)) {
        rc = root ? dc_bad(path, "no \"shards\" array", err) : (df_error_set(err, DF_EFORMAT, "%s (rerun deltafin "
                                                                              "fetch to rebuild it)", je.msg), DF_EFORMAT);
    } else {
        const char *src = json_string_value(json_object_get(root, "source"));
        m->source = src ? xstrdup(src) : NULL;
        m->n = (int)json_array_size(shards);
        m->shards = xcalloc((size_t)m->n + 1, sizeof *m->shards);
        for (int i = 0; i < m->n && !rc; i++) rc = dc_parse_shard(json_array_get(shards, (size_t)i), &m->shards[i], path, err);
    }
    json_decref(root);
    free(path);
    if (rc) dc_manifest_free(m);
    return rc;
}

int dc_manifest_save(const char *dir, const dc_manifest *m, df_error *err) {
    json_t *root = json_object(), *shards = json_array();
    json_object_set_new(root, "version", json_integer(1));
    if (m->source) json_object_set_new(root, "source", json_string(m->source));
    for (int i = 0; i < m->n; i++) {
        const dc_shard *s = &m->shards[i];
        json_t *js = json_object(), *holes = json_array();
        json_object_set_new(js, "name", json_string(s->name));
        json_object_set_new(js, "size", json_integer((json_int_t)s->size));
        json_object_set_new(js, "state", json_string(dc_state_names[s->state]));
        if (s->sha256) json_object_set_new(js, "sha256", json_string(s->sha256));
        if (s->verified) json_object_set_new(js, "verified", json_true());
        for (int h = 0; h < s->n_holes && s->state != DC_COMPLETE; h++)
            json_array_append_new(holes, json_pack("[II]", (json_int_t)s->holes[h].off, (json_int_t)s->holes[h].len));
        json_object_set_new(js, "holes", holes);
        json_array_append_new(shards, js);
    }
    json_object_set_new(root, "shards", shards);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    char *sd = df_path_join(dir, DC_STATE_DIR);
    int rc = df_mkdir_p(sd, err);
    free(sd);
    char *path = df_path_join(dir, DC_MANIFEST);
    if (!rc) rc = dc_write_atomic(path, 0, text, strlen(text), err);
    free(path);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Cache entries */

struct dcache {
    char *root;          /* DIR/.deltafin/cache */
    uint64_t min_free;
    uint64_t cap;        /* 0: no size cap */
    pthread_mutex_t mu;  /* guards used and pending */
    int64_t used;        /* bytes of entries (files) under root; -1 until counted */
    uint64_t pending;    /* bytes of entries this process is writing, already counted against the cap */
};

/* Removes temp files no writer holds: every writer keeps an exclusive flock on its temp file until it is
 * renamed or abandoned, and the kernel drops it when the writer dies. A lock, not the pid in the name: a
 * pid says nothing about a process of another host or container sharing the folder. */
static void dc_clean_temps(const char *folder, int depth) {
    DIR *d = opendir(folder);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = df_path_join(folder, de->d_name);
        if (!strncmp(de->d_name, DC_TMP_PREFIX, strlen(DC_TMP_PREFIX))) {
            int fd = open(p, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) unlink(p);
            if (fd >= 0) close(fd);
        } else if (de->d_type == DT_DIR && depth < 8) {
            dc_clean_temps(p, depth + 1);
        }
        free(p);
    }
    closedir(d);
}

static uint64_t dc_env_bytes(const char *name) {
    const char *v = getenv(name);
    char *end;
    double gb = v && *v ? strtod(v, &end) : 0;
    return v && *v && !*end && gb > 0 && gb < 1e9 ? (uint64_t)(gb * 1e9) : 0;
}

int dcache_open(dcache **out, const char *dir, uint64_t min_free, df_error *err) {
    dcache *c = xcalloc(1, sizeof *c);
    c->root = df_path_join(dir, DC_CACHE_DIR);
    c->min_free = min_free;
    c->cap = dc_env_bytes(DC_ENV_CAP);
    c->used = -1;
    pthread_mutex_init(&c->mu, NULL);
    dc_clean_temps(c->root, 0);
    char *sd = df_path_join(dir, DC_STATE_DIR);
    dc_clean_temps(sd, 8);   /* the manifest's temp files (not the cache again) */
    free(sd);
    *out = c;
    (void)err;
    return DF_OK;
}

uint64_t dcache_default_reserve(void) {
    const char *v = getenv(DC_ENV_RESERVE);
    return v && !strcmp(v, "0") ? 0 : dc_env_bytes(DC_ENV_RESERVE) ? dc_env_bytes(DC_ENV_RESERVE) : DC_DEFAULT_RESERVE;
}

void dcache_free(dcache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->root);
    free(c);
}

char *dcache_entry_path(const dcache *c, const char *shard, dc_span e) {
    size_t n = strlen(c->root) + strlen(shard) + 64;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s/%llu-%llu", c->root, shard, (unsigned long long)e.off, (unsigned long long)e.len);
    return p;
}

/* Size of the entry file: alignment padding, the bytes, the trailer. */
static uint64_t dc_entry_bytes(dc_span e) { return e.off % IO_ALIGN + e.len + DC_TRAILER; }

int dcache_has(const dcache *c, const char *shard, dc_span e) {
    char *p = dcache_entry_path(c, shard, e);
    struct stat sb;
    int ok = lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == dc_entry_bytes(e);
    free(p);
    return ok;
}

static int dc_pread_all(int fd, uint8_t *dst, uint64_t want, uint64_t pos, uint64_t *got) {
    *got = 0;
    while (*got < want) {
        ssize_t r = pread(fd, dst + *got, want - *got, (off_t)(pos + *got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) break;
        *got += (uint64_t)r;
    }
    return 0;
}

static void dc_trailer(uint8_t t[DC_TRAILER], const uint8_t *data, uint64_t len) {
    uint64_t h = df_hash64(data, (size_t)len, 0);
    memcpy(t, DC_TRAILER_MAGIC, 8);
    for (int i = 0; i < 8; i++) t[8 + i] = (uint8_t)(h >> (8 * i));
}

/* The entry's bytes (at data, e.len of them) against the trailer stored after them in fd. */
static int dc_verify(int fd, const char *path, dc_span e, const uint8_t *data, const char *what, df_error *err) {
    uint8_t want[DC_TRAILER], got[DC_TRAILER];
    uint64_t n = 0;
    int e1 = dc_pread_all(fd, got, DC_TRAILER, e.off % IO_ALIGN + e.len, &n);
    dc_trailer(want, data, e.len);
    if (!e1 && n == DC_TRAILER && !memcmp(want, got, DC_TRAILER)) return DF_OK;
    return df_error_set(err, DF_EFORMAT, "%s: cached %s is corrupt (%s)", path, what,
                        e1 ? strerror(e1) : n < DC_TRAILER ? "no checksum" : "checksum mismatch"), DF_EFORMAT;
}

/* Marks an entry recently used (for eviction under a size cap). */
static void dc_touch(const dcache *c, const char *path) {
    if (c->cap) utimensat(AT_FDCWD, path, NULL, 0);
}

/* Opens an entry without blocking or following a link: only a regular file of the entry's exact size is one
 * (a FIFO, device or link planted in the cache is refused at once). -1 with errno set otherwise. */
static int dc_open_entry(const char *path, dc_span e, int flags) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | flags);
    struct stat sb;
    if (fd >= 0 && (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != dc_entry_bytes(e))) {
        int regular = S_ISREG(sb.st_mode);
        close(fd);
        errno = regular ? EBADMSG : EINVAL;
        return -1;
    }
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

int dcache_load(dcache *c, const char *shard, dc_span e, uint8_t *dst, const char *what, df_error *err) {
    char *path = dcache_entry_path(c, shard, e);
    int fd = dc_open_entry(path, e, 0), rc;
    uint64_t got = 0;
    int e1 = fd < 0 ? errno : dc_pread_all(fd, dst, e.len, e.off % IO_ALIGN, &got);
    if (e1 || got < e.len)
        rc = (df_error_set(err, DF_EIO, "%s: reading cached %s failed: %s", path, what,
                           e1 ? strerror(e1) : "entry shorter than its name says"), DF_EIO);
    else
        rc = dc_verify(fd, path, e, dst, what, err);
    if (fd >= 0) close(fd);
    if (!rc) dc_touch(c, path);
    free(path);
    return rc;
}

int dcache_read(dcache *c, const char *shard, dc_span e, uint64_t off, uint64_t len, uint8_t *dst, const char *what,
                df_error *err) {
    DF_ASSERT(off >= e.off && off + len <= e.off + e.len);
    if (off != e.off || len != e.len) {   /* part of an entry: the whole is needed to verify it */
        uint8_t *all = xmalloc(e.len);
        int rc = dcache_load(c, shard, e, all, what, err);
        if (!rc) memcpy(dst + off % IO_ALIGN, all + (off - e.off), len);
        free(all);
        return rc;
    }
    char *path = dcache_entry_path(c, shard, e);
    uint64_t base = e.off - e.off % IO_ALIGN, head = off % IO_ALIGN, pos = off - base - head, got = 0;
    int fd = dc_open_entry(path, e, O_DIRECT), e1 = 0;
    if (fd < 0 && (errno == EINVAL || errno == EBADMSG || errno == ELOOP)) {   /* no entry file, not O_DIRECT */
        int why = errno;
        int plain = dc_open_entry(path, e, 0);
        if (plain < 0) {
            df_error_set(err, DF_EIO, "%s: reading cached %s failed: %s", path, what,
                         why == ELOOP || errno == ELOOP ? "a symbolic link, not an entry"
                         : errno == EBADMSG ? "size does not match its name" : "not a regular file");
            free(path);
            return DF_EIO;
        }
        close(plain);
    }
    if (fd >= 0) {
        e1 = dc_pread_all(fd, dst, io_span_bytes(off, len), pos, &got);
        close(fd);
    }
    if (fd < 0 || got < head + len) {   /* no O_DIRECT here (tmpfs), or refused: read buffered */
        fd = dc_open_entry(path, e, 0);
        e1 = fd < 0 ? errno : dc_pread_all(fd, dst + head, len, off - base, &got);
        if (fd >= 0) close(fd);
        if (!e1 && got < len) e1 = -1;
        else got += head;
    }
    int rc = DF_OK;
    if (e1)
        rc = (df_error_set(err, DF_EIO, "%s: reading cached %s failed: %s", path, what,
                           e1 < 0 ? "entry shorter than its name says" : strerror(e1)), DF_EIO);
    if (!rc) {
        fd = dc_open_entry(path, e, 0);
        rc = fd < 0 ? (df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno)), DF_EIO)
                    : dc_verify(fd, path, e, dst + head, what, err);
        if (fd >= 0) close(fd);
    }
    if (!rc) dc_touch(c, path);
    free(path);
    return rc;
}

void dcache_remove(dcache *c, const char *shard, dc_span e) {
    char *path = dcache_entry_path(c, shard, e);
    struct stat sb;
    if (stat(path, &sb) == 0 && unlink(path) == 0) {
        pthread_mutex_lock(&c->mu);
        if (c->used >= 0) c->used -= DF_MIN(c->used, (int64_t)sb.st_size);
        pthread_mutex_unlock(&c->mu);
    }
    free(path);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Size cap: least recently used entries (by mtime, refreshed on every verified read) go first. */

typedef struct dc_file {
    char *path;
    int64_t size;
    struct timespec mtime;
} dc_file;

static void dc_list(const char *folder, int depth, dc_file **v, int *n, int *cap) {
    DIR *d = opendir(folder);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;   /* ".", "..", temp files */
        char *p = df_path_join(folder, de->d_name);
        struct stat sb;
        if (lstat(p, &sb)) {
            free(p);
        } else if (S_ISDIR(sb.st_mode) && depth < 8) {
            dc_list(p, depth + 1, v, n, cap);
            free(p);
        } else if (S_ISREG(sb.st_mode)) {
            if (*n == *cap) *v = xrealloc(*v, sizeof **v * (size_t)(*cap = *cap ? 2 * *cap : 256));
            (*v)[(*n)++] = (dc_file){p, (int64_t)sb.st_size, sb.st_mtim};
        } else {
            free(p);
        }
    }
    closedir(d);
}

static int dc_cmp_age(const void *a, const void *b) {
    const struct timespec *x = &((const dc_file *)a)->mtime, *y = &((const dc_file *)b)->mtime;
    if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
    return x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec;
}

/* Called with c->mu held: makes room for need more bytes (besides those pending) under the cap, oldest
 * entries first. */
static void dc_evict(dcache *c, uint64_t need) {
    need += c->pending;
    dc_file *v = NULL;
    int n = 0, cap = 0;
    dc_list(c->root, 0, &v, &n, &cap);
    c->used = 0;
    for (int i = 0; i < n; i++) c->used += v[i].size;
    if ((uint64_t)c->used + need > c->cap) {
        qsort(v, (size_t)n, sizeof *v, dc_cmp_age);
        for (int i = 0; i < n && (uint64_t)c->used + need > c->cap; i++)
            if (unlink(v[i].path) == 0) c->used -= v[i].size;
    }
    for (int i = 0; i < n; i++) free(v[i].path);
    free(v);
}

int dcache_put(dcache *c, const char *shard, dc_span e, const uint8_t *data, const char *what, df_error *err) {
    char *path = dcache_entry_path(c, shard, e);
    char *folder = xstrdup(path);
    *strrchr(folder, '/') = 0;
    int rc = df_mkdir_p(folder, err);
    struct statvfs vs;
    uint64_t need = dc_entry_bytes(e);
    if (!rc && c->cap && need > c->cap)
        rc = (df_error_set(err, DF_EIO, "%s: not caching %s: %llu bytes exceed the cache cap of %llu (%s)", path, what,
                           (unsigned long long)need, (unsigned long long)c->cap, DC_ENV_CAP), DF_EIO);
    int reserved = 0;
    if (!rc && c->cap) {
        pthread_mutex_lock(&c->mu);
        if (c->used < 0 || (uint64_t)c->used + c->pending + need > c->cap) dc_evict(c, need);
        reserved = (uint64_t)c->used + c->pending + need <= c->cap;
        if (reserved) c->pending += need;   /* counted now so parallel writers do not all squeeze in */
        pthread_mutex_unlock(&c->mu);
        if (!reserved)   /* what fills the cap is being written by this process's other threads */
            rc = (df_error_set(err, DF_EIO, "%s: not caching %s: the cache is at its cap of %llu bytes (%s)", path,
                               what, (unsigned long long)c->cap, DC_ENV_CAP), DF_EIO);
    }
    if (!rc && statvfs(folder, &vs) == 0 && (uint64_t)vs.f_bavail * vs.f_frsize < need + c->min_free)
        rc = (df_error_set(err, DF_EIO, "%s: disk full: caching %s needs %llu bytes, %llu free (keeping %llu free)",
                           path, what, (unsigned long long)need, (unsigned long long)vs.f_bavail * vs.f_frsize,
                           (unsigned long long)c->min_free), DF_EIO);
    if (!rc) {
        uint8_t t[DC_TRAILER];
        dc_trailer(t, data, e.len);
        dc_publish pub = {&c->mu, &c->pending, &c->used, need, 0};
        rc = dc_write_parts(path, e.off % IO_ALIGN, data, e.len, t, sizeof t, reserved ? &pub : NULL, err);
        if (pub.done) reserved = 0;   /* settled when the file appeared */
        if (rc) {
            char inner[sizeof err->msg];
            memcpy(inner, err->msg, sizeof inner);
            df_error_set(err, rc, "caching %s: %s", what, inner);
        }
    }
    if (reserved) {
        pthread_mutex_lock(&c->mu);
        c->pending -= need;
        c->used = -1;   /* the write failed: recount before the next eviction */
        pthread_mutex_unlock(&c->mu);
    }
    free(folder);
    free(path);
    return rc;
}

/* Removes path and, for a real folder, what is in it: a symlink is removed itself, never followed into the
 * folder it names. */
static void dc_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb)) return;
    DIR *d = S_ISDIR(sb.st_mode) ? opendir(path) : NULL;
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = df_path_join(path, de->d_name);
        dc_remove_tree(p);
        free(p);
    }
    closedir(d);
    rmdir(path);
}

void dcache_drop_shard(dcache *c, const char *shard) {
    char *p = df_path_join(c->root, shard);
    dc_remove_tree(p);
    free(p);
}

void dcache_shard_usage(const dcache *c, const char *shard, uint64_t *entries, uint64_t *bytes) {
    *entries = *bytes = 0;
    char *p = df_path_join(c->root, shard);
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        unsigned long long o, l;
        char tail;
        if (sscanf(de->d_name, "%llu-%llu%c", &o, &l, &tail) == 2) {
            (*entries)++;
            *bytes += l;
        }
    }
    if (d) closedir(d);
    free(p);
}
