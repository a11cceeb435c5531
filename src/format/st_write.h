/* st_write.h — the one safetensors writer: the header of a file whose tensors lie back to back in the given
 * order, and (for tensors held in memory) the whole file. Synth, the int8 spine sidecar and the tests'
 * fixtures write through it, so every file the project writes has the layout st_file_open checks. */
#ifndef DF_ST_WRITE_H
#define DF_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"
#include "safetensors.h"

typedef struct st_write_tensor {
    const char *name;
    const char *dtype;       /* as in the header: "F32", "BF16", "U8", ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t bytes;          /* must be the shape's element count times the dtype's size */
} st_write_tensor;

/* The file's first bytes: the 8-byte length, then the JSON header ("__metadata__" first when meta, a
 * NULL-terminated list of key, value strings, is given; then the tensors in order, from data offset 0 on,
 * back to back), padded with spaces so that the data region starts at a multiple of align (a power of two,
 * at least 8). *out (caller frees) gets *out_len = 8 + header length bytes; offsets (if given) each tensor's
 * offset in the data region; *data_bytes the data region's size. Refuses an unknown dtype, bytes that do not
 * match the shape, a name given twice and the name "__metadata__". */
int st_write_header(const st_write_tensor *ts, int n, const char *const *meta, uint64_t align, uint8_t **out,
                    size_t *out_len, uint64_t *offsets, uint64_t *data_bytes, df_error *err);
/* The whole file at path: the header of st_write_header, then data[i] (bytes of tensor i) for each tensor. */
int st_write_file(const char *path, const st_write_tensor *ts, const void *const *data, int n,
                  const char *const *meta, uint64_t align, df_error *err);

#endif
