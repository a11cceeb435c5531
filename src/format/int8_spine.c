/* int8_spine.c — the int8 spine sidecar (see int8_spine.h): which tensors are quantised, the per-row
 * quantiser, the streaming writer behind `deltafin quantize --spine int8`, and the reader side storage uses
 * to find a quantised tensor's byte range. */
#include "int8_spine.h"

#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "st_write.h"
#include "tensor_names.h"

#define INT8_MIN_DIM 64
#define INT8_DEFAULT_SHARD (4ull << 30)
#define INT8_HEADER_ALIGN 64
#define INT8_DIGEST_SEED 0x494e5438u

int int8_spine_eligible(const char *name, df_dtype dt, int ndim, const int64_t *shape) {
    if (ndim != 2 || shape[0] < INT8_MIN_DIM || shape[1] < INT8_MIN_DIM || shape[1] % 2) return 0;
    if (dt != DF_DT_F32 && dt != DF_DT_BF16 && dt != DF_DT_F16) return 0;
    tensor_kind k;
    tensor_class c = tensor_classify(name, tensor_family_guess(name), NULL, NULL, &k);
    if (c != TENSOR_TOP && c != TENSOR_SPINE) return 0;   /* routed experts, unknown and non-text tensors */
    return k != TN_MOE_ROUTER && k != TN_MLA_KV_B;
}

uint16_t int8_quantize_row(const float *w, int64_t n, int8_t *q) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(w[i])) return INT8_BAD_SCALE;
        amax = fmaxf(amax, fabsf(w[i]));
    }
    uint16_t h = df_f32_to_f16(amax / 127.0f);
    float s = df_f16_to_f32(h);
    if (!isfinite(s)) return INT8_BAD_SCALE;
    if (s == 0.0f) {
        memset(q, 0, (size_t)n);
        return 0;
    }
    float inv = 1.0f / s;
    for (int64_t i = 0; i < n; i++) {
        long v = lrintf(w[i] * inv);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return h;
}

void int8_spine_place(df_tensor *v, const uint8_t *span) {
    v->scale = span;
    v->data = span + 2 * v->shape[0];
}

/* ---------------------------------------------------------------------------------------------------- */
/* The source record: what the sidecar was computed from */

/* One source tensor's identity: name, dtype, shape, length, and its first, middle and last rows (up to 4 KiB
 * each): cheap to compute at every open, and changed by new weights even under the same names and shapes. */
static uint64_t int8_source_id(const st_tensor *t, uint64_t h) {
    h = df_hash64(t->name, strlen(t->name) + 1, h);
    h = df_hash64(t->dtype_name, strlen(t->dtype_name) + 1, h);
    int64_t dims[ST_MAX_DIMS + 2] = {t->ndim, (int64_t)(t->end - t->begin)};
    for (int i = 0; i < t->ndim; i++) dims[2 + i] = t->shape[i];
    h = df_hash64(dims, sizeof dims, h);
    if (!t->data || t->ndim != 2 || t->shape[0] <= 0) return h;
    uint64_t row = (t->end - t->begin) / (uint64_t)t->shape[0], take = DF_MIN(row, 4096);
    const int64_t rows[3] = {0, t->shape[0] / 2, t->shape[0] - 1};
    for (int i = 0; i < 3; i++) h = df_hash64(t->data + (uint64_t)rows[i] * row, (size_t)take, h);
    return h;
}

