/* safetensors.c — parses and validates one safetensors file and maps it read-only. A malformed file must
 * fail here with a message naming the file and the tensor, never later as a wild read in a kernel. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

/* No real tensor has a dimension near 2^40 or 2^56 elements; past these, offset arithmetic on shapes
 * (zero-sized tensors carry any shape without bytes to back it) could overflow int64. */
#define ST_MAX_DIM (1ll << 40)
#define ST_MAX_NONZERO_NUMEL (1ull << 56)

typedef struct st_dtype_info {
    const char *name;
    int size;
    df_dtype dt;   /* DF_DT_COUNT: known to safetensors, not usable by the engine */
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F32", 4, DF_DT_F32},   {"BF16", 2, DF_DT_BF16},    {"F16", 2, DF_DT_F16},
    {"U8", 1, DF_DT_U8},     {"I8", 1, DF_DT_I8},        {"I32", 4, DF_DT_I32},
    {"I64", 8, DF_DT_I64},   {"F64", 8, DF_DT_COUNT},    {"BOOL", 1, DF_DT_COUNT},
    {"I16", 2, DF_DT_COUNT}, {"U16", 2, DF_DT_COUNT},    {"U32", 4, DF_DT_COUNT},
    {"U64", 8, DF_DT_COUNT}, {"F8_E4M3", 1, DF_DT_COUNT}, {"F8_E5M2", 1, DF_DT_COUNT},
    {"F8_E8M0", 1, DF_DT_COUNT},
};

static const st_dtype_info *st_dtype_lookup(const char *s) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(st_dtypes[i].name, s)) return &st_dtypes[i];
    return NULL;
}

int st_dtype_size(const char *name) {
    const st_dtype_info *d = name ? st_dtype_lookup(name) : NULL;
    return d ? d->size : 0;
}

int st_header_length(const uint8_t len8[8], uint64_t file_size, const char *path, uint64_t *header_len,
                     df_error *err) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    *header_len = hl;
    if (file_size >= 8 && hl && hl <= ST_MAX_HEADER && hl <= file_size - 8) return DF_OK;
    return df_error_set(err, DF_EFORMAT, "%s: header length %llu does not fit a file of %llu bytes (truncated or not "
                        "a safetensors file?)", path, (unsigned long long)hl, (unsigned long long)file_size),
           DF_EFORMAT;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int st_cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A non-negative JSON integer, or -1. */
static int64_t st_json_uint(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    return i < 0 ? -1 : (int64_t)i;
}

static int st_parse_entry(st_file *f, st_tensor *t, const char *name, json_t *e, uint64_t data_len,
                          df_error *err) {
    const char *p = f->path;
    if (!json_is_object(e))
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': header entry is not an object", p, name), DF_EFORMAT;
    json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape"),
           *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd))
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': missing or non-string dtype", p, name), DF_EFORMAT;
    const st_dtype_info *di = st_dtype_lookup(json_string_value(jd));
    if (!di)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", p, name,
                            json_string_value(jd)), DF_EFORMAT;
    t->dtype_name = di->name;
    t->dtype = di->dt;
    t->elem_size = di->size;
    if (!json_is_array(js) || json_array_size(js) > ST_MAX_DIMS)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shape must be an array of at most %d integers",
                            p, name, ST_MAX_DIMS), DF_EFORMAT;
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1, nonzero = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = st_json_uint(json_array_get(js, (size_t)i));
        if (d < 0)
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", p,
                                name, i), DF_EFORMAT;
        t->shape[i] = d;
        if (d > ST_MAX_DIM || nonzero > ST_MAX_NONZERO_NUMEL / (uint64_t)(d ? d : 1))
            return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shape too large", p, name), DF_EFORMAT;
        numel *= (uint64_t)d;
        nonzero *= (uint64_t)(d ? d : 1);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)di->size, &bytes))
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shape overflows", p, name), DF_EFORMAT;
    int64_t b0 = -1, b1 = -1;
    if (json_is_array(jo) && json_array_size(jo) == 2) {
        b0 = st_json_uint(json_array_get(jo, 0));
        b1 = st_json_uint(json_array_get(jo, 1));
    }
    if (b0 < 0 || b1 < 0 || b1 < b0)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers "
                            "[begin, end] with begin <= end", p, name), DF_EFORMAT;
    t->begin = (uint64_t)b0;
    t->end = (uint64_t)b1;
    if (t->end - t->begin != bytes)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': shape/bytes mismatch: %llu elements of %s need "
                            "%llu bytes, data_offsets span %llu", p, name, (unsigned long long)numel, di->name,
                            (unsigned long long)bytes, (unsigned long long)(t->end - t->begin)), DF_EFORMAT;
    if (t->end > data_len)
        return df_error_set(err, DF_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) outside the data region "
                            "(%llu bytes; file truncated?)", p, name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, (unsigned long long)data_len), DF_EFORMAT;
    t->data = f->map ? f->map + f->data_start + t->begin : NULL;
    return DF_OK;
}

