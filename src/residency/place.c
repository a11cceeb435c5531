/* place.c — experts spread over several folders (see place.h): reading and checking a placement, and the
 * resumable copy of `deltafin place`. */
#include "place.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "install/dcache.h"

#define PLACE_MAGIC "deltafin-placement 1"
#define PLACE_ALIGN 4096u

void placement_free(placement *p) {
    for (int f = 0; f < p->n_folders; f++) {
        free(p->folders[f]);
        free(p->files[f]);
    }
    free(p->folders);
    free(p->files);
    free(p->ends);
    free(p->base);
    free(p->e);
    memset(p, 0, sizeof *p);
}

static void place_add_folder(placement *p, const char *path) {
    p->folders = xrealloc(p->folders, sizeof *p->folders * (size_t)(p->n_folders + 1));
    p->files = xrealloc(p->files, sizeof *p->files * (size_t)(p->n_folders + 1));
    p->ends = xrealloc(p->ends, sizeof *p->ends * (size_t)(p->n_folders + 1));
    p->folders[p->n_folders] = xstrdup(path);
    p->files[p->n_folders] = df_path_join(path, PLACE_DATA);
    p->ends[p->n_folders] = 0;
    p->n_folders++;
}

/* Parses the placement text into p (shape already set); *valid_len = bytes up to the last "done" line. */
static int place_parse(placement *p, char *text, size_t len, size_t *valid_len, const char *path, df_error *err) {
    *valid_len = 0;
    size_t nl = strcspn(text, "\n");
    if (nl == len || strncmp(text, PLACE_MAGIC, nl) || nl != strlen(PLACE_MAGIC))
        return df_error_set(err, DF_EFORMAT, "%s: not a deltafin placement file", path), DF_EFORMAT;
    int64_t n = p->base[p->n_layers];
    place_entry *pend = xmalloc(sizeof *pend * (size_t)(n + 1));
    for (int64_t k = 0; k < n; k++) pend[k] = (place_entry){-1, 0, 0};
    uint64_t *pend_end = xcalloc(64, sizeof *pend_end);
    char *line = text + nl + 1;
    while (line < text + len) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) break;   /* a torn last line */
        *end = 0;
        char name[1024];
        int a, b, c;
        unsigned long long off, length;
        if (sscanf(line, "folder %d %1023s", &a, name) == 2 && a == p->n_folders && p->n_folders < 64) {
            place_add_folder(p, name);
        } else if (sscanf(line, "expert %d %d %d %llu %llu", &a, &b, &c, &off, &length) == 5 && a >= 0 &&
                   a < p->n_layers && b >= 0 && b < p->base[a + 1] - p->base[a] && c >= 0 && c < p->n_folders &&
                   off + length >= off) {
            pend[p->base[a] + b] = (place_entry){c, off, length};
            pend_end[c] = DF_MAX(pend_end[c], off + length);
        } else if (sscanf(line, "done %d", &a) == 1 && a >= 0 && a < p->n_layers && a > p->last_done) {
            for (int64_t k = p->base[a]; k < p->base[a + 1]; k++)
                if (pend[k].folder >= 0) p->e[k] = pend[k], p->n_placed++;
            for (int f = 0; f < p->n_folders; f++) p->ends[f] = DF_MAX(p->ends[f], pend_end[f]);
            p->last_done = a;
            *valid_len = (size_t)(end + 1 - text);
        } else {
            *end = '\n';
            break;   /* damaged from here on: what follows the last "done" is not trusted */
        }
        *end = '\n';   /* the text is written back on a resume: it must stay as it was read */
        line = end + 1;
    }
    if (!*valid_len) *valid_len = (size_t)(line - text);
    free(pend);
    free(pend_end);
    return DF_OK;
}

static void place_shape(placement *p, int n_layers, const int *n_experts) {
    memset(p, 0, sizeof *p);
    p->n_layers = n_layers;
    p->base = xcalloc((size_t)n_layers + 1, sizeof *p->base);
    for (int l = 0; l < n_layers; l++) p->base[l + 1] = p->base[l] + n_experts[l];
    p->e = xmalloc(sizeof *p->e * (size_t)(p->base[n_layers] + 1));
    for (int64_t k = 0; k <= p->base[n_layers]; k++) p->e[k] = (place_entry){-1, 0, 0};
    p->last_done = -1;
}

