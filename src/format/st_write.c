/* st_write.c — builds safetensors headers and writes small files (st_write.h). Sizes are checked against the
 * dtype table the parser uses, so a writer bug shows up here rather than as a file the engine refuses. */
#include "st_write.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static int stw_check(const st_write_tensor *t, df_error *err) {
    int size = st_dtype_size(t->dtype);
    if (!size)
        return df_error_set(err, DF_EINVAL, "tensor '%s': unknown safetensors dtype '%s'", t->name,
                            t->dtype ? t->dtype : "(null)"), DF_EINVAL;
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
        return df_error_set(err, DF_EINVAL, "tensor '%s': %d dimensions", t->name, t->ndim), DF_EINVAL;
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
            return df_error_set(err, DF_EINVAL, "tensor '%s': bad shape", t->name), DF_EINVAL;
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)size, &bytes) || bytes != t->bytes)
        return df_error_set(err, DF_EINVAL, "tensor '%s': %llu bytes given for %llu elements of %s", t->name,
                            (unsigned long long)t->bytes, (unsigned long long)numel, t->dtype), DF_EINVAL;
    return DF_OK;
}

int st_write_header(const st_write_tensor *ts, int n, const char *const *meta, uint64_t align, uint8_t **out,
                    size_t *out_len, uint64_t *offsets, uint64_t *data_bytes, df_error *err) {
    *out = NULL;
    *out_len = 0;
    if (align < 8 || (align & (align - 1)))
        return df_error_set(err, DF_EINVAL, "safetensors alignment %llu is not a power of two >= 8",
                            (unsigned long long)align), DF_EINVAL;
    json_t *h = json_object();
    if (meta) {
        json_t *m = json_object();
        for (int i = 0; meta[i] && meta[i + 1]; i += 2) json_object_set_new(m, meta[i], json_string(meta[i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    uint64_t off = 0;
    int rc = DF_OK;
    for (int i = 0; i < n && !rc; i++) {
        const st_write_tensor *t = &ts[i];
        if ((rc = stw_check(t, err))) break;
        if (!strcmp(t->name, "__metadata__") || json_object_get(h, t->name)) {
            rc = (df_error_set(err, DF_EINVAL, "tensor name '%s' given twice or reserved", t->name), DF_EINVAL);
            break;
        }
        json_t *shape = json_array();
        for (int k = 0; k < t->ndim; k++) json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
        json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype, "shape", shape,
                                                  "data_offsets", (json_int_t)off, (json_int_t)(off + t->bytes)));
        if (offsets) offsets[i] = off;
        off += t->bytes;
    }
    char *text = rc ? NULL : json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (rc) return rc;
    size_t tl = strlen(text), hl = (size_t)((8 + tl + align - 1) / align * align - 8);
    uint8_t *buf = xmalloc(8 + hl);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, text, tl);
    memset(buf + 8 + tl, ' ', hl - tl);
    free(text);
    *out = buf;
    *out_len = 8 + hl;
    if (data_bytes) *data_bytes = off;
    return DF_OK;
}

int st_write_file(const char *path, const st_write_tensor *ts, const void *const *data, int n,
                  const char *const *meta, uint64_t align, df_error *err) {
    uint8_t *head;
    size_t len;
    int rc = st_write_header(ts, n, meta, align, &head, &len, NULL, NULL, err);
    if (rc) return rc;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(head, 1, len, f) == len;
    for (int i = 0; ok && i < n; i++) ok = !ts[i].bytes || fwrite(data[i], 1, (size_t)ts[i].bytes, f) == ts[i].bytes;
    if (f && fclose(f)) ok = 0;
    free(head);
    if (!ok) return df_error_set(err, DF_EIO, "%s: cannot write: %s", path, strerror(errno)), DF_EIO;
    return DF_OK;
}