/* Tensors must not share bytes; zero-sized ones own none. */
static int st_check_overlaps(st_file *f, df_error *err) {
    const st_tensor **by = xmalloc(sizeof *by * (size_t)(f->n_tensors ? f->n_tensors : 1));
    int n = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > f->tensors[i].begin) by[n++] = &f->tensors[i];
    qsort(by, (size_t)n, sizeof *by, st_cmp_begin);
    const st_tensor *last = NULL;
    int rc = DF_OK;
    f->covered = 0;
    for (int i = 0; i < n; i++) {
        if (last && by[i]->begin < last->end) {
            df_error_set(err, DF_EFORMAT, "%s: tensor '%s' [%llu, %llu) overlaps tensor '%s' [%llu, %llu)", f->path,
                         by[i]->name, (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end, last->name,
                         (unsigned long long)last->begin, (unsigned long long)last->end);
            rc = DF_EFORMAT;
            break;
        }
        f->covered += by[i]->end - by[i]->begin;
        last = by[i];
    }
    free(by);
    return rc;
}

static int st_parse_header(st_file *f, const char *json, df_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, (size_t)f->header_len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return df_error_set(err, DF_EFORMAT, "%s: bad JSON in header: %s (line %d, column %d)", f->path, je.text,
                            je.line, je.column), DF_EFORMAT;
    if (!json_is_object(root)) {
        json_decref(root);
        return df_error_set(err, DF_EFORMAT, "%s: header is not a JSON object", f->path), DF_EFORMAT;
    }
    size_t cap = json_object_size(root), names_len = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) names_len += strlen(key) + 1;
    f->tensors = xcalloc(cap ? cap : 1, sizeof *f->tensors);
    f->names = xmalloc(names_len ? names_len : 1);
    uint64_t data_len = f->size - f->data_start;
    size_t np = 0;
    int rc = DF_OK;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        size_t kl = strlen(key) + 1;
        memcpy(f->names + np, key, kl);
        st_tensor *t = &f->tensors[f->n_tensors];
        t->name = f->names + np;
        np += kl;
        if ((rc = st_parse_entry(f, t, t->name, val, data_len, err))) break;
        f->n_tensors++;
    }
    json_decref(root);
    if (rc) return rc;
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, st_cmp_name);
    return st_check_overlaps(f, err);
}

int st_file_open(st_file *f, const char *path, df_error *err) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    int fd = df_open_regular(path, O_RDONLY, err);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0) df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno)), close(fd);
        st_file_close(f);
        return DF_EIO;
    }
    if (sb.st_size < 8) {
        df_error_set(err, DF_EFORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length (truncated?)",
                     path, (long long)sb.st_size);
        close(fd);
        st_file_close(f);
        return DF_EFORMAT;
    }
    f->size = (size_t)sb.st_size;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        df_error_set(err, DF_EIO, "%s: mmap failed: %s", path, strerror(errno));
        st_file_close(f);
        return DF_EIO;
    }
    f->map = m;
    uint64_t hl;
    if (st_header_length(f->map, f->size, path, &hl, err)) {
        st_file_close(f);
        return DF_EFORMAT;
    }
    f->header_len = hl;
    f->data_start = 8 + hl;
    int rc = st_parse_header(f, (const char *)f->map + 8, err);
    if (rc) st_file_close(f);
    return rc;
}

int st_header_parse(st_file *f, const char *path, const char *json, uint64_t header_len, uint64_t file_size,
                    df_error *err) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(header_len >> (8 * i));
    uint64_t hl;
    if (st_header_length(len8, file_size, path, &hl, err)) {
        st_file_close(f);
        return DF_EFORMAT;
    }
    f->size = (size_t)file_size;
    f->header_len = header_len;
    f->data_start = 8 + header_len;
    int rc = st_parse_header(f, json, err);
    if (rc) st_file_close(f);
    return rc;
}

void st_file_close(st_file *f) {
    if (f->map) munmap((void *)f->map, f->size);
    free(f->tensors);
    free(f->names);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_file_find(const st_file *f, const char *name) {
    st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof key, st_cmp_name);
}

int st_tensor_view(const st_file *f, const st_tensor *t, df_tensor *out, df_error *err) {
    if (t->dtype == DF_DT_COUNT)
        return df_error_set(err, DF_EUNSUPPORTED, "%s: tensor '%s': unsupported dtype %s", f->path, t->name,
                            t->dtype_name), DF_EUNSUPPORTED;
    if (t->ndim > 4)
        return df_error_set(err, DF_EUNSUPPORTED, "%s: tensor '%s': %d dimensions, at most 4 supported", f->path,
                            t->name, t->ndim), DF_EUNSUPPORTED;
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
    out->data = t->data;
    return DF_OK;
}
