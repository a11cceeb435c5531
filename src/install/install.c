/* install.c — the source storage reads a partial install through (io_install_open in remote.h): bytes the
 * manifest says are present come from the shard files, every hole (an expert span) from the disk cache,
 * fetched with one range request first when it is not cached yet. Also `deltafin info`'s "local:" lines. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "dcache.h"
#include "remote.h"

typedef struct io_install {
    io_source base;
    io_source *local;
    dc_manifest man;
    int n;
    const dc_shard **shard;  /* per file: its manifest entry when not complete, else NULL */
    char **names;            /* per file: name relative to the model folder */
    dcache *cache;
    remote *net;             /* NULL: no --remote URL */
    atomic_int cache_warned; /* a failed cache write was reported once */
} io_install;

static int install_fetch(io_install *I, int file, dc_span h, uint8_t *buf, const char *what, df_error *err) {
    if (!I->net)
        return df_error_set(err, DF_EIO, "%s (%s bytes %llu-%llu) is not on local disk: this is a partial install "
                            "(from %s); pass --remote URL to stream missing experts, or run deltafin fetch --all",
                            what, I->names[file], (unsigned long long)h.off, (unsigned long long)(h.off + h.len - 1),
                            I->man.source ? I->man.source : "an unknown source"), DF_EIO;
    remote_req q = {.file = I->names[file], .off = h.off, .len = h.len, .what = what, .dst = buf};
    int rc = remote_fetch(I->net, &q, 1, err);
    if (rc) return rc;
    atomic_fetch_add(&I->base.net_bytes, h.len);
    df_error perr = {0};   /* the bytes are here: a cache that cannot take them (disk full) must not fail the read */
    if (dcache_put(I->cache, I->names[file], h, buf, what, &perr) && !atomic_exchange(&I->cache_warned, 1))
        fprintf(stderr, "deltafin: warning: %s; serving without caching (reported once)\n", perr.msg);
    return DF_OK;
}

static int install_read(io_source *s, int file, uint64_t off, uint64_t len, uint8_t *dst, const char *what,
                        df_error *err) {
    io_install *I = (io_install *)s;
    const dc_shard *sh = I->shard[file];
    int h = sh ? dc_shard_hole(sh, off, len) : -1;
    if (h == -1) {
        int rc = I->local->read(I->local, file, off, len, dst, what, err);
        atomic_fetch_add(&s->reads, 1);
        atomic_store(&s->bytes, atomic_load(&I->local->bytes));
        return rc;
    }
    if (h == -2)
        return df_error_set(err, DF_EIO, "%s: read of %s at bytes [%llu, %llu) straddles a span that is not local",
                            I->names[file], what, (unsigned long long)off, (unsigned long long)(off + len)), DF_EIO;
    dc_span hole = sh->holes[h];
    atomic_fetch_add(&s->reads, 1);
    if (dcache_has(I->cache, I->names[file], hole)) {
        atomic_fetch_add(&s->bytes, io_span_bytes(off, len));
        int rc = dcache_read(I->cache, I->names[file], hole, off, len, dst, what, err);
        if (!rc) return rc;
        if (!I->net) {   /* corrupt (or gone, evicted by another process): never served */
            char inner[sizeof err->msg];
            memcpy(inner, err->msg, sizeof inner);
            return df_error_set(err, DF_EFORMAT, "%s; pass --remote URL to fetch it again, or rerun deltafin fetch "
                                "--layers/--all", inner), DF_EFORMAT;
        }
        fprintf(stderr, "deltafin: warning: %s; fetching it again\n", err->msg);
        if (rc == DF_EFORMAT) dcache_remove(I->cache, I->names[file], hole);
    }
    uint8_t *head = dst + off % IO_ALIGN;
    if (off == hole.off && len == hole.len) return install_fetch(I, file, hole, head, what, err);
    uint8_t *tmp = xmalloc(hole.len);
    int rc = install_fetch(I, file, hole, tmp, what, err);
    if (!rc) memcpy(head, tmp + (off - hole.off), len);
    free(tmp);
    return rc;
}

static const char *install_name(const io_source *s, int file) {
    const io_install *I = (const io_install *)s;
    return I->local->file_name(I->local, file);
}

static void install_free(io_source *s) {
    io_install *I = (io_install *)s;
    remote_free(I->net);
    dcache_free(I->cache);
    io_source_free(I->local);
    dc_manifest_free(&I->man);
    for (int i = 0; i < I->n; i++) free(I->names[i]);
    free(I->names);
    free(I->shard);
    free(I);
}

static char *install_rel_name(const char *dir, const char *path) {
    size_t dl = strlen(dir);
    if (!strncmp(path, dir, dl)) {
        const char *p = path + dl;
        while (*p == '/') p++;
        return xstrdup(p);
    }
    const char *slash = strrchr(path, '/');
    return xstrdup(slash ? slash + 1 : path);
}