/* The digest of an ordered list of source tensors, as 16 hex digits. */
static void int8_digest_hex(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

static int int8_cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

int int8_spine_check(const st_file *side, const st_file *src, int n_src, df_error *err) {
    const char *stale = "(rerun `deltafin quantize --spine int8` to rebuild it)";
    if (!side->map || side->header_len < 2)
        return df_error_set(err, DF_EFORMAT, "%s: int8 spine sidecar not mapped", side->path), DF_EFORMAT;
    json_error_t je;
    json_t *root = json_loadb((const char *)side->map + 8, (size_t)side->header_len, 0, &je);
    const char *want = json_string_value(json_object_get(json_object_get(root, "__metadata__"), "source_digest"));
    int rc = DF_OK;
    if (!want) {
        rc = (df_error_set(err, DF_EFORMAT, "%s: the int8 spine sidecar records no source_digest (written by an older "
                          "deltafin): it cannot be checked against the checkpoint %s", side->path, stale), DF_EFORMAT);
        json_decref(root);
        return rc;
    }
    const st_tensor **q = xmalloc(sizeof *q * (size_t)(side->n_tensors + 1));
    int n = 0;
    for (int i = 0; i < side->n_tensors; i++)
        if (side->tensors[i].dtype == DF_DT_I8) q[n++] = &side->tensors[i];
    qsort(q, (size_t)n, sizeof *q, int8_cmp_begin);
    uint64_t h = INT8_DIGEST_SEED;
    for (int i = 0; i < n && !rc; i++) {
        const st_tensor *t = NULL;
        for (int f = 0; f < n_src && !t; f++) t = st_file_find(&src[f], q[i]->name);
        if (!t)
            rc = (df_error_set(err, DF_EFORMAT, "%s: the int8 spine sidecar holds '%s', which the checkpoint no longer "
                              "has: it was made from other weights %s", side->path, q[i]->name, stale), DF_EFORMAT);
        else
            h = int8_source_id(t, h);
    }
    char got[17];
    int8_digest_hex(h, got);
    if (!rc && strcmp(got, want))
        rc = (df_error_set(err, DF_EFORMAT, "%s: the int8 spine sidecar was made from other weights than the "
                          "checkpoint's (source_digest %s, the checkpoint's tensors give %s) %s", side->path, want,
                          got, stale), DF_EFORMAT);
    free(q);
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Reading */

int int8_spine_files(const char *dir, char ***files, int *n, df_error *err) {
    *files = NULL;
    *n = 0;
    char *index = df_path_join(dir, INT8_SPINE_INDEX), *single = df_path_join(dir, INT8_SPINE_FILE);
    int rc = DF_OK;
    if (access(index, F_OK) == 0) {
        json_t *root = df_json_load_file(index, JSON_REJECT_DUPLICATES, err);
        json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
        if (!root) rc = err->code;
        else if (!json_is_object(wm))
            rc = (df_error_set(err, DF_EFORMAT, "%s: missing \"weight_map\" object", index), DF_EFORMAT);
        const char *name;
        json_t *val;
        if (!rc) json_object_foreach(wm, name, val) {
            const char *f = json_string_value(val);
            if (!f || !*f || strchr(f, '/')) {
                rc = DF_EFORMAT;
                df_error_set(err, rc, "%s: tensor '%s': shard must be a file name in the model folder", index, name);
                break;
            }
            int seen = 0;
            for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*files)[i], f);
            if (seen) continue;
            *files = xrealloc(*files, sizeof **files * (size_t)(*n + 1));
            (*files)[(*n)++] = xstrdup(f);
        }
        json_decref(root);
    } else if (access(single, F_OK) == 0) {
        *files = xmalloc(sizeof **files);
        (*files)[0] = xstrdup(INT8_SPINE_FILE);
        *n = 1;
    }
    free(index);
    free(single);
    return rc;
}

int int8_spine_find(const st_file *f, const char *name, st_tensor *span, df_error *err) {
    const st_tensor *q = st_file_find(f, name);
    if (!q) return 0;
    size_t len = strlen(name);
    char *sname = xmalloc(len + sizeof INT8_SPINE_SCALE_SUFFIX);
    memcpy(sname, name, len);
    memcpy(sname + len, INT8_SPINE_SCALE_SUFFIX, sizeof INT8_SPINE_SCALE_SUFFIX);
    const st_tensor *s = st_file_find(f, sname);
    free(sname);
    if (q->dtype != DF_DT_I8 || q->ndim != 2 || !s || s->dtype != DF_DT_F16 || s->ndim != 1 ||
        s->shape[0] != q->shape[0] || s->end != q->begin || st_tensor_offset(f, s) % 2)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': not an int8 spine pair (need I8 [out, in] right "
                            "after its F16 [out] '%s%s' at an even offset; rewrite with `deltafin quantize`)",
                            f->path, name, name, INT8_SPINE_SCALE_SUFFIX), DF_EFORMAT;
    *span = *q;
    span->begin = s->begin;
    span->elem_size = 2;
    span->data = s->data;
    return 1;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Writing */