int placement_load(placement *p, const char *dir, int n_layers, const int *n_experts, const char *override,
                   int *found, df_error *err) {
    *found = 0;
    place_shape(p, n_layers, n_experts);
    char *path = df_path_join(dir, PLACE_FILE);
    if (access(path, F_OK)) {
        free(path);
        if (!override) return DF_OK;
        placement_free(p);
        return df_error_set(err, DF_EINVAL, "--expert-dirs %s: %s has no placement (run deltafin place -m %s --to "
                            "%s first)", override, dir, dir, override), DF_EINVAL;
    }
    size_t len = 0;
    char *text = df_read_file_max(path, DF_JSON_FILE_MAX, &len, err), *ov = NULL;
    size_t valid;
    int rc = text ? place_parse(p, text, len, &valid, path, err) : err->code;
    free(text);
    if (!rc && override) {   /* the same folders under other names, in order */
        ov = xstrdup(override);
        int f = 0;
        for (char *save = NULL, *tok = strtok_r(ov, ",", &save); tok; tok = strtok_r(NULL, ",", &save), f++) {
            if (f >= p->n_folders) break;
            free(p->folders[f]);
            free(p->files[f]);
            p->folders[f] = xstrdup(tok);
            p->files[f] = df_path_join(tok, PLACE_DATA);
        }
        if (f != p->n_folders)
            rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "--expert-dirs %s: %d folders given, the placement in %s "
                                         "has %d", override, f, path, p->n_folders);
        free(ov);
    }
    struct stat *seen = xcalloc((size_t)p->n_folders + 1, sizeof *seen);
    for (int f = 0; !rc && f < p->n_folders; f++) {
        struct stat sb;
        int same = -1;
        if (!stat(p->files[f], &sb))
            for (int g = 0; g < f && same < 0; g++)
                if (seen[g].st_dev == sb.st_dev && seen[g].st_ino == sb.st_ino) same = g;
        if (!stat(p->files[f], &sb)) seen[f] = sb;
        if (stat(p->files[f], &sb))
            rc = DF_EIO, df_error_set(err, DF_EIO, "expert folder %s is missing or unreadable (%s: %s); the placement "
                                      "%s puts experts there: mount the device or pass --expert-dirs", p->folders[f],
                                      p->files[f], strerror(errno), path);
        else if (!S_ISREG(sb.st_mode))
            rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "expert folder %s: %s is not a regular file", p->folders[f],
                                          p->files[f]);
        else if (same >= 0)   /* each folder's offsets index its own file: one file for two gives wrong experts */
            rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folders %s and %s are the same folder (%s); the "
                                         "placement %s needs %d different ones", p->folders[same], p->folders[f],
                                         p->files[f], path, p->n_folders);
        else if ((uint64_t)sb.st_size < p->ends[f])
            rc = DF_EFORMAT, df_error_set(err, DF_EFORMAT, "expert folder %s: %s holds %lld bytes, the placement %s "
                                          "needs %llu (an interrupted copy? run deltafin place again)", p->folders[f],
                                          p->files[f], (long long)sb.st_size, path, (unsigned long long)p->ends[f]);
    }
    free(seen);
    free(path);
    if (rc) {
        placement_free(p);
        return rc;
    }
    *found = 1;
    return DF_OK;
}

void placement_where(const placement *p, int layer, int e, int *folder, uint64_t *offset, uint64_t *length) {
    const place_entry *x = &p->e[p->base[layer] + e];
    *folder = x->folder;
    *offset = x->offset;
    *length = x->length;
}

/* ---- writing ------------------------------------------------------------------------------------------- */

static int place_copy(int in, uint64_t off, uint64_t len, int out, uint64_t to, uint8_t *buf, size_t cap) {
    while (len) {
        size_t n = (size_t)DF_MIN((uint64_t)cap, len);
        ssize_t r = pread(in, buf, n, (off_t)off);
        if (r <= 0) return r < 0 ? errno : EIO;
        ssize_t w = pwrite(out, buf, (size_t)r, (off_t)to);
        if (w != r) return w < 0 ? errno : ENOSPC;
        off += (uint64_t)r, to += (uint64_t)r, len -= (uint64_t)r;
    }
    return 0;
}

static int place_append(const char *path, const char *text, df_error *err) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    size_t n = strlen(text);
    int e = fd < 0 ? errno : 0;
    if (!e && write(fd, text, n) != (ssize_t)n) e = errno ? errno : ENOSPC;
    if (!e && fsync(fd)) e = errno;
    if (fd >= 0) close(fd);
    if (e) df_error_set(err, DF_EIO, "%s: %s", path, strerror(e));
    return e ? DF_EIO : DF_OK;
}

