/* cmd_fetch.c — `deltafin fetch --from URL -m DIR [--spine | --all | --layers 1-40,92]`: installs a model
 * from a repository in the Hugging Face hub layout, all of it or just its spine.
 *
 * Order of work, chosen so an interruption at any point leaves a folder the next run completes: metadata
 * files (each written atomically), then the manifest listing every shard as pending with its holes (the
 * routed-expert spans, found from the shard headers by storage/fetch_plan.c), then per shard a sparse file
 * of full size holding the header and every non-expert byte, synced before the manifest marks it "spine".
 * --layers puts the experts of those layers into the disk cache (one atomic, checksummed entry per span).
 * --all fills each shard's holes in place (from the cache when the entry's checksum holds, else one range
 * request per span), logging finished spans after each synced batch, checks the whole shard against the
 * SHA-256 the hub publishes (when it does), and marks it complete, dropping its cache entries. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"
#include "fetch.h"
#include "common/hash.h"
#include "common/util.h"
#include "storage/dcache.h"
#include "storage/fetch_plan.h"
#include "storage/remote.h"

#define FETCH_MAX_LAYERS 4096

static const char *const fetch_meta_files[] = {
    "config.json", "generation_config.json", "tokenizer_config.json", "tiktoken.model", "tokenizer.json",
    "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json",
};

typedef struct fetch_opts {
    const char *from, *dir;
    int all, spine, dry_run, jobs;
    double min_free_gb, stall_s;
    unsigned char layers[FETCH_MAX_LAYERS];
    int any_layer;
} fetch_opts;

typedef fplan_hole fetch_hole;

typedef struct fetch_shard {
    char *name;
    char *path;
    int local;               /* a complete local file the manifest does not track */
    dc_shard *m;             /* its manifest entry (NULL when local) */
    uint64_t size, header_len;
    char sha256[65];         /* as the remote published it, or "" */
    dc_span *runs;           /* non-expert byte runs (header included) */
    int n_runs;
    fetch_hole *holes;       /* parallel to m->holes */
    int n_holes;
} fetch_shard;

typedef struct fetch_progress {
    uint64_t total, done;
    double t0, last;
    int tty;
} fetch_progress;

static void fetch_usage(FILE *f) {
    fprintf(f, "usage: deltafin fetch --from URL -m DIR [--spine | --all | --layers 1-40,92] [--dry-run]\n"
               "                      [--min-free GB] [--jobs N] [--stall-timeout S]\n"
               "  --from URL        repository: org/name[@revision] (via $HF_ENDPOINT) or an http(s) URL of\n"
               "                    {endpoint}/{repo}/resolve/{revision}; $HF_TOKEN is sent as a bearer token\n"
               "  -m, --model DIR   install folder (created if needed)\n"
               "  --spine           config, tokenizer, index, shard headers and every non-expert tensor (default)\n"
               "  --all             also every routed expert: a complete install\n"
               "  --layers LIST     the spine plus the experts of these decoder layers (into the disk cache)\n"
               "  --dry-run         print what would be downloaded and the disk it needs\n"
               "  --min-free GB     refuse to start if it would leave less free disk than this (default 1)\n"
               "  --jobs N          parallel connections (default 8)\n");
}

/* ---------------------------------------------------------------------------------------------------- */
/* Progress: a bar on a TTY, a plain line every few seconds otherwise. */

