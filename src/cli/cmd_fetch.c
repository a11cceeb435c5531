/* cmd_fetch.c — `deltafin fetch --from URL -m DIR [--spine | --all | --layers 1-40,92]`: installs a model
 * from a repository in the Hugging Face hub layout, all of it or just its spine.
 *
 * Order of work, chosen so an interruption at any point leaves a folder the next run completes: metadata
 * files (each written atomically), then the manifest listing every shard as pending with its holes (the
 * routed-expert spans, found from the shard headers), then per shard a sparse file of full size holding the
 * header and every non-expert byte, synced before the manifest marks it "spine". --layers puts the experts
 * of those layers into the disk cache (one atomic entry per span). --all fills each shard's holes in place
 * (from the cache when there, else one range request per span), logging finished spans after each synced
 * batch, and marks the shard complete at the end, dropping its cache entries. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"
#include "fetch.h"
#include "common/util.h"
#include "storage/dcache.h"
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

/* One hole of a shard with what it holds. */
typedef struct fetch_hole {
    dc_span span;
    int layer, expert;
} fetch_hole;

typedef struct fetch_shard {
    char *name;
    char *path;
    int local;               /* a complete local file the manifest does not track */
    dc_shard *m;             /* its manifest entry (NULL when local) */
    uint64_t size, header_len;
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

/* "...model.layers.{L}.{mlp|block_sparse_moe}.experts.{E}.w{1,2,3}...": layer and expert, or 0. */
static int fetch_expert_name(const char *name, int *layer, int *expert) {
    const char *l = strstr(name, "model.layers."), *e = strstr(name, ".experts.");
    if (!l || !e || e < l) return 0;
    char *end;
    long lv = strtol(l + 13, &end, 10), ev;
    if (end == l + 13 || *end != '.') return 0;
    ev = strtol(e + 9, &end, 10);
    if (end == e + 9 || *end != '.' || end[1] != 'w') return 0;
    *layer = (int)lv;
    *expert = (int)ev;
    return 1;
}

typedef struct fetch_tensor {
    uint64_t begin, end;
    int layer, expert;       /* expert -1: not a routed expert */
} fetch_tensor;

static int fetch_cmp_tensor(const void *a, const void *b) {
    const fetch_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int fetch_parse_header(fetch_shard *s, const char *json, size_t len, df_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return df_error_set(err, DF_EFORMAT, "%s: bad safetensors header: %s", s->name, je.text), DF_EFORMAT;
    }
    size_t n = json_object_size(root), k = 0;
    fetch_tensor *t = xcalloc(n + 1, sizeof *t);
    const char *name;
    json_t *v;
    uint64_t data0 = 8 + s->header_len;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *o = json_object_get(v, "data_offsets");
        json_int_t b = json_integer_value(json_array_get(o, 0)), e = json_integer_value(json_array_get(o, 1));
        if (b < 0 || e < b || data0 + (uint64_t)e > s->size) {
            free(t);
            json_decref(root);
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': data_offsets outside the file", s->name, name),
                   DF_EFORMAT;
        }
        t[k] = (fetch_tensor){data0 + (uint64_t)b, data0 + (uint64_t)e, -1, -1};
        if (!fetch_expert_name(name, &t[k].layer, &t[k].expert)) t[k].expert = -1;
        k++;
    }
    json_decref(root);
    qsort(t, k, sizeof *t, fetch_cmp_tensor);
    s->runs = xcalloc(k + 2, sizeof *s->runs);
    s->holes = xcalloc(k + 1, sizeof *s->holes);
    s->runs[s->n_runs++] = (dc_span){0, data0};
    for (size_t i = 0; i < k; i++) {
        if (t[i].end == t[i].begin) continue;
        if (t[i].expert < 0) {
            dc_span *r = &s->runs[s->n_runs - 1];
            if (r->off + r->len == t[i].begin) r->len += t[i].end - t[i].begin;
            else s->runs[s->n_runs++] = (dc_span){t[i].begin, t[i].end - t[i].begin};
            continue;
        }
        fetch_hole *h = s->n_holes ? &s->holes[s->n_holes - 1] : NULL;
        if (h && h->layer == t[i].layer && h->expert == t[i].expert && h->span.off + h->span.len == t[i].begin)
            h->span.len += t[i].end - t[i].begin;
        else
            s->holes[s->n_holes++] = (fetch_hole){{t[i].begin, t[i].end - t[i].begin}, t[i].layer, t[i].expert};
    }
    free(t);
    return DF_OK;
}