typedef struct int8_src {
    int file;
    const st_tensor *t;
} int8_src;

typedef struct int8_writer {
    const char *dir;
    int n_files;
    st_file *files;
    char **names;         /* files[i]'s name in the model folder */
    int8_src *v;          /* tensors to quantise, in checkpoint order */
    int n, cap;
    int8_write_stats *stats;
} int8_writer;

static int int8_open_source(int8_writer *w, const char *file, df_error *err) {
    for (int i = 0; i < w->n_files; i++)
        if (!strcmp(w->names[i], file)) return i;
    char *path = df_path_join(w->dir, file);
    w->files = xrealloc(w->files, sizeof *w->files * (size_t)(w->n_files + 1));
    w->names = xrealloc(w->names, sizeof *w->names * (size_t)(w->n_files + 1));
    int rc = st_file_open(&w->files[w->n_files], path, err);
    free(path);
    if (rc) return rc;
    w->names[w->n_files] = xstrdup(file);
    return w->n_files++;
}

static void int8_consider(int8_writer *w, int file, const st_tensor *t) {
    tensor_class c = tensor_classify(t->name, tensor_family_guess(t->name), NULL, NULL, NULL);
    if (c != TENSOR_TOP && c != TENSOR_SPINE) return;
    w->stats->spine_bytes += t->end - t->begin;
    if (!int8_spine_eligible(t->name, t->dtype, t->ndim, t->shape)) return;
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->v = xrealloc(w->v, sizeof *w->v * (size_t)w->cap);
    }
    w->v[w->n++] = (int8_src){file, t};
}

static int int8_cmp_src(const void *a, const void *b) {
    const int8_src *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->t->begin < y->t->begin ? -1 : x->t->begin > y->t->begin;
}

/* Collects the checkpoint's tensors (those the index lists, or every tensor of model.safetensors). */
static int int8_collect(int8_writer *w, df_error *err) {
    char *index = df_path_join(w->dir, "model.safetensors.index.json");
    int rc = DF_OK;
    json_t *root = NULL;
    if (access(index, F_OK) == 0) {
        root = df_json_load_file(index, 0, err);
        if (!root) rc = err->code;
        else if (!json_is_object(json_object_get(root, "weight_map")))
            rc = (df_error_set(err, DF_EFORMAT, "%s: no \"weight_map\" object", index), DF_EFORMAT);
    } else {
        rc = int8_open_source(w, "model.safetensors", err);
        rc = rc < 0 ? rc : DF_OK;
    }
    /* pairs (file, tensor) first, then the prefix decision, then filtering */
    int8_src *all = NULL;
    int64_t n_all = 0;
    if (!rc && root) {
        const char *name;
        json_t *val;
        json_object_foreach(json_object_get(root, "weight_map"), name, val) {
            const char *f = json_string_value(val);
            int fi = DF_EFORMAT;
            if (f && *f && !strstr(f, "..") && f[0] != '/') fi = int8_open_source(w, f, err);
            else df_error_set(err, fi, "%s: tensor '%s': bad shard name", index, name);
            if (fi < 0) {
                rc = fi;
                break;
            }
            const st_tensor *t = st_file_find(&w->files[fi], name);
            if (!t) {
                rc = DF_EFORMAT;
                df_error_set(err, rc, "%s lists '%s' in %s, which has no such tensor", index, name, f);
                break;
            }
            all = xrealloc(all, sizeof *all * (size_t)(n_all + 1));
            all[n_all++] = (int8_src){fi, t};
        }
    } else if (!rc) {
        all = xmalloc(sizeof *all * (size_t)(w->files[0].n_tensors + 1));
        for (int i = 0; i < w->files[0].n_tensors; i++) all[n_all++] = (int8_src){0, &w->files[0].tensors[i]};
    }
    for (int64_t i = 0; !rc && i < n_all; i++) int8_consider(w, all[i].file, all[i].t);
    if (w->n) qsort(w->v, (size_t)w->n, sizeof *w->v, int8_cmp_src);
    free(all);
    json_decref(root);
    free(index);
    return rc;
}