static void fetch_show(fetch_progress *p, int final) {
    double now = df_now(), dt = now - p->t0;
    if (!final && now - p->last < (p->tty ? 0.2 : 5.0)) return;
    p->last = now;
    double rate = dt > 0 ? (double)p->done / dt : 0;
    double eta = rate > 0 ? (double)(p->total - DF_MIN(p->done, p->total)) / rate : 0;
    double pct = p->total ? 100.0 * (double)p->done / (double)p->total : 100.0;
    if (p->tty) {
        char bar[31];
        int fill = (int)(pct * 30 / 100);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[30] = 0;
        fprintf(stderr, "\r\033[K[%s] %.2f/%.2f GiB %.1f MB/s ETA %.0f s", bar, (double)p->done / (1 << 30),
                (double)p->total / (1 << 30), rate / 1e6, eta);
        if (final) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "fetch: %llu of %llu bytes (%.0f%%), %.1f MB/s, ETA %.0f s\n", (unsigned long long)p->done,
                (unsigned long long)p->total, pct, rate / 1e6, eta);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* Sinks: bytes of a range straight into a file at its offset. */

typedef struct fetch_sink {
    int fd;
    uint64_t off;
    const char *path;
    fetch_progress *p;       /* NULL: bytes that do not count as downloaded (copied from the cache) */
} fetch_sink;

static int fetch_sink_write(void *ctx, uint64_t at, const uint8_t *d, size_t n, df_error *err) {
    fetch_sink *s = ctx;
    while (n) {
        ssize_t w = pwrite(s->fd, d, n, (off_t)(s->off + at));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return df_error_set(err, DF_EIO, "%s: %s%s", s->path, e == ENOSPC || e == EFBIG ? "disk full: " : "",
                                strerror(e)), DF_EIO;
        }
        d += w, n -= (size_t)w, at += (uint64_t)w;
        if (s->p) s->p->done += (uint64_t)w;
    }
    if (s->p) fetch_show(s->p, 0);
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Shard headers: which bytes are routed experts (holes) and which are not (runs). */

static int fetch_read_header(remote *r, fetch_shard *s, df_error *err) {
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

typedef struct fetch_job {
    fetch_opts o;
    remote *r;
    dcache *cache;
    dc_manifest man;
    int man_found;
    fetch_shard *sh;
    int n_sh;
    fetch_progress prog;
    /* plan */
    int meta_missing;
    uint64_t spine_bytes, expert_bytes, disk_bytes;
    int64_t expert_spans;
} fetch_job;

static void fetch_add(uint64_t *a, uint64_t b) { *a = *a > UINT64_MAX - b ? UINT64_MAX : *a + b; }

static int fetch_wanted(const fetch_job *j, const fetch_hole *h) {
    if (j->o.all) return 1;
    return h->layer >= 0 && h->layer < FETCH_MAX_LAYERS && j->o.layers[h->layer];
}

/* Adds the shard files named by an index (see fplan_index_shards) to j->sh, which holds none yet. */
static int fetch_add_shards(fetch_job *j, const char *json, size_t len, const char *src, df_error *err) {
    char **names = NULL;
    int n = 0, rc = fplan_index_shards(json, len, src, &names, &n, err);
    DF_ASSERT(!j->sh && !j->n_sh);
    j->sh = xcalloc((size_t)n + 1, sizeof *j->sh);
    for (int i = 0; i < n; i++) j->sh[i].name = names[i];
    j->n_sh = n;
    free(names);
    return rc;
}

static int fetch_meta(fetch_job *j, df_error *err) {
    for (size_t i = 0; i < sizeof fetch_meta_files / sizeof fetch_meta_files[0]; i++) {
        const char *f = fetch_meta_files[i];
        char *path = df_path_join(j->o.dir, f);
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
                j->meta_missing++;
                /* the index is checked before it is kept (the dry run keeps it in memory only) */
                if (!strcmp(f, "model.safetensors.index.json")) rc = fetch_add_shards(j, data, len, f, err);
                if (!rc && !j->o.dry_run) rc = dc_write_atomic(path, 0, data, len, err);
            }
            free(data);
        }
        free(path);
        if (rc) return rc;
    }
    return DF_OK;
}

static int fetch_cmp_name(const void *a, const void *b) {
    return strcmp(((const fetch_shard *)a)->name, ((const fetch_shard *)b)->name);
}

