/* safetensors.h — one safetensors file: validated header, read-only mapping, per-tensor views.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data region. Each header
 * entry names a dtype, a shape and data_offsets [begin, end) relative to the data region, so a tensor's
 * absolute file offset is 8 + N + begin. Everything in the header is checked at open (sizes, overlaps,
 * bounds); dtypes the engine cannot use parse fine and fail only when a view of them is asked for. */
#ifndef DF_SAFETENSORS_H
#define DF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"
#include "common/tensor.h"

#define ST_MAX_DIMS 8
/* The safetensors format caps its header at 100 MB; the largest K3 shard header is well under 2 MB. */
#define ST_MAX_HEADER (100ull << 20)

typedef struct st_tensor {
    const char *name;        /* owned by the file */
    const char *dtype_name;  /* as written in the header ("BF16", "F64", ...) */
    df_dtype dtype;          /* DF_DT_COUNT when the engine has no such dtype */
    int elem_size;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;     /* data_offsets, relative to the data region */
    const uint8_t *data;     /* into the mapping */
} st_tensor;

typedef struct st_file {
    char *path;
    const uint8_t *map;
    size_t size;             /* whole file */
    uint64_t header_len;
    uint64_t data_start;     /* 8 + header_len */
    int n_tensors;
    st_tensor *tensors;      /* sorted by name */
    char *names;             /* storage for tensor names */
    uint64_t covered;        /* data-region bytes covered by some tensor */
} st_file;

/* The header length in a file's first 8 bytes (little-endian), checked to be non-zero, at most ST_MAX_HEADER and
 * inside a file of file_size bytes; the error names path. */
int st_header_length(const uint8_t len8[8], uint64_t file_size, const char *path, uint64_t *header_len,
                     df_error *err);
/* Bytes per element of a safetensors dtype name ("BF16" -> 2), 0 for a name the format does not have. */
int st_dtype_size(const char *name);
/* Maps and validates the file; on failure fills err naming the file (and the tensor at fault). */
int st_file_open(st_file *f, const char *path, df_error *err);
/* The same checks on a header held in memory (json: header_len bytes, read from a remote shard of
 * file_size bytes): f gets no mapping and its tensors no data pointers. */
int st_header_parse(st_file *f, const char *path, const char *json, uint64_t header_len, uint64_t file_size,
                    df_error *err);
void st_file_close(st_file *f);
/* The tensor of that exact name, or NULL. */
const st_tensor *st_file_find(const st_file *f, const char *name);
/* Absolute byte offset of the tensor in the file. */
static inline uint64_t st_tensor_offset(const st_file *f, const st_tensor *t) { return f->data_start + t->begin; }
/* A df_tensor view of t; fails ("unsupported dtype", more than 4 dims) naming the file and tensor. */
int st_tensor_view(const st_file *f, const st_tensor *t, df_tensor *out, df_error *err);

#endif