static uint64_t int8_pair_bytes(const st_tensor *t) { return (uint64_t)t->shape[0] * (2 + (uint64_t)t->shape[1]); }

static char *int8_shard_name(int i, int n) {
    if (n == 1) return xstrdup(INT8_SPINE_FILE);
    char buf[64];
    snprintf(buf, sizeof buf, "spine-int8-%05d-of-%05d.safetensors", i + 1, n);
    return xstrdup(buf);
}

#define INT8_META_METHOD "per-row absmax: scale = fp16(max|w|/127) (0 for a zero row), q = round(w/scale) " \
                         "clamped to [-127,127]; NAME I8 [out,in] follows NAME_scale F16 [out]"
#define INT8_META_RULE "2-D F32/BF16/F16 spine matrices with both dims >= 64 and even columns, except routed " \
                       "experts, the MoE router (*.gate.weight) and kv_b_proj"

/* The sidecar's metadata as key, value pairs (NULL-terminated); source is the checkpoint folder, digest the
 * source record of the shard's tensors (NULL in the index). */
static void int8_metadata_pairs(const char *source, const char *digest, const char *pairs[13]) {
    const char *v[] = {"format", "pt", "deltafin", "int8-spine 1", "source", source, "method", INT8_META_METHOD,
                       "rule", INT8_META_RULE, digest ? "source_digest" : NULL, digest, NULL};
    memcpy(pairs, v, sizeof v);
}

static json_t *int8_metadata(const char *dir) {
    char *abs = realpath(dir, NULL);
    const char *pairs[13];
    int8_metadata_pairs(abs ? abs : dir, NULL, pairs);
    json_t *m = json_object();
    for (int i = 0; pairs[i]; i += 2) json_object_set_new(m, pairs[i], json_string(pairs[i + 1]));
    free(abs);
    return m;
}

/* The first bytes of a shard of tensors [a, b) (scale then data for each), its data region starting at a multiple
 * of INT8_HEADER_ALIGN. */
static int int8_header(const int8_writer *w, int a, int b, uint8_t **head, size_t *hlen, df_error *err) {
    st_write_tensor *ts = xcalloc(2 * (size_t)(b - a) + 1, sizeof *ts);
    char **names = xcalloc((size_t)(b - a) + 1, sizeof *names);
    for (int i = a; i < b; i++) {
        const st_tensor *t = w->v[i].t;
        names[i - a] = xmalloc(strlen(t->name) + sizeof INT8_SPINE_SCALE_SUFFIX);
        sprintf(names[i - a], "%s%s", t->name, INT8_SPINE_SCALE_SUFFIX);
        uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
        ts[2 * (i - a)] = (st_write_tensor){names[i - a], "F16", 1, {t->shape[0]}, rows * 2};
        ts[2 * (i - a) + 1] = (st_write_tensor){t->name, "I8", 2, {t->shape[0], t->shape[1]}, rows * cols};
    }
    char *abs = realpath(w->dir, NULL), digest[17];
    uint64_t h = INT8_DIGEST_SEED;   /* in the order the tensors lie in the shard, as int8_spine_check reads them */
    for (int i = a; i < b; i++) h = int8_source_id(w->v[i].t, h);
    int8_digest_hex(h, digest);
    const char *meta[13];
    int8_metadata_pairs(abs ? abs : w->dir, digest, meta);
    int rc = st_write_header(ts, 2 * (b - a), meta, INT8_HEADER_ALIGN, head, hlen, NULL, NULL, err);
    free(abs);
    for (int i = 0; i < b - a; i++) free(names[i]);
    free(names);
    free(ts);
    return rc;
}