/* The source shard (a path of src) that is the file sb describes, or NULL. */
static const char *place_same_source(const struct stat *sb, int n_layers, const int *n_experts,
                                     const place_src *const *src) {
    const char *last = NULL;
    for (int l = 0; l < n_layers; l++)
        for (int e = 0; e < n_experts[l]; e++) {
            const char *path = src[l][e].path;
            struct stat ss;
            if (!path || (last && !strcmp(last, path))) continue;
            last = path;
            if (!stat(path, &ss) && ss.st_dev == sb->st_dev && ss.st_ino == sb->st_ino) return path;
        }
    return NULL;
}

/* Before anything is written: every folder exists and is its own (two names of one folder, as the same path
 * twice, ./A, a symlink or a bind mount, would put two folders' experts into one file), and no data file is
 * a link, a FIFO or one of the shards it copies from. */
static int place_check_folders(int n_folders, const char *const *folders, int n_layers, const int *n_experts,
                               const place_src *const *src, df_error *err) {
    struct stat *dirs = xcalloc((size_t)n_folders + 1, sizeof *dirs);
    int rc = DF_OK;
    for (int f = 0; !rc && f < n_folders; f++) {
        rc = df_mkdir_p(folders[f], err);
        if (!rc && stat(folders[f], &dirs[f]))
            rc = DF_EIO, df_error_set(err, DF_EIO, "expert folder %s: %s", folders[f], strerror(errno));
        for (int g = 0; !rc && g < f; g++)
            if (dirs[g].st_dev == dirs[f].st_dev && dirs[g].st_ino == dirs[f].st_ino)
                rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folders %s and %s are the same folder: each "
                                             "needs its own device or folder", folders[g], folders[f]);
        char *data = rc ? NULL : df_path_join(folders[f], PLACE_DATA);
        struct stat sb;
        const char *shard = NULL;
        if (data && !lstat(data, &sb)) {
            if (!S_ISREG(sb.st_mode))
                rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folder %s: %s is not a regular file (a link?)",
                                             folders[f], data);
            else if ((shard = place_same_source(&sb, n_layers, n_experts, src)))
                rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folder %s: %s is the shard %s itself; copying "
                                             "into it would overwrite the experts it copies", folders[f], data, shard);
        }
        free(data);
    }
    free(dirs);
    return rc;
}

typedef struct place_order {
    double w;
    int e;
} place_order;

static int place_cmp(const void *a, const void *b) {
    const place_order *x = a, *y = b;
    return x->w < y->w ? 1 : x->w > y->w ? -1 : x->e - y->e;
}

