/* fetch_plan.h — what `deltafin fetch` and `deltafin bench fetch` learn from a remote repository before
 * moving any weight: the shard list from its index and, per shard, which byte spans are routed experts
 * (holes of a partial install) and which are not (the spine runs, header included). Everything read from
 * the remote goes through the same checks as a local file: the index through one weight_map parser, the
 * shard header through the safetensors parser storage opens local shards with; routed experts are told from
 * the spine by the tensor-name classifier storage uses (tensor_names.h). */
#ifndef DF_STORE_FETCH_PLAN_H
#define DF_STORE_FETCH_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "dcache.h"
#include "remote.h"

/* More shards than this in one index is not a model. */
#define FPLAN_MAX_SHARDS 100000

typedef struct fplan_hole {
    dc_span span;
    int layer, expert;
} fplan_hole;

typedef struct fplan_layout {
    uint64_t size, header_len;
    char sha256[65];         /* the file's SHA-256 when the remote publishes it (LFS), else "" */
    dc_span *runs;           /* non-expert byte runs (header included), by offset */
    int n_runs;
    fplan_hole *holes;       /* routed-expert spans, by offset; adjacent tensors of one expert merged */
    int n_holes;
} fplan_layout;

/* Appends to names (n of them) the shard files an index (JSON text, read from src) names in its weight_map
 * that names does not hold yet. Refuses a missing weight_map, a value that is not a string, and a name
 * that is empty, absolute or leaves the folder (".." component). */
int fplan_index_shards(const char *json, size_t len, const char *src, char ***names, int *n, df_error *err);
/* The layout of a shard of file_size bytes from its header (header_len bytes of JSON after the 8-byte
 * length), validated by st_header_parse. */
int fplan_layout_parse(fplan_layout *L, const char *name, const char *header, uint64_t header_len,
                       uint64_t file_size, df_error *err);
/* The same, reading size and header of shard `name` from r. */
int fplan_layout_fetch(fplan_layout *L, remote *r, const char *name, df_error *err);
void fplan_layout_free(fplan_layout *L);

#endif