/* Quantises tensor t row by row to f at its current position: data first (after room for the scales), then
 * the scales written back in front of it. */
static int int8_write_tensor(const st_file *src, const st_tensor *t, FILE *f, const char *path, df_error *err) {
    df_tensor v;
    int rc = st_tensor_view(src, t, &v, err);
    if (rc) return rc;
    int64_t rows = t->shape[0], cols = t->shape[1];
    float *row = xmalloc(sizeof *row * (size_t)cols);
    int8_t *q = xmalloc((size_t)cols);
    uint16_t *scale = xmalloc(sizeof *scale * (size_t)rows);
    int64_t esz = t->elem_size;
    void *raw = xmalloc((size_t)(cols * esz));
    df_tensor one = v;
    one.shape[0] = 1;
    one.data = raw;
    off_t at = ftello(f);
    int ok = at >= 0 && fseeko(f, at + 2 * rows, SEEK_SET) == 0;
    for (int64_t r = 0; ok && r < rows && !rc; r++) {
        memcpy(raw, (const uint8_t *)v.data + r * cols * esz, (size_t)(cols * esz));   /* may be unaligned */
        tensor_row_f32(&one, 0, row);
        scale[r] = int8_quantize_row(row, cols, q);
        if (scale[r] == INT8_BAD_SCALE)
            rc = (df_error_set(err, DF_EFORMAT, "%s: tensor '%s': row %lld has a non-finite value or a magnitude "
                              "beyond fp16 scales; cannot quantise it", src->path, t->name, (long long)r), DF_EFORMAT);
        else ok = fwrite(q, 1, (size_t)cols, f) == (size_t)cols;
    }
    /* the source pages are not needed again: keep a checkpoint-sized spine from piling up in this process */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)v.data / page * page;
    madvise((void *)lo, (uintptr_t)v.data + (t->end - t->begin) - lo, MADV_DONTNEED);
    off_t end = ftello(f);
    if (ok && !rc) ok = fseeko(f, at, SEEK_SET) == 0 && fwrite(scale, 2, (size_t)rows, f) == (size_t)rows &&
                        fseeko(f, end, SEEK_SET) == 0;
    if (!ok && !rc) rc = (df_error_set(err, DF_EIO, "%s: write failed (disk full?)", path), DF_EIO);
    free(raw);
    free(row);
    free(q);
    free(scale);
    return rc;
}

static int int8_write_shard(int8_writer *w, int a, int b, const char *name, df_error *err) {
    char *path = df_path_join(w->dir, name), *tmp = NULL;
    size_t hlen;
    uint8_t *header = NULL;
    int rc = int8_header(w, a, b, &header, &hlen, err);
    int fd = rc ? -1 : df_temp_create(path, &tmp, err);   /* exclusive: never through a planted link */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!rc && !f) rc = fd < 0 ? DF_EIO : (df_error_set(err, DF_EIO, "%s: cannot create", tmp), DF_EIO);
    if (fd >= 0 && !f) close(fd);
    if (f) {
        if (fwrite(header, 1, hlen, f) != hlen) rc = (df_error_set(err, DF_EIO, "%s: write failed", tmp), DF_EIO);
        for (int i = a; i < b && !rc; i++) {
            rc = int8_write_tensor(&w->files[w->v[i].file], w->v[i].t, f, tmp, err);
            if (!rc) {
                w->stats->src_bytes += w->v[i].t->end - w->v[i].t->begin;
                w->stats->out_bytes += int8_pair_bytes(w->v[i].t);
                w->stats->n_quantised++;
            }
        }
        if (fflush(f) && !rc) rc = (df_error_set(err, DF_EIO, "%s: write failed", tmp), DF_EIO);
        int fd2 = dup(fileno(f));
        fclose(f);
        if (fd2 < 0) rc = rc ? rc : (df_error_set(err, DF_EIO, "%s: %s", tmp, strerror(errno)), DF_EIO);
        if (fd2 >= 0) {
            int rc2 = df_temp_commit(fd2, tmp, path, rc ? EIO : 0, rc ? NULL : err);
            if (!rc) rc = rc2;
        } else {
            unlink(tmp);
            free(tmp);
        }
        tmp = NULL;
    }
    free(tmp);
    free(header);
    free(path);
    return rc;
}