static int fetch_shard_names(fetch_job *j, df_error *err) {
    char *ipath = df_path_join(j->o.dir, "model.safetensors.index.json");
    int rc = DF_OK;
    if (!j->n_sh && access(ipath, F_OK) == 0) {
        size_t len;
        char *text = df_read_file_max(ipath, DF_JSON_FILE_MAX, &len, err);
        rc = text ? fetch_add_shards(j, text, len, ipath, err) : DF_EIO;
        free(text);
    } else if (!j->n_sh) {
        j->sh = xcalloc(1, sizeof *j->sh);
        j->sh[j->n_sh++].name = xstrdup("model.safetensors");
    }
    free(ipath);
    if (j->n_sh) qsort(j->sh, (size_t)j->n_sh, sizeof *j->sh, fetch_cmp_name);
    return rc;
}

static unsigned char *fetch_log_load(const fetch_job *j, const fetch_shard *s);

static int fetch_same_holes(const fetch_shard *s) {
    for (int h = 0; h < s->n_holes; h++)
        if (s->m->holes[h].off != s->holes[h].span.off || s->m->holes[h].len != s->holes[h].span.len) return 0;
    return 1;
}

/* Reads headers of shards not complete, fills manifest entries (new ones pending). */
static int fetch_plan(fetch_job *j, df_error *err) {
    for (int i = 0; i < j->n_sh; i++) {
        fetch_shard *s = &j->sh[i];
        s->path = df_path_join(j->o.dir, s->name);
        s->m = dc_manifest_find(&j->man, s->name);
        if (!s->m && access(s->path, F_OK) == 0) {
            s->local = 1;   /* a file we did not write: treated as a complete local shard */
            continue;
        }
        if (s->m && s->m->state == DC_COMPLETE) continue;
        int rc = fetch_read_header(j->r, s, err);
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
        } else if (s->m->size != s->size || s->m->n_holes != s->n_holes || !fetch_same_holes(s) ||
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
        if (s->m->state == DC_PENDING) fetch_add(&j->spine_bytes, spine);
        /* spans an interrupted --all already wrote into the shard are not fetched again */
        unsigned char *written = j->o.all && s->m->state == DC_SPINE ? fetch_log_load(j, s) : NULL;
        for (int h = 0; h < s->n_holes; h++) {
            if (!fetch_wanted(j, &s->holes[h]) || (written && written[h])) continue;
            int cached = dcache_has(j->cache, s->name, s->holes[h].span);
            if (!cached) fetch_add(&j->expert_bytes, s->holes[h].span.len), j->expert_spans++;
            if (!j->o.all && !cached) fetch_add(&j->disk_bytes, s->holes[h].span.len);
        }
        free(written);
        if (j->o.all) fetch_add(&j->disk_bytes, s->size);   /* the whole shard ends up allocated */
        else if (s->m->state == DC_PENDING) fetch_add(&j->disk_bytes, spine);   /* sparse: non-expert bytes */
    }
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Work */

/* Opens the shard for writing at its full size. A file of another size is never resized in place: a
 * server may map it, and pages past a shrunk end would kill it with SIGBUS. A new file of the right size
 * is renamed over it instead; whoever maps the old one keeps its (unchanged) inode. */
static int fetch_open_shard(fetch_shard *s, int *fd, df_error *err) {
    *fd = open(s->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (*fd >= 0 && (fstat(*fd, &sb) || !S_ISREG(sb.st_mode))) {
        close(*fd);
        return df_error_set(err, DF_EIO, "%s: not a regular file", s->path), DF_EIO;
    }
    if (*fd >= 0 && (uint64_t)sb.st_size == s->size) return DF_OK;
    if (*fd >= 0) close(*fd);
    size_t n = strlen(s->path) + 16;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.new", s->path);
    *fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    int e = *fd < 0 ? errno : ftruncate(*fd, (off_t)s->size) ? errno : rename(tmp, s->path) ? errno : 0;
    if (e) {
        df_error_set(err, DF_EIO, "%s: cannot create it at %llu bytes: %s", s->path, (unsigned long long)s->size,
                     strerror(e));
        if (*fd >= 0) close(*fd), unlink(tmp);
    }
    free(tmp);
    return e ? DF_EIO : DF_OK;
}

static int fetch_sync(int fd, const char *path, df_error *err) {
    if (fsync(fd)) return df_error_set(err, DF_EIO, "%s: fsync: %s", path, strerror(errno)), DF_EIO;
    return DF_OK;
}

static int fetch_spine(fetch_job *j, fetch_shard *s, df_error *err) {
    int fd, rc = fetch_open_shard(s, &fd, err);
    if (rc) return rc;
    remote_req *q = xcalloc((size_t)s->n_runs, sizeof *q);
    fetch_sink *sk = xcalloc((size_t)s->n_runs, sizeof *sk);
    for (int i = 0; i < s->n_runs; i++) {
        sk[i] = (fetch_sink){fd, s->runs[i].off, s->path, &j->prog};
        q[i] = (remote_req){.file = s->name, .off = s->runs[i].off, .len = s->runs[i].len, .what = "spine bytes",
                            .sink = fetch_sink_write, .ctx = &sk[i]};
    }
    rc = remote_fetch(j->r, q, s->n_runs, err);
    if (!rc) rc = fetch_sync(fd, s->path, err);
    close(fd);
    free(q);
    free(sk);
    if (rc) return rc;
    s->m->state = DC_SPINE;
    return dc_manifest_save(j->o.dir, &j->man, err);
}

static char *fetch_what(const fetch_hole *h) {
    char *w = xmalloc(64);
    snprintf(w, 64, "expert %d of layer %d", h->expert, h->layer);
    return w;
}

/* --layers: the selected experts into the disk cache, a batch of 2*jobs at a time. */
static int fetch_cache_layers(fetch_job *j, fetch_shard *s, df_error *err) {
    int batch = 2 * j->o.jobs, rc = DF_OK;
    remote_req *q = xcalloc((size_t)batch, sizeof *q);
    int *idx = xcalloc((size_t)batch, sizeof *idx);
    for (int h0 = 0; h0 < s->n_holes && !rc;) {
        int n = 0;
        for (; h0 < s->n_holes && n < batch; h0++) {
            fetch_hole *h = &s->holes[h0];
            if (!fetch_wanted(j, h) || dcache_has(j->cache, s->name, h->span)) continue;
            q[n] = (remote_req){.file = s->name, .off = h->span.off, .len = h->span.len, .what = fetch_what(h),
                                .dst = xmalloc(h->span.len)};
            idx[n++] = h0;
        }
        rc = remote_fetch(j->r, q, n, err);
        for (int i = 0; i < n; i++) {
            if (!rc) rc = dcache_put(j->cache, s->name, s->holes[idx[i]].span, q[i].dst, q[i].what, err);
            if (!rc) j->prog.done += q[i].len;
            free(q[i].dst);
            free((char *)q[i].what);
        }
        fetch_show(&j->prog, 0);
    }
    free(q);
    free(idx);
    return rc;
}

static char *fetch_log_path(const fetch_job *j, const fetch_shard *s) {
    size_t n = strlen(j->o.dir) + strlen(s->name) + 64;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/" DC_STATE_DIR "/fill-%s.log", j->o.dir, s->name);
    for (char *c = p + strlen(j->o.dir) + strlen(DC_STATE_DIR) + 2; *c; c++)
        if (*c == '/') *c = '_';
    return p;
}

/* Spans a previous --all already wrote into the shard (a torn last line is ignored). */
static unsigned char *fetch_log_load(const fetch_job *j, const fetch_shard *s) {
    unsigned char *done = xcalloc((size_t)s->n_holes + 1, 1);
    char *p = fetch_log_path(j, s);
    FILE *f = fopen(p, "r");
    unsigned long long o, l;
    char nl;
    while (f && fscanf(f, "%llu %llu%c", &o, &l, &nl) == 3 && nl == '\n') {
        int h = dc_shard_hole(s->m, o, l);
        if (h >= 0 && s->m->holes[h].off == o && s->m->holes[h].len == l) done[h] = 1;
    }
    if (f) fclose(f);
    free(p);
    return done;
}

/* A cached span into the shard, only once its checksum holds: DF_EFORMAT when the entry is corrupt. */
static int fetch_copy_cached(fetch_job *j, fetch_shard *s, int fd, const fetch_hole *h, df_error *err) {
    uint8_t *data = xmalloc(h->span.len);
    char *what = fetch_what(h);
    int rc = dcache_load(j->cache, s->name, h->span, data, what, err);
    fetch_sink sk = {fd, h->span.off, s->path, NULL};   /* the plan did not count cached spans as bytes to fetch */
    if (!rc) rc = fetch_sink_write(&sk, 0, data, h->span.len, err);
    free(what);
    free(data);
    return rc;
}

/* The filled shard against the SHA-256 the hub published. On a mismatch nothing of it can be trusted: it
 * goes back to pending (the next run fetches it whole again) and the fetch fails. */
static int fetch_verify_shard(fetch_job *j, fetch_shard *s, const char *logp, df_error *err) {
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
    int rc = dc_manifest_save(j->o.dir, &j->man, err);
    if (rc) return rc;
    return df_error_set(err, DF_EFORMAT, "%s: SHA-256 after fetch --all is %s, the remote publishes %s: the shard "
                        "is corrupt and was reset; run fetch again", s->path, hex, want), DF_EFORMAT;
}

/* --all: every hole of a spine-only shard written in place, then the shard marked complete. */
static int fetch_fill_shard(fetch_job *j, fetch_shard *s, df_error *err) {
    int fd, rc = fetch_open_shard(s, &fd, err);
    if (rc) return rc;
    unsigned char *done = fetch_log_load(j, s);
    char *logp = fetch_log_path(j, s);
    FILE *log = fopen(logp, "a");
    if (!log) rc = (df_error_set(err, DF_EIO, "%s: %s", logp, strerror(errno)), DF_EIO);
    int batch = 4 * j->o.jobs;
    remote_req *q = xcalloc((size_t)batch, sizeof *q);
    fetch_sink *sk = xcalloc((size_t)batch, sizeof *sk);
    int *idx = xcalloc((size_t)batch, sizeof *idx);
    for (int h0 = 0; h0 < s->n_holes && !rc;) {
        int n = 0;
        for (; h0 < s->n_holes && n < batch && !rc; h0++) {
            fetch_hole *h = &s->holes[h0];
            if (done[h0]) continue;
            if (dcache_has(j->cache, s->name, h->span)) {
                df_error cerr = {0};
                if (!fetch_copy_cached(j, s, fd, h, &cerr)) {
                    idx[n] = h0;
                    q[n++] = (remote_req){.len = 0};
                    continue;
                }
                /* corrupt, or gone since dcache_has (evicted by another process): the network has it */
                fprintf(stderr, "deltafin fetch: warning: %s; fetching it again\n", cerr.msg);
                if (cerr.code == DF_EFORMAT) dcache_remove(j->cache, s->name, h->span);
            }
            sk[n] = (fetch_sink){fd, h->span.off, s->path, &j->prog};
            q[n] = (remote_req){.file = s->name, .off = h->span.off, .len = h->span.len, .what = fetch_what(h),
                                .sink = fetch_sink_write, .ctx = &sk[n]};
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
        if (!rc) rc = fetch_sync(fd, s->path, err);
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
    if (!rc && s->m->sha256) rc = fetch_verify_shard(j, s, logp, err);
    if (!rc) {
        s->m->state = DC_COMPLETE;
        rc = dc_manifest_save(j->o.dir, &j->man, err);
    }
    if (!rc) {
        dcache_drop_shard(j->cache, s->name);
        unlink(logp);
    }
    free(logp);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */

static int fetch_parse_layers(fetch_opts *o, const char *spec) {
    const char *p = spec;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0 || a >= FETCH_MAX_LAYERS) return -1;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a || b >= FETCH_MAX_LAYERS) return -1;
            p = end;
        }
        for (long l = a; l <= b; l++) o->layers[l] = 1;
        o->any_layer = 1;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return o->any_layer ? 0 : -1;
}

static int fetch_parse_args(fetch_opts *o, int argc, char **argv) {
    static const struct option lo[] = {
        {"from", 1, 0, 'f'},  {"model", 1, 0, 'm'},    {"spine", 0, 0, 's'}, {"all", 0, 0, 'a'},
        {"layers", 1, 0, 'l'}, {"dry-run", 0, 0, 'd'}, {"min-free", 1, 0, 'F'}, {"jobs", 1, 0, 'j'},
        {"stall-timeout", 1, 0, 'S'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->jobs = 8;
    o->min_free_gb = 1;
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "m:j:h", lo, NULL)) != -1) {
        switch (c) {
        case 'f': o->from = optarg; break;
        case 'm': o->dir = optarg; break;
        case 's': o->spine = 1; break;
        case 'a': o->all = 1; break;
        case 'l':
            if (fetch_parse_layers(o, optarg)) {
                fprintf(stderr, "deltafin fetch: --layers '%s': expected a list like 1-40,92\n", optarg);
                return 2;
            }
            break;
        case 'd': o->dry_run = 1; break;
        case 'F':
            o->min_free_gb = strtod(optarg, &end);
            if (end == optarg || *end || !(o->min_free_gb >= 0 && o->min_free_gb <= 1e9)) return fetch_usage(stderr), 2;
            break;
        case 'j':
            o->jobs = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end || o->jobs < 1 || o->jobs > 64) return fetch_usage(stderr), 2;
            break;
        case 'S':
            o->stall_s = strtod(optarg, &end);
            if (end == optarg || *end || o->stall_s <= 0) return fetch_usage(stderr), 2;
            break;
        case 'h': fetch_usage(stdout); return 1;
        default: fetch_usage(stderr); return 2;
        }
    }
    if (!o->from || !o->dir || optind < argc || o->all + o->spine + o->any_layer > 1) {
        fetch_usage(stderr);
        return 2;
    }
    return 0;
}