static int fetch_read_header(remote *r, fetch_shard *s, df_error *err) {
    int rc = remote_file_size(r, s->name, &s->size, err);
    uint8_t len8[8];
    remote_req q = {.file = s->name, .off = 0, .len = 8, .what = "shard header length", .dst = len8};
    if (!rc && s->size < 8) rc = (df_error_set(err, DF_EFORMAT, "%s: remote file of %llu bytes is no safetensors "
                                               "shard", s->name, (unsigned long long)s->size), DF_EFORMAT);
    if (!rc) rc = remote_fetch(r, &q, 1, err);
    if (rc) return rc;
    s->header_len = 0;
    for (int i = 7; i >= 0; i--) s->header_len = s->header_len << 8 | len8[i];
    if (s->header_len == 0 || s->header_len > (100u << 20) || 8 + s->header_len > s->size)
        return df_error_set(err, DF_EFORMAT, "%s: header length %llu does not fit the file", s->name,
                            (unsigned long long)s->header_len), DF_EFORMAT;
    char *h = xmalloc(s->header_len + 1);
    q = (remote_req){.file = s->name, .off = 8, .len = s->header_len, .what = "shard header", .dst = (uint8_t *)h};
    rc = remote_fetch(r, &q, 1, err);
    if (!rc) rc = fetch_parse_header(s, h, s->header_len, err);
    free(h);
    return rc;
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

static int fetch_wanted(const fetch_job *j, const fetch_hole *h) {
    if (j->o.all) return 1;
    return h->layer >= 0 && h->layer < FETCH_MAX_LAYERS && j->o.layers[h->layer];
}

/* Appends to names (n of them) the shard files named by an index's weight_map (root, read from src) that it
 * does not hold yet; a name that would leave the model folder is refused. */
static int index_shard_names(json_t *root, const char *src, char ***names, int *n, df_error *err) {
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) return (df_error_set(err, DF_EFORMAT, "%s: no weight_map", src), DF_EFORMAT);
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *name = json_string_value(v);
        int seen = 0;
        for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], name);
        if (!name || seen) continue;
        if (name[0] == '/' || strstr(name, ".."))
            return (df_error_set(err, DF_EFORMAT, "%s: shard name '%s' leaves the folder", src, name), DF_EFORMAT);
        *names = xrealloc(*names, sizeof **names * (size_t)(*n + 1));
        (*names)[(*n)++] = xstrdup(name);
    }
    return DF_OK;
}

/* Adds the shard files named by an index (see index_shard_names) to j->sh, which holds none yet. */
static int fetch_add_shards(fetch_job *j, json_t *root, const char *src, df_error *err) {
    char **names = NULL;
    int n = 0, rc = index_shard_names(root, src, &names, &n, err);
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
                if (!j->o.dry_run) rc = dc_write_atomic(path, 0, data, len, err);
                else if (!strcmp(f, "model.safetensors.index.json")) {
                    /* the dry run still needs the shard list: keep the index in memory only */
                    free(path);
                    path = NULL;
                    json_t *root = json_loadb(data, len, 0, NULL);
                    free(data);
                    data = NULL;
                    rc = fetch_add_shards(j, root, f, err);
                    json_decref(root);
                }
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
        json_error_t je;
        json_t *root = json_load_file(ipath, 0, &je);
        rc = fetch_add_shards(j, root, ipath, err);
        json_decref(root);
    } else if (!j->n_sh) {
        j->sh = xcalloc(1, sizeof *j->sh);
        j->sh[j->n_sh++].name = xstrdup("model.safetensors");
    }
    free(ipath);
    if (j->n_sh) qsort(j->sh, (size_t)j->n_sh, sizeof *j->sh, fetch_cmp_name);
    return rc;
}