static int int8_write_index(int8_writer *w, const int *first, int n_shards, df_error *err) {
    json_t *wm = json_object();
    uint64_t total = 0;
    for (int s = 0; s < n_shards; s++) {
        char *name = int8_shard_name(s, n_shards);
        for (int i = first[s]; i < first[s + 1]; i++) {
            char *sname = xmalloc(strlen(w->v[i].t->name) + sizeof INT8_SPINE_SCALE_SUFFIX);
            sprintf(sname, "%s%s", w->v[i].t->name, INT8_SPINE_SCALE_SUFFIX);
            json_object_set_new(wm, sname, json_string(name));
            json_object_set_new(wm, w->v[i].t->name, json_string(name));
            total += int8_pair_bytes(w->v[i].t);
            free(sname);
        }
        free(name);
    }
    json_t *meta = int8_metadata(w->dir);
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_t *root = json_pack("{s:o, s:o}", "metadata", meta, "weight_map", wm);
    char *path = df_path_join(w->dir, INT8_SPINE_INDEX), *tmp;
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    int fd = df_temp_create(path, &tmp, err), rc = DF_EIO;
    if (fd >= 0) rc = df_temp_commit(fd, tmp, path, df_write_all(fd, text, strlen(text)), err);
    free(text);
    json_decref(root);
    free(path);
    return rc;
}

/* A new sidecar replaces any old one: its files go first, so a half-written run never mixes with them. */
static void int8_remove_old(const char *dir) {
    char **files;
    int n;
    df_error e;
    if (!int8_spine_files(dir, &files, &n, &e))
        for (int i = 0; i < n; i++) {
            char *path = df_path_join(dir, files[i]);
            unlink(path);
            free(path);
        }
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    char *index = df_path_join(dir, INT8_SPINE_INDEX), *single = df_path_join(dir, INT8_SPINE_FILE);
    unlink(index);
    unlink(single);
    free(index);
    free(single);
}

int int8_spine_write(const char *dir, uint64_t shard_bytes, FILE *progress, int8_write_stats *stats,
                     df_error *err) {
    memset(stats, 0, sizeof *stats);
    int8_writer w = {.dir = dir, .stats = stats};
    int rc = int8_collect(&w, err);
    if (!rc && !w.n)
        rc = (df_error_set(err, DF_EINVAL, "%s: no spine matrix qualifies for int8 (2-D F32/BF16/F16, both dims "
                          ">= 64, not experts/router/kv_b_proj)", dir), DF_EINVAL);
    if (!shard_bytes) shard_bytes = INT8_DEFAULT_SHARD;
    int *first = xmalloc(sizeof *first * (size_t)(w.n + 2)), n_shards = 0;
    uint64_t fill = 0;
    for (int i = 0; !rc && i < w.n; i++) {
        uint64_t b = int8_pair_bytes(w.v[i].t);
        if (i == 0 || fill + b > shard_bytes) first[n_shards++] = i, fill = 0;
        fill += b;
    }
    first[n_shards] = w.n;
    if (!rc) int8_remove_old(dir);
    for (int s = 0; !rc && s < n_shards; s++) {
        char *name = int8_shard_name(s, n_shards);
        rc = int8_write_shard(&w, first[s], first[s + 1], name, err);
        if (!rc && progress)
            fprintf(progress, "wrote %s: %d matrices\n", name, first[s + 1] - first[s]);
        free(name);
    }
    if (!rc && n_shards > 1) rc = int8_write_index(&w, first, n_shards, err);
    stats->n_files = rc ? 0 : n_shards;
    free(first);
    for (int i = 0; i < w.n_files; i++) {
        st_file_close(&w.files[i]);
        free(w.names[i]);
    }
    free(w.names);
    free(w.files);
    free(w.v);
    return rc;
}
