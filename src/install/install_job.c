/* install_job.c — installing a model from a remote repository into a folder (see install_job.h).
 *
 * Order of work, chosen so an interruption at any point leaves a folder the next run completes: metadata
 * files (each written atomically), then the manifest listing every shard as pending with its holes (the
 * routed-expert spans, found from the shard headers by fetch_plan.c), then per shard a sparse file of full
 * size holding the header and every non-expert byte, synced before the manifest marks it "spine".
 * INSTALL_LAYERS puts the experts of those layers into the disk cache (one atomic, checksummed entry per
 * span). INSTALL_ALL fills each shard's holes in place (from the cache when the entry's checksum holds, else
 * one range request per span), logging finished spans after each synced batch, checks the whole shard
 * against the SHA-256 the hub publishes (when it does), and marks it complete, dropping its cache entries. */
#include "install_job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "dcache.h"
#include "fetch_plan.h"

static const char *const install_meta_files[] = {
    "config.json", "generation_config.json", "tokenizer_config.json", "tiktoken.model", "tokenizer.json",
    "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json",
};

typedef struct install_shard {
    char *name;
    char *path;
    int local;               /* a complete local file the manifest does not track */
    dc_shard *m;             /* its manifest entry (NULL when local) */
    uint64_t size, header_len;
    char sha256[65];         /* as the remote published it, or "" */
    dc_span *runs;           /* non-expert byte runs (header included) */
    int n_runs;
    fplan_hole *holes;       /* parallel to m->holes */
    int n_holes;
} install_shard;

typedef struct install_job {
    const install_opts *o;
    const install_events *ev;
    int jobs;
    remote *r;
    dcache *cache;
    dc_manifest man;
    install_shard *sh;
    int n_sh;
    install_plan plan;
    int planned;             /* plan complete */
    uint64_t done, total;    /* progress: bytes downloaded of those planned */
} install_job;