static unsigned char *fetch_log_load(const fetch_job *j, const fetch_shard *s);

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
            *m = (dc_shard){xstrdup(s->name), s->size, DC_PENDING, s->n_holes, xcalloc((size_t)s->n_holes + 1,
                                                                                         sizeof(dc_span))};
            for (int h = 0; h < s->n_holes; h++) m->holes[h] = s->holes[h].span;
            for (int k = 0; k < j->n_sh; k++)   /* the array moved */
                j->sh[k].m = j->sh[k].local ? NULL : dc_manifest_find(&j->man, j->sh[k].name);
        } else if (s->m->size != s->size || s->m->n_holes != s->n_holes) {
            return df_error_set(err, DF_EFORMAT, "%s: the remote shard (%llu bytes, %d expert spans) differs from "
                                "the one this folder was installed from (%llu bytes, %d spans): a different "
                                "revision? Use a new folder", s->name, (unsigned long long)s->size, s->n_holes,
                                (unsigned long long)s->m->size, s->m->n_holes), DF_EFORMAT;
        }
        if (s->m->state == DC_PENDING)
            for (int r = 0; r < s->n_runs; r++) j->spine_bytes += s->runs[r].len;
        /* spans an interrupted --all already wrote into the shard are not fetched again */
        unsigned char *written = j->o.all && s->m->state == DC_SPINE ? fetch_log_load(j, s) : NULL;
        for (int h = 0; h < s->n_holes; h++) {
            if (!fetch_wanted(j, &s->holes[h]) || (written && written[h])) continue;
            int cached = dcache_has(j->cache, s->name, s->holes[h].span);
            if (!cached) j->expert_bytes += s->holes[h].span.len, j->expert_spans++;
            if (!j->o.all && !cached) j->disk_bytes += s->holes[h].span.len;
        }
        free(written);
        if (j->o.all) j->disk_bytes += s->size;   /* the whole shard ends up allocated */
        else if (s->m->state == DC_PENDING) j->disk_bytes += s->size - 0;
    }
    if (!j->o.all)   /* sparse spine files allocate only their non-expert bytes */
        for (int i = 0; i < j->n_sh; i++) {
            fetch_shard *s = &j->sh[i];
            if (s->m && s->m->state == DC_PENDING)
                for (int h = 0; h < s->n_holes; h++) j->disk_bytes -= s->holes[h].span.len;
        }
    return DF_OK;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Work */

static int fetch_open_shard(fetch_shard *s, int *fd, df_error *err) {
    *fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return df_error_set(err, DF_EIO, "%s: %s", s->path, strerror(errno)), DF_EIO;
    struct stat sb;
    if (fstat(*fd, &sb) == 0 && (uint64_t)sb.st_size != s->size && ftruncate(*fd, (off_t)s->size)) {
        df_error_set(err, DF_EIO, "%s: cannot size the file to %llu bytes: %s", s->path,
                     (unsigned long long)s->size, strerror(errno));
        close(*fd);
        return DF_EIO;
    }
    return DF_OK;
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

static int fetch_copy_cached(fetch_job *j, fetch_shard *s, int fd, dc_span e, df_error *err) {
    char *p = dcache_entry_path(j->cache, s->name, e);
    size_t n;
    char *data = df_read_file(p, &n, err);
    int rc = data ? DF_OK : DF_EIO;
    uint64_t pad = e.off % 4096;
    if (data && n != pad + e.len) rc = (df_error_set(err, DF_EIO, "%s: cache entry has the wrong size", p), DF_EIO);
    fetch_sink sk = {fd, e.off, s->path, NULL};   /* the plan did not count cached spans as bytes to fetch */
    if (!rc) rc = fetch_sink_write(&sk, 0, (const uint8_t *)data + pad, e.len, err);
    free(data);
    free(p);
    return rc;
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
                rc = fetch_copy_cached(j, s, fd, h->span, err);
                idx[n] = h0;
                q[n++] = (remote_req){.len = 0};
                continue;
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
            if (end == optarg || *end || o->min_free_gb < 0) return fetch_usage(stderr), 2;
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
    if (j->disk_bytes + keep > free_b)
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
        json_t *root = json_loadb(data, len, 0, NULL);
        rc = index_shard_names(root, "model.safetensors.index.json", &out->files, &out->n_files, err);
        json_decref(root);
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