static void fetch_job_free(fetch_job *j) {
    for (int i = 0; i < j->n_sh; i++) {
        free(j->sh[i].name);
        free(j->sh[i].path);
        free(j->sh[i].runs);
        free(j->sh[i].holes);
    }
    free(j->sh);
    dc_manifest_free(&j->man);
    dcache_free(j->cache);
    remote_free(j->r);
}

static int fetch_check_disk(fetch_job *j, df_error *err) {
    struct statvfs vs;
    char *at = xstrdup(j->o.dir);   /* a dry run's folder may not exist yet: ask its nearest parent */
    while (statvfs(at, &vs)) {
        char *slash = strrchr(at, '/');
        if (!slash || slash == at) {
            free(at);
            return DF_OK;
        }
        *slash = 0;
    }
    free(at);
    uint64_t free_b = (uint64_t)vs.f_bavail * vs.f_frsize, keep = (uint64_t)(j->o.min_free_gb * 1e9);
    printf("disk: needs %.3f GB, %.3f GB free in %s, keeping at least %.3f GB free\n", (double)j->disk_bytes / 1e9,
           (double)free_b / 1e9, j->o.dir, (double)keep / 1e9);
    if (j->disk_bytes > free_b || keep > free_b - j->disk_bytes)
        return df_error_set(err, DF_EIO, "%s: not starting: this fetch needs %.3f GB and would leave %.3f GB free, "
                            "less than --min-free %.3f GB", j->o.dir, (double)j->disk_bytes / 1e9,
                            ((double)free_b - (double)j->disk_bytes) / 1e9, j->o.min_free_gb), DF_EIO;
    return DF_OK;
}