static void install_progress(install_job *j, int final) {
    if (j->ev && j->ev->progress) j->ev->progress(j->ev->ctx, j->done, j->total, final);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Sinks: bytes of a range straight into a file at its offset. */

typedef struct install_sink {
    int fd;
    uint64_t off;
    const char *path;
    install_job *count;      /* NULL: bytes that do not count as downloaded (copied from the cache) */
} install_sink;

static int install_sink_write(void *ctx, uint64_t at, const uint8_t *d, size_t n, df_error *err) {
    install_sink *s = ctx;
    while (n) {
        ssize_t w = pwrite(s->fd, d, n, (off_t)(s->off + at));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return df_error_set(err, DF_EIO, "%s: %s%s", s->path, e == ENOSPC || e == EFBIG ? "disk full: " : "",
                                strerror(e)), DF_EIO;
        }
        d += w, n -= (size_t)w, at += (uint64_t)w;
        if (s->count) s->count->done += (uint64_t)w;
    }
    if (s->count) install_progress(s->count, 0);
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Shard headers: which bytes are routed experts (holes) and which are not (runs). */

static int install_read_header(remote *r, install_shard *s, df_error *err) {
    fplan_layout L;
    int rc = fplan_layout_fetch(&L, r, s->name, err);
    if (rc) return rc;
    s->size = L.size;
    s->header_len = L.header_len;
    memcpy(s->sha256, L.sha256, sizeof s->sha256);
    s->runs = L.runs;
    s->n_runs = L.n_runs;
    s->holes = L.holes;
    s->n_holes = L.n_holes;
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Plan */

static void install_add(uint64_t *a, uint64_t b) { *a = *a > UINT64_MAX - b ? UINT64_MAX : *a + b; }

static int install_wanted(const install_job *j, const fplan_hole *h) {
    if (j->o->what == INSTALL_ALL) return 1;
    return j->o->what == INSTALL_LAYERS && h->layer >= 0 && h->layer < j->o->n_layers && j->o->layers[h->layer];
}

/* Adds the shard files named by an index (see fplan_index_shards) to j->sh, which holds none yet. */
static int install_add_shards(install_job *j, const char *json, size_t len, const char *src, df_error *err) {
    char **names = NULL;
    int n = 0, rc = fplan_index_shards(json, len, src, &names, &n, err);
    DF_ASSERT(!j->sh && !j->n_sh);
    j->sh = xcalloc((size_t)n + 1, sizeof *j->sh);
    for (int i = 0; i < n; i++) j->sh[i].name = names[i];
    j->n_sh = n;
    free(names);
    return rc;
}

static int install_meta(install_job *j, df_error *err) {
    for (size_t i = 0; i < sizeof install_meta_files / sizeof install_meta_files[0]; i++) {
        const char *f = install_meta_files[i];
        char *path = df_path_join(j->o->dir, f);
        int have = access(path, F_OK) == 0, rc = DF_OK;
        if (!have) {
            char *data;
            size_t len;
            int missing;
            rc = remote_get_file(j->r, f, &data, &len, &missing, err);
            if (!rc && missing && !strcmp(f, "config.json"))
                rc = (df_error_set(err, DF_EIO, "%s/config.json: not found (HTTP 404): is this a model repository?",
                                   remote_base(j->r)), DF_EIO);
            if (!rc && !missing) {
                j->plan.meta_files++;
                /* the index is checked before it is kept (the dry run keeps it in memory only) */
                if (!strcmp(f, "model.safetensors.index.json")) rc = install_add_shards(j, data, len, f, err);
                if (!rc && !j->o->dry_run) rc = dc_write_atomic(path, 0, data, len, err);
            }
            free(data);
        }
        free(path);
        if (rc) return rc;
    }
    return DF_OK;
}

static int install_cmp_name(const void *a, const void *b) {
    return strcmp(((const install_shard *)a)->name, ((const install_shard *)b)->name);
}

static int install_shard_names(install_job *j, df_error *err) {
    char *ipath = df_path_join(j->o->dir, "model.safetensors.index.json");
    int rc = DF_OK;
    if (!j->n_sh && access(ipath, F_OK) == 0) {
        size_t len;
        char *text = df_read_file_max(ipath, DF_JSON_FILE_MAX, &len, err);
        rc = text ? install_add_shards(j, text, len, ipath, err) : DF_EIO;
        free(text);
    } else if (!j->n_sh) {
        j->sh = xcalloc(1, sizeof *j->sh);
        j->sh[j->n_sh++].name = xstrdup("model.safetensors");
    }
    free(ipath);
    if (j->n_sh) qsort(j->sh, (size_t)j->n_sh, sizeof *j->sh, install_cmp_name);
    return rc;
}

static char *install_log_path(const install_job *j, const install_shard *s) {
    size_t n = strlen(j->o->dir) + strlen(s->name) + 64;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/" DC_STATE_DIR "/fill-%s.log", j->o->dir, s->name);
    for (char *c = p + strlen(j->o->dir) + strlen(DC_STATE_DIR) + 2; *c; c++)
        if (*c == '/') *c = '_';
    return p;
}

/* Spans a previous INSTALL_ALL run already wrote into the shard (a torn last line is ignored). */
static unsigned char *install_log_load(const install_job *j, const install_shard *s) {
    unsigned char *done = xcalloc((size_t)s->n_holes + 1, 1);
    char *p = install_log_path(j, s);
    size_t len = 0;
    df_error e = {0};   /* a regular file of a bounded size only: a FIFO here would block the fetch for good */
    char *text = access(p, F_OK) ? NULL : df_read_file_max(p, 64 + 48 * ((size_t)s->n_holes + 1), &len, &e);
    if (!text && e.code) fprintf(stderr, "deltafin fetch: %s ignored (filling from the start)\n", e.msg);
    unsigned long long o, l;
    int used = 0;
    for (const char *at = text; at && at < text + len; at += used) {
        const char *eol = memchr(at, '\n', (size_t)(text + len - at));
        if (!eol || sscanf(at, "%llu %llu%n", &o, &l, &used) != 2 || at + used != eol) break;   /* torn line */
        used++;
        int h = dc_shard_hole(s->m, o, l);
        if (h >= 0 && s->m->holes[h].off == o && s->m->holes[h].len == l) done[h] = 1;
    }
    free(text);
    free(p);
    return done;
}

static int install_same_holes(const install_shard *s) {
    for (int h = 0; h < s->n_holes; h++)
        if (s->m->holes[h].off != s->holes[h].span.off || s->m->holes[h].len != s->holes[h].span.len) return 0;
    return 1;
}

/* Reads headers of shards not complete, fills manifest entries (new ones pending) and the plan's sums. */
static int install_plan_shards(install_job *j, df_error *err) {
    install_plan *P = &j->plan;
    const int all = j->o->what == INSTALL_ALL;
    for (int i = 0; i < j->n_sh; i++) {
        install_shard *s = &j->sh[i];
        s->path = df_path_join(j->o->dir, s->name);
        s->m = dc_manifest_find(&j->man, s->name);
        if (!s->m && access(s->path, F_OK) == 0) {
            s->local = 1;   /* a file we did not write: treated as a complete local shard */
            continue;
        }
        if (s->m && s->m->state == DC_COMPLETE) continue;
        int rc = install_read_header(j->r, s, err);
        if (rc) return rc;
        if (!s->m) {
            j->man.shards = xrealloc(j->man.shards, sizeof *j->man.shards * (size_t)(j->man.n + 1));
            dc_shard *m = &j->man.shards[j->man.n++];
            *m = (dc_shard){.name = xstrdup(s->name), .size = s->size, .state = DC_PENDING, .n_holes = s->n_holes,
                            .holes = xcalloc((size_t)s->n_holes + 1, sizeof(dc_span))};
            for (int h = 0; h < s->n_holes; h++) m->holes[h] = s->holes[h].span;
            m->sha256 = s->sha256[0] ? xstrdup(s->sha256) : NULL;
            for (int k = 0; k < j->n_sh; k++)   /* the array moved */
                j->sh[k].m = j->sh[k].local ? NULL : dc_manifest_find(&j->man, j->sh[k].name);
        } else if (s->m->size != s->size || s->m->n_holes != s->n_holes || !install_same_holes(s) ||
                   (s->m->sha256 && s->sha256[0] && strcmp(s->m->sha256, s->sha256))) {
            return df_error_set(err, DF_EFORMAT, "%s: the remote shard (%llu bytes, %d expert spans) differs from "
                                "the one this folder was installed from (%llu bytes, %d spans): a different "
                                "revision? Use a new folder", s->name, (unsigned long long)s->size, s->n_holes,
                                (unsigned long long)s->m->size, s->m->n_holes), DF_EFORMAT;
        }
        if (!s->m->sha256 && s->sha256[0]) s->m->sha256 = xstrdup(s->sha256);
        /* sums of sizes a remote reported saturate instead of wrapping (the disk check then refuses) */
        uint64_t spine = 0;
        for (int r = 0; r < s->n_runs; r++) spine += s->runs[r].len;   /* <= size: parsed disjoint */
        if (s->m->state == DC_PENDING) install_add(&P->spine_bytes, spine);
        /* spans an interrupted INSTALL_ALL already wrote into the shard are not fetched again */
        unsigned char *written = all && s->m->state == DC_SPINE ? install_log_load(j, s) : NULL;
        for (int h = 0; h < s->n_holes; h++) {
            if (!install_wanted(j, &s->holes[h]) || (written && written[h])) continue;
            int cached = dcache_has(j->cache, s->name, s->holes[h].span);
            if (!cached) install_add(&P->expert_bytes, s->holes[h].span.len), P->expert_spans++;
            if (!all && !cached) install_add(&P->disk_bytes, s->holes[h].span.len);
        }
        free(written);
        if (all) install_add(&P->disk_bytes, s->size);   /* the whole shard ends up allocated */
        else if (s->m->state == DC_PENDING) install_add(&P->disk_bytes, spine);   /* sparse: non-expert bytes */
    }
    P->n_shards = j->n_sh;
    for (int i = 0; i < j->n_sh; i++)
        P->spine_shards += j->sh[i].m && j->sh[i].m->state == DC_PENDING, P->n_local += j->sh[i].local;
    return DF_OK;
}

/* Free space where the folder is (a dry run's folder may not exist yet: its nearest existing parent). */
static void install_plan_disk(install_job *j) {
    struct statvfs vs;
    char *at = xstrdup(j->o->dir);
    int found = 1;
    while (found && statvfs(at, &vs)) {
        char *slash = strrchr(at, '/');
        if (!slash || slash == at) found = 0;
        else *slash = 0;
    }
    free(at);
    j->plan.keep_free = (uint64_t)(j->o->min_free_gb * 1e9);
    if (!found) return;
    j->plan.disk_known = 1;
    j->plan.disk_free = (uint64_t)vs.f_bavail * vs.f_frsize;
}

static int install_check_disk(const install_job *j, df_error *err) {
    const install_plan *P = &j->plan;
    if (P->disk_known && (P->disk_bytes > P->disk_free || P->keep_free > P->disk_free - P->disk_bytes))
        return df_error_set(err, DF_EIO, "%s: not starting: this fetch needs %.3f GB and would leave %.3f GB free, "
                            "less than --min-free %.3f GB", j->o->dir, (double)P->disk_bytes / 1e9,
                            ((double)P->disk_free - (double)P->disk_bytes) / 1e9, j->o->min_free_gb), DF_EIO;
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Work */

/* Opens the shard for writing at its full size. A file of another size is never resized in place: a
 * server may map it, and pages past a shrunk end would kill it with SIGBUS. A new file of the right size
 * is renamed over it instead; whoever maps the old one keeps its (unchanged) inode. */
static int install_open_shard(install_shard *s, int *fd, df_error *err) {
    *fd = open(s->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (*fd >= 0 && (fstat(*fd, &sb) || !S_ISREG(sb.st_mode))) {
        close(*fd);
        return df_error_set(err, DF_EIO, "%s: not a regular file", s->path), DF_EIO;
    }
    if (*fd >= 0 && (uint64_t)sb.st_size == s->size) return DF_OK;
    if (*fd >= 0) close(*fd);
    char *tmp;   /* exclusive: a link planted at a predictable name would be truncated through */
    *fd = df_temp_create(s->path, &tmp, err);
    if (*fd < 0) return DF_EIO;
    int e = ftruncate(*fd, (off_t)s->size) ? errno : fchmod(*fd, 0644) ? errno : rename(tmp, s->path) ? errno : 0;
    if (e) {
        df_error_set(err, DF_EIO, "%s: cannot create it at %llu bytes: %s", s->path, (unsigned long long)s->size,
                     strerror(e));
        if (*fd >= 0) close(*fd), unlink(tmp);
    }
    free(tmp);
    return e ? DF_EIO : DF_OK;
}

static int install_sync(int fd, const char *path, df_error *err) {
    if (fsync(fd)) return df_error_set(err, DF_EIO, "%s: fsync: %s", path, strerror(errno)), DF_EIO;
    return DF_OK;
}

static int install_spine(install_job *j, install_shard *s, df_error *err) {
    int fd, rc = install_open_shard(s, &fd, err);
    if (rc) return rc;
    remote_req *q = xcalloc((size_t)s->n_runs, sizeof *q);
    install_sink *sk = xcalloc((size_t)s->n_runs, sizeof *sk);
    for (int i = 0; i < s->n_runs; i++) {
        sk[i] = (install_sink){fd, s->runs[i].off, s->path, j};
        q[i] = (remote_req){.file = s->name, .off = s->runs[i].off, .len = s->runs[i].len, .what = "spine bytes",
                            .sink = install_sink_write, .ctx = &sk[i]};
    }
    rc = remote_fetch(j->r, q, s->n_runs, err);
    if (!rc) rc = install_sync(fd, s->path, err);
    close(fd);
    free(q);
    free(sk);
    if (rc) return rc;
    s->m->state = DC_SPINE;
    return dc_manifest_save(j->o->dir, &j->man, err);
}

static char *install_what_span(const fplan_hole *h) {
    char *w = xmalloc(64);
    snprintf(w, 64, "expert %d of layer %d", h->expert, h->layer);
    return w;
}

/* INSTALL_LAYERS: the selected experts into the disk cache, a batch of 2*jobs at a time. */
static int install_cache_layers(install_job *j, install_shard *s, df_error *err) {
    int batch = 2 * j->jobs, rc = DF_OK;
    remote_req *q = xcalloc((size_t)batch, sizeof *q);
    int *idx = xcalloc((size_t)batch, sizeof *idx);
    for (int h0 = 0; h0 < s->n_holes && !rc;) {
        int n = 0;
        for (; h0 < s->n_holes && n < batch; h0++) {
            fplan_hole *h = &s->holes[h0];
            if (!install_wanted(j, h) || dcache_has(j->cache, s->name, h->span)) continue;
            q[n] = (remote_req){.file = s->name, .off = h->span.off, .len = h->span.len, .what = install_what_span(h),
                                .dst = xmalloc(h->span.len)};
            idx[n++] = h0;
        }
        rc = remote_fetch(j->r, q, n, err);
        for (int i = 0; i < n; i++) {
            if (!rc) rc = dcache_put(j->cache, s->name, s->holes[idx[i]].span, q[i].dst, q[i].what, err);
            if (!rc) j->done += q[i].len;
            free(q[i].dst);
            free((char *)q[i].what);
        }
        install_progress(j, 0);
    }
    free(q);
    free(idx);
    return rc;
}

/* A cached span into the shard, only once its checksum holds: DF_EFORMAT when the entry is corrupt. */
static int install_copy_cached(install_job *j, install_shard *s, int fd, const fplan_hole *h, df_error *err) {
    uint8_t *data = xmalloc(h->span.len);
    char *what = install_what_span(h);
    int rc = dcache_load(j->cache, s->name, h->span, data, what, err);
    install_sink sk = {fd, h->span.off, s->path, NULL};   /* the plan did not count cached spans as bytes to fetch */
    if (!rc) rc = install_sink_write(&sk, 0, data, h->span.len, err);
    free(what);
    free(data);
    return rc;
}

/* The filled shard against the SHA-256 the hub published. On a mismatch nothing of it can be trusted: it
 * goes back to pending (the next run fetches it whole again) and the run fails. */
static int install_verify_shard(install_job *j, install_shard *s, const char *logp, df_error *err) {
    int fd = df_open_regular(s->path, O_RDONLY, err);
    if (fd < 0) return DF_EIO;
    df_sha256 h;
    df_sha256_init(&h);
    size_t cap = 4u << 20;
    uint8_t *buf = xmalloc(cap);
    ssize_t n;
    while ((n = read(fd, buf, cap)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0) df_sha256_update(&h, buf, (size_t)n);
    int e = n < 0 ? errno : 0;
    close(fd);
    free(buf);
    if (e) return df_error_set(err, DF_EIO, "%s: reading it back to verify: %s", s->path, strerror(e)), DF_EIO;
    char hex[65];
    df_sha256_hex(&h, hex);
    if (!strcmp(hex, s->m->sha256)) {
        s->m->verified = 1;
        return DF_OK;
    }
    char want[65];
    snprintf(want, sizeof want, "%s", s->m->sha256);
    s->m->state = DC_PENDING;
    free(s->m->sha256);   /* the next run takes the remote's hash afresh */
    s->m->sha256 = NULL;
    unlink(logp);
    dcache_drop_shard(j->cache, s->name);
    int rc = dc_manifest_save(j->o->dir, &j->man, err);
    if (rc) return rc;
    return df_error_set(err, DF_EFORMAT, "%s: SHA-256 after fetch --all is %s, the remote publishes %s: the shard "
                        "is corrupt and was reset; run fetch again", s->path, hex, want), DF_EFORMAT;
}

/* INSTALL_ALL: every hole of a spine-only shard written in place, then the shard marked complete. */
static int install_fill_shard(install_job *j, install_shard *s, df_error *err) {
    int fd, rc = install_open_shard(s, &fd, err);
    if (rc) return rc;
    unsigned char *done = install_log_load(j, s);
    char *logp = install_log_path(j, s);
    int lfd = open(logp, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat lsb;
    if (lfd >= 0 && (fstat(lfd, &lsb) || !S_ISREG(lsb.st_mode))) close(lfd), lfd = -1, errno = EINVAL;
    FILE *log = lfd >= 0 ? fdopen(lfd, "a") : NULL;
    if (lfd >= 0 && !log) close(lfd);
    if (!log) rc = (df_error_set(err, DF_EIO, "%s: %s", logp, strerror(errno)), DF_EIO);
    int batch = 4 * j->jobs;
    remote_req *q = xcalloc((size_t)batch, sizeof *q);
    install_sink *sk = xcalloc((size_t)batch, sizeof *sk);
    int *idx = xcalloc((size_t)batch, sizeof *idx);
    for (int h0 = 0; h0 < s->n_holes && !rc;) {
        int n = 0;
        for (; h0 < s->n_holes && n < batch && !rc; h0++) {
            fplan_hole *h = &s->holes[h0];
            if (done[h0]) continue;
            if (dcache_has(j->cache, s->name, h->span)) {
                df_error cerr = {0};
                if (!install_copy_cached(j, s, fd, h, &cerr)) {
                    idx[n] = h0;
                    q[n++] = (remote_req){.len = 0};
                    continue;
                }
                /* corrupt, or gone since dcache_has (evicted by another process): the network has it */
                if (j->ev && j->ev->warning) {
                    char msg[sizeof cerr.msg + 32];
                    snprintf(msg, sizeof msg, "%s; fetching it again", cerr.msg);
                    j->ev->warning(j->ev->ctx, msg);
                }
                if (cerr.code == DF_EFORMAT) dcache_remove(j->cache, s->name, h->span);
                install_add(&j->total, h->span.len);   /* planned as cached: now downloaded after all */
            }
            sk[n] = (install_sink){fd, h->span.off, s->path, j};
            q[n] = (remote_req){.file = s->name, .off = h->span.off, .len = h->span.len, .what = install_what_span(h),
                                .sink = install_sink_write, .ctx = &sk[n]};
            idx[n++] = h0;
        }
        /* fetch the ones that need the network (packed to the front) */
        remote_req *net = xcalloc((size_t)n + 1, sizeof *net);
        int nn = 0;
        for (int i = 0; i < n; i++)
            if (q[i].len) net[nn++] = q[i];
        if (!rc) rc = remote_fetch(j->r, net, nn, err);
        for (int i = 0; i < nn; i++) free((char *)net[i].what);
        free(net);
        if (!rc) rc = install_sync(fd, s->path, err);
        for (int i = 0; i < n && !rc; i++) fprintf(log, "%llu %llu\n", (unsigned long long)s->holes[idx[i]].span.off,
                                                  (unsigned long long)s->holes[idx[i]].span.len);
        if (!rc && (fflush(log) || fsync(fileno(log))))
            rc = (df_error_set(err, DF_EIO, "%s: %s", logp, strerror(errno)), DF_EIO);
    }
    free(q);
    free(sk);
    free(idx);
    free(done);
    if (log) fclose(log);
    close(fd);
    if (!rc && s->m->sha256) rc = install_verify_shard(j, s, logp, err);
    if (!rc) {
        s->m->state = DC_COMPLETE;
        rc = dc_manifest_save(j->o->dir, &j->man, err);
    }
    if (!rc) {
        dcache_drop_shard(j->cache, s->name);
        unlink(logp);
    }
    free(logp);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */

static int install_check_opts(const install_opts *o, df_error *err) {
    if (!o->from || !o->dir || !*o->dir)
        return df_error_set(err, DF_EINVAL, "install: a source and a folder are both needed"), DF_EINVAL;
    if (o->what != INSTALL_SPINE && o->what != INSTALL_LAYERS && o->what != INSTALL_ALL)
        return df_error_set(err, DF_EINVAL, "install: unknown choice of what to install (%d)", (int)o->what),
               DF_EINVAL;
    if (o->what == INSTALL_LAYERS && (!o->layers || o->n_layers <= 0))
        return df_error_set(err, DF_EINVAL, "install: layers chosen but none listed"), DF_EINVAL;
    if (o->jobs < 0 || o->jobs > 64)
        return df_error_set(err, DF_EINVAL, "install: jobs %d is outside 1..64", o->jobs), DF_EINVAL;
    if (!(o->min_free_gb >= 0 && o->min_free_gb <= 1e9) || !(o->stall_s >= 0))
        return df_error_set(err, DF_EINVAL, "install: min_free_gb %g or stall_s %g out of range", o->min_free_gb,
                            o->stall_s), DF_EINVAL;
    return DF_OK;
}

static int install_job_work(install_job *j, df_error *err) {
    char *base = remote_resolve_base(j->o->from, err);
    if (!base) return DF_EINVAL;
    remote_opts ro = {.jobs = j->jobs, .stall_s = j->o->stall_s};
    int rc = remote_open(&j->r, base, &ro, err), found;
    free(base);
    if (!rc && !j->o->dry_run) rc = df_mkdir_p(j->o->dir, err);
    if (!rc) rc = dc_manifest_load(j->o->dir, &j->man, &found, err);
    if (!rc && !j->man.source) j->man.source = xstrdup(j->o->from);
    if (!rc) rc = dcache_open(&j->cache, j->o->dir, (uint64_t)(j->o->min_free_gb * 1e9), err);
    if (!rc) rc = install_meta(j, err);
    if (!rc) rc = install_shard_names(j, err);
    if (!rc) rc = install_plan_shards(j, err);
    if (rc) return rc;
    install_plan_disk(j);
    j->planned = 1;
    if (j->ev && j->ev->plan) j->ev->plan(j->ev->ctx, &j->plan);
    rc = install_check_disk(j, err);
    if (rc || j->o->dry_run) return rc;
    rc = dc_manifest_save(j->o->dir, &j->man, err);
    j->total = j->plan.spine_bytes + j->plan.expert_bytes;
    for (int i = 0; i < j->n_sh && !rc; i++)
        if (j->sh[i].m && j->sh[i].m->state == DC_PENDING) rc = install_spine(j, &j->sh[i], err);
    for (int i = 0; i < j->n_sh && !rc; i++) {
        install_shard *s = &j->sh[i];
        if (!s->m || s->m->state != DC_SPINE) continue;
        rc = j->o->what == INSTALL_ALL      ? install_fill_shard(j, s, err)
             : j->o->what == INSTALL_LAYERS ? install_cache_layers(j, s, err)
                                            : DF_OK;
    }
    if (!rc) install_progress(j, 1);
    return rc;
}

int install_job_run(const install_opts *o, const install_events *ev, install_result *res, df_error *err) {
    if (res) memset(res, 0, sizeof *res);
    int rc = install_check_opts(o, err);
    if (rc) return rc;
    install_job j = {.o = o, .ev = ev, .jobs = o->jobs ? o->jobs : 8};
    rc = install_job_work(&j, err);
    if (res) {
        if (j.planned) res->plan = j.plan;
        if (j.r) remote_get_stats(j.r, &res->net);
    }
    for (int i = 0; i < j.n_sh; i++) {
        free(j.sh[i].name);
        free(j.sh[i].path);
        free(j.sh[i].runs);
        free(j.sh[i].holes);
    }
    free(j.sh);
    dc_manifest_free(&j.man);
    dcache_free(j.cache);
    remote_free(j.r);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */

int install_list_experts(remote *r, install_span_list *out, df_error *err) {
    memset(out, 0, sizeof *out);
    char *data;
    size_t len;
    int missing;
    int rc = remote_get_file(r, "model.safetensors.index.json", &data, &len, &missing, err);
    if (rc) return rc;
    if (missing) {
        out->files = xcalloc(1, sizeof *out->files);
        out->files[out->n_files++] = xstrdup("model.safetensors");
    } else {
        rc = fplan_index_shards(data, len, "model.safetensors.index.json", &out->files, &out->n_files, err);
        free(data);
    }
    for (int i = 0; i < out->n_files && !rc; i++) {
        install_shard s = {.name = out->files[i]};
        rc = install_read_header(r, &s, err);
        out->v = xrealloc(out->v, sizeof *out->v * (size_t)(out->n + s.n_holes + 1));
        for (int h = 0; !rc && h < s.n_holes; h++)
            out->v[out->n++] = (install_span){out->files[i], s.holes[h].span.off, s.holes[h].span.len,
                                              s.holes[h].layer, s.holes[h].expert};
        free(s.runs);
        free(s.holes);
    }
    return rc;
}

void install_span_list_free(install_span_list *l) {
    for (int i = 0; i < l->n_files; i++) free(l->files[i]);
    free(l->files);
    free(l->v);
    memset(l, 0, sizeof *l);
}