int placement_write(const char *dir, int n_folders, const char *const *folders, const double *weights,
                    int n_layers, const int *n_experts, const place_src *const *src, const float *heat,
                    int verbose, int64_t *placed, df_error *err) {
    *placed = 0;
    char *meta = df_path_join(dir, ".deltafin"), *path = df_path_join(dir, PLACE_FILE);
    int rc = df_mkdir_p(meta, err);
    if (!rc) rc = place_check_folders(n_folders, folders, n_layers, n_experts, src, err);
    placement p;
    place_shape(&p, n_layers, n_experts);
    size_t len = 0, valid = 0;
    char *text = !rc && !access(path, F_OK) ? df_read_file_max(path, DF_JSON_FILE_MAX, &len, err) : NULL;
    if (!rc && !text && !access(path, F_OK)) rc = err->code;
    if (text) {   /* resume: the same folders, the valid part kept */
        rc = place_parse(&p, text, len, &valid, path, err);
        for (int f = 0; !rc && f < DF_MAX(n_folders, p.n_folders); f++)
            if (f >= n_folders || f >= p.n_folders || strcmp(p.folders[f], folders[f]))
                rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "%s places experts in other folders (folder %d is %s); "
                                             "remove it to place anew", path, f, f < p.n_folders ? p.folders[f] : "-");
        if (!rc) rc = dc_write_atomic(path, 0, text, valid, err);
    } else if (!rc) {
        char *head = xmalloc(64 + 1100 * (size_t)n_folders);
        int at = snprintf(head, 64, PLACE_MAGIC "\n");
        for (int f = 0; f < n_folders; f++) {
            if (strlen(folders[f]) > 1000 || strpbrk(folders[f], " \n")) {
                rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "folder '%s': paths with spaces are not supported",
                                             folders[f]);
                break;
            }
            at += snprintf(head + at, 1100, "folder %d %s\n", f, folders[f]);
            place_add_folder(&p, folders[f]);
        }
        if (!rc) rc = dc_write_atomic(path, 0, head, (size_t)at, err);
        free(head);
    }
    free(text);
    int *fd = xcalloc((size_t)n_folders, sizeof *fd);
    for (int f = 0; f < n_folders; f++) fd[f] = -1;
    for (int f = 0; !rc && f < n_folders; f++) {
        rc = df_mkdir_p(folders[f], err);
        if (rc) break;
        /* the data file itself: never through a symlink, never a FIFO, never one of the shards it copies from */
        fd[f] = open(p.files[f], O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        struct stat sb;
        if (fd[f] >= 0 && (fstat(fd[f], &sb) || !S_ISREG(sb.st_mode))) {
            rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folder %s: %s is not a regular file", folders[f],
                                         p.files[f]);
            break;
        }
        const char *shard = fd[f] >= 0 ? place_same_source(&sb, n_layers, n_experts, src) : NULL;
        if (shard) {
            rc = DF_EINVAL, df_error_set(err, DF_EINVAL, "expert folder %s: %s is the shard %s itself (a link?); "
                                         "copying into it would overwrite the experts it copies", folders[f],
                                         p.files[f], shard);
            break;
        }
        if (fd[f] < 0 || ftruncate(fd[f], (off_t)p.ends[f]))
            rc = DF_EIO, df_error_set(err, DF_EIO, "expert folder %s: %s: %s", folders[f], p.files[f], strerror(errno));
    }
    double *load = xcalloc((size_t)n_folders, sizeof *load);
    size_t cap = 8u << 20;
    uint8_t *buf = xmalloc(cap);
    place_order *ord = NULL;
    char *lines = NULL;
    for (int l = p.last_done + 1; !rc && l < n_layers; l++) {
        int ne = n_experts[l];
        ord = xrealloc(ord, sizeof *ord * (size_t)(ne + 1));
        lines = xrealloc(lines, 80 * (size_t)(ne + 1) + 32);
        size_t at = 0;
        for (int e = 0; e < ne; e++) ord[e] = (place_order){heat ? heat[p.base[l] + e] : 0, e};
        qsort(ord, (size_t)ne, sizeof *ord, place_cmp);
        for (int i = 0; !rc && i < ne; i++) {
            const place_src *s = &src[l][ord[i].e];
            if (!s->length) continue;
            int best = 0;
            double cost = (ord[i].w + 1) * (double)s->length;
            for (int f = 1; f < n_folders; f++)
                if ((load[f] + cost) / weights[f] < (load[best] + cost) / weights[best]) best = f;
            load[best] += cost;
            uint64_t to = (p.ends[best] + PLACE_ALIGN - 1) / PLACE_ALIGN * PLACE_ALIGN + s->offset % PLACE_ALIGN;
            int in = open(s->path, O_RDONLY | O_CLOEXEC);
            int e = in < 0 ? errno : place_copy(in, s->offset, s->length, fd[best], to, buf, cap);
            if (in >= 0) close(in);
            if (e) {
                rc = DF_EIO, df_error_set(err, DF_EIO, "copying expert %d of layer %d from %s to %s: %s", ord[i].e, l,
                                          s->path, p.files[best], strerror(e));
                break;
            }
            p.ends[best] = to + s->length;
            at += (size_t)snprintf(lines + at, 80, "expert %d %d %d %llu %llu\n", l, ord[i].e, best,
                                   (unsigned long long)to, (unsigned long long)s->length);
            (*placed)++;
        }
        for (int f = 0; !rc && f < n_folders; f++)
            if (fsync(fd[f])) rc = DF_EIO, df_error_set(err, DF_EIO, "%s: %s", p.files[f], strerror(errno));
        snprintf(lines + at, 32, "done %d\n", l);
        if (!rc) rc = place_append(path, lines, err);
        if (verbose && !rc) fprintf(stderr, "\rdeltafin place: layer %d/%d", l + 1, n_layers);
    }
    if (verbose) fprintf(stderr, "\n");
    for (int f = 0; f < n_folders; f++)
        if (fd[f] >= 0) close(fd[f]);
    *placed += p.n_placed;
    free(fd);
    free(load);
    free(buf);
    free(ord);
    free(lines);
    placement_free(&p);
    free(meta);
    free(path);
    return rc;
}