static int fetch_run(fetch_job *j, df_error *err) {
    char *base = remote_resolve_base(j->o.from, err);
    if (!base) return DF_EINVAL;
    remote_opts ro = {.jobs = j->o.jobs, .stall_s = j->o.stall_s};
    int rc = remote_open(&j->r, base, &ro, err);
    free(base);
    if (!rc && !j->o.dry_run) rc = dc_mkdir_p(j->o.dir, err);
    if (!rc) rc = dc_manifest_load(j->o.dir, &j->man, &j->man_found, err);
    if (!rc && !j->man.source) j->man.source = xstrdup(j->o.from);
    if (!rc) rc = dcache_open(&j->cache, j->o.dir, (uint64_t)(j->o.min_free_gb * 1e9), err);
    if (!rc) rc = fetch_meta(j, err);
    if (!rc) rc = fetch_shard_names(j, err);
    if (!rc) rc = fetch_plan(j, err);
    if (rc) return rc;
    int pend = 0, local = 0;
    for (int i = 0; i < j->n_sh; i++) pend += j->sh[i].m && j->sh[i].m->state == DC_PENDING, local += j->sh[i].local;
    printf("%s: %d metadata files to get; %d shards (%d local), spine of %d to fetch: %.3f GB; %lld expert spans "
           "to fetch: %.3f GB\n", j->o.dry_run ? "would fetch" : "fetching", j->meta_missing, j->n_sh, local, pend,
           (double)j->spine_bytes / 1e9, (long long)j->expert_spans, (double)j->expert_bytes / 1e9);
    rc = fetch_check_disk(j, err);
    if (rc || j->o.dry_run) return rc;
    fflush(stdout);
    rc = dc_manifest_save(j->o.dir, &j->man, err);
    j->prog = (fetch_progress){j->spine_bytes + j->expert_bytes, 0, df_now(), 0, isatty(STDERR_FILENO)};
    for (int i = 0; i < j->n_sh && !rc; i++)
        if (j->sh[i].m && j->sh[i].m->state == DC_PENDING) rc = fetch_spine(j, &j->sh[i], err);
    for (int i = 0; i < j->n_sh && !rc; i++) {
        fetch_shard *s = &j->sh[i];
        if (!s->m || s->m->state != DC_SPINE) continue;
        rc = j->o.all ? fetch_fill_shard(j, s, err) : j->o.any_layer ? fetch_cache_layers(j, s, err) : DF_OK;
    }
    if (!rc) fetch_show(&j->prog, 1);
    return rc;
}

