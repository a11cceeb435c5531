/* fetch.h — what `deltafin bench fetch` borrows from `deltafin fetch`: the routed-expert spans of a remote
 * repository, read from its index and shard headers only (no local copy needed). */
#ifndef DF_CLI_FETCH_H
#define DF_CLI_FETCH_H

#include <stdint.h>
#include "storage/remote.h"

typedef struct fetch_span {
    const char *file;        /* shard name, owned by the list */
    uint64_t off, len;
    int layer, expert;
} fetch_span;

typedef struct fetch_span_list {
    fetch_span *v;
    int n;
    char **files;
    int n_files;
} fetch_span_list;

/* Every expert span of the repository behind r, in (shard, offset) order. */
int fetch_list_experts(remote *r, fetch_span_list *out, df_error *err);
void fetch_span_list_free(fetch_span_list *l);

/* `deltafin bench fetch` (bench_fetch.c); argv[0] is "fetch". */
int bench_fetch(int argc, char **argv);

#endif
