/* int8_spine.h — the int8 spine sidecar: per-row absmax int8 copies of a checkpoint's large spine
 * matrices, written beside it by `deltafin quantize --spine int8` and used by storage when asked to.
 *
 * File format: ordinary safetensors, spine-int8.safetensors (or spine-int8-NNNNN-of-NNNNN.safetensors shards
 * listed by spine-int8.safetensors.index.json). Each quantised matrix W [out, in] of the checkpoint becomes two
 * tensors under its full checkpoint name N: "N_scale" F16 [out] immediately followed in the data region by
 * "N" I8 [out, in], so one byte range holds both (storage reads and streams it as one region, and the view is
 * scale = first byte, data = first byte + 2*out). Row r dequantises to q[r, c] * scale[r]; scale[r] is the fp16
 * rounding of max|W[r, :]| / 127 (0 for an all-zero row) and q = round(W / scale) clamped to [-127, 127].
 * __metadata__ records the method, the source checkpoint, and each shard's source_digest: a hash of the identity
 * of the checkpoint tensors its matrices were computed from (name, dtype, shape, length and sampled rows, in
 * the shard's order), so a sidecar left over from other weights is recognised instead of used. */
#ifndef DF_STORE_INT8_SPINE_H
#define DF_STORE_INT8_SPINE_H

#include <stdint.h>
#include <stdio.h>
#include "deltafin.h"
#include "safetensors.h"

#define INT8_SPINE_FILE "spine-int8.safetensors"
#define INT8_SPINE_INDEX "spine-int8.safetensors.index.json"
#define INT8_SPINE_SCALE_SUFFIX "_scale"

/* Whether a checkpoint tensor is quantised: a 2-D F32/BF16/F16 matrix with both dims >= 64 and an even column
 * count, that the tensor-name table (tensor_names.h) files as a top-level or per-layer spine tensor (not a
 * routed expert, not an unknown or non-text name), not the MoE router (expert choice is kept exact) and not
 * kv_b_proj (absorbed MLA reads it transposed, which the I8 kernels do not do). Everything else — norms,
 * biases, conv weights, A_log, small matrices — stays as the checkpoint has it. */
int int8_spine_eligible(const char *name, df_dtype dt, int ndim, const int64_t *shape);

/* Quantises one row of n floats into q; returns the fp16 bits of its scale. Rows with a non-finite value or
 * a scale beyond fp16 return 0xFFFF (callers reject the tensor). */
uint16_t int8_quantize_row(const float *w, int64_t n, int8_t *q);
#define INT8_BAD_SCALE 0xFFFFu

typedef struct int8_write_stats {
    int n_quantised;            /* matrices written */
    int n_files;                /* sidecar shards */
    uint64_t src_bytes;         /* bytes of those matrices in the checkpoint */
    uint64_t out_bytes;         /* their int8 + scale bytes */
    uint64_t spine_bytes;       /* all spine (non-routed-expert) bytes of the checkpoint */
} int8_write_stats;

/* Writes the sidecar for the checkpoint in dir (model.safetensors or model.safetensors.index.json), streaming
 * one row at a time; shards hold at most shard_bytes each (0 = 4 GiB; a matrix is never split). Files are
 * written under temporary names and renamed when complete. progress (may be NULL) gets one line per shard. */
int int8_spine_write(const char *dir, uint64_t shard_bytes, FILE *progress, int8_write_stats *stats,
                     df_error *err);

/* The sidecar files of dir (names inside dir; caller frees each and the array); DF_OK with *n = 0 when absent. */
int int8_spine_files(const char *dir, char ***files, int *n, df_error *err);

/* Looks up the quantised form of checkpoint tensor `name` in sidecar f. Returns 1 and fills span (a tensor
 * covering scale then data: dtype I8, shape [out, in], begin/end the whole byte range, elem_size 2, data the
 * mapped first byte), 0 when f has no such tensor, or a negative status when the pair is malformed. */
int int8_spine_find(const st_file *f, const char *name, st_tensor *span, df_error *err);

/* Checks sidecar shard side against the checkpoint files src[0..n_src): its source_digest must be what the
 * checkpoint's tensors of the same names give now. DF_EFORMAT naming the sidecar when it was made from other
 * weights, holds a tensor the checkpoint lacks, or records no digest. */
int int8_spine_check(const st_file *side, const st_file *src, int n_src, df_error *err);

/* Points v (an I8 view with its shape set) at a span's bytes: scale first, then data. */
void int8_spine_place(df_tensor *v, const uint8_t *span);

#endif