int io_install_wrap(io_source **src, const char *dir, int n_files, const char *remote_url, df_error *err) {
    dc_manifest man;
    int found;
    int rc = dc_manifest_load(dir, &man, &found, err);
    if (rc || !found) return rc;
    io_source *local = *src;
    int partial = 0;
    char **names = xcalloc((size_t)n_files + 1, sizeof *names);
    for (int i = 0; i < n_files; i++) {
        names[i] = install_rel_name(dir, local->file_name(local, i));
        const dc_shard *s = dc_manifest_find(&man, names[i]);
        if (s && s->state == DC_PENDING && !rc)
            rc = (df_error_set(err, DF_EIO, "%s: shard %s has not been fetched yet (interrupted install?): run "
                               "deltafin fetch --spine --from %s -m %s", dir, names[i],
                               man.source ? man.source : "URL", dir), DF_EIO);
        partial |= s && s->state == DC_SPINE;
    }
    if (rc || !partial) {
        for (int i = 0; i < n_files; i++) free(names[i]);
        free(names);
        dc_manifest_free(&man);
        return rc;
    }
    io_install *I = xcalloc(1, sizeof *I);
    I->base.read = install_read;
    I->base.free = install_free;
    I->base.file_name = install_name;
    I->man = man;
    I->n = n_files;
    I->names = names;
    I->local = local;
    I->shard = xcalloc((size_t)n_files + 1, sizeof *I->shard);
    for (int i = 0; i < n_files; i++) {
        const dc_shard *s = dc_manifest_find(&I->man, names[i]);
        I->shard[i] = s && s->state == DC_SPINE ? s : NULL;
    }
    rc = dcache_open(&I->cache, dir, dcache_default_reserve(), err);
    if (!rc && remote_url) {
        char *base = remote_resolve_base(remote_url, err);
        rc = base ? remote_open(&I->net, base, NULL, err) : DF_EINVAL;
        free(base);
    }
    if (rc) {
        I->local = NULL;   /* still the caller's */
        install_free(&I->base);
        return rc;
    }
    atomic_store(&I->base.direct_fallbacks, atomic_load(&local->direct_fallbacks));
    *src = &I->base;
    return DF_OK;
}

int io_install_open(io_source **out, const char *dir, int n_files, const char *const *paths, int direct,
                    const char *remote_url, df_error *err) {
    int rc = io_local_open(out, n_files, paths, direct, err);
    if (!rc) rc = io_install_wrap(out, dir, n_files, remote_url, err);
    if (rc) {
        io_source_free(*out);
        *out = NULL;
    }
    return rc;
}

static void install_printf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void install_printf(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strnlen(buf, cap);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

void install_describe(const char *dir, char *buf, size_t cap) {
    dc_manifest m;
    int found;
    df_error err = {0};
    if (!cap) return;
    if (dc_manifest_load(dir, &m, &found, &err)) {
        install_printf(buf, cap, "local: %s\n", err.msg);
        return;
    }
    if (!found) return;
    dcache *c = NULL;
    dcache_open(&c, dir, 0, &err);
    uint64_t total = 0, missing = 0, cached = 0, holes = 0, cached_spans = 0;
    int complete = 0, pending = 0, verified = 0;
    for (int i = 0; i < m.n; i++) {
        const dc_shard *s = &m.shards[i];
        total += s->size;
        complete += s->state == DC_COMPLETE;
        verified += s->state == DC_COMPLETE && s->verified;
        if (s->state == DC_PENDING) {
            pending++;
            missing += s->size;
            continue;
        }
        if (s->state != DC_SPINE) continue;
        for (int h = 0; h < s->n_holes; h++) {
            holes++;
            if (dcache_has(c, s->name, s->holes[h])) cached_spans++, cached += s->holes[h].len;
            else missing += s->holes[h].len;
        }
    }
    double gib = 1.0 / (1ull << 30);
    install_printf(buf, cap, "local: %.3f of %.3f GiB of shards on disk (%.1f%%), partial install from %s\n",
                   (double)(total - missing) * gib, (double)total * gib,
                   total ? 100.0 * (double)(total - missing) / (double)total : 100.0, m.source ? m.source : "?");
    install_printf(buf, cap, "local: shards: %d complete (%d checked against the remote's SHA-256), %d spine only, %d "
                   "not fetched; expert spans cached: %llu of %llu missing from spine-only shards (%.3f GiB)\n",
                   complete, verified, m.n - complete - pending, pending, (unsigned long long)cached_spans,
                   (unsigned long long)holes, (double)cached * gib);
    dcache_free(c);
    dc_manifest_free(&m);
}