int cmd_fetch(int argc, char **argv) {
    fetch_job j;
    memset(&j, 0, sizeof j);
    int a = fetch_parse_args(&j.o, argc, argv);
    if (a) return a == 1 ? 0 : a;
    df_error err = {0};
    double t0 = df_now();
    int rc = fetch_run(&j, &err);
    if (!rc && !j.o.dry_run) {
        remote_stats st;
        remote_get_stats(j.r, &st);
        printf("done: %llu bytes in %llu requests over %llu connections (%llu retries) in %.1f s\n",
               (unsigned long long)st.bytes, (unsigned long long)st.requests, (unsigned long long)st.connects,
               (unsigned long long)st.retries, df_now() - t0);
    }
    if (rc) fprintf(stderr, "deltafin fetch: %s\n", err.msg);
    fetch_job_free(&j);
    return rc ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------------- */
/* For bench fetch (fetch.h). */

int fetch_list_experts(remote *r, fetch_span_list *out, df_error *err) {
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
        fetch_shard s = {.name = out->files[i]};
        rc = fetch_read_header(r, &s, err);
        out->v = xrealloc(out->v, sizeof *out->v * (size_t)(out->n + s.n_holes + 1));
        for (int h = 0; !rc && h < s.n_holes; h++)
            out->v[out->n++] = (fetch_span){out->files[i], s.holes[h].span.off, s.holes[h].span.len, s.holes[h].layer,
                                            s.holes[h].expert};
        free(s.runs);
        free(s.holes);
    }
    return rc;
}

void fetch_span_list_free(fetch_span_list *l) {
    for (int i = 0; i < l->n_files; i++) free(l->files[i]);
    free(l->files);
    free(l->v);
    memset(l, 0, sizeof *l);
}
