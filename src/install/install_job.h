/* install_job.h — installing a model into a folder from a repository in the Hugging Face hub layout (what
 * `deltafin fetch` runs): all of it, just its spine, or the spine plus some layers' experts in the disk
 * cache; and the routed-expert spans of a repository for `deltafin bench fetch`. Front ends pass options and
 * callbacks and print; nothing here writes to stdout or stderr. */
#ifndef DF_STORE_INSTALL_JOB_H
#define DF_STORE_INSTALL_JOB_H

#include <stdint.h>
#include "deltafin.h"
#include "remote.h"

typedef enum install_what {
    INSTALL_SPINE,           /* config, tokenizer, index, shard headers and every non-expert tensor */
    INSTALL_LAYERS,          /* the spine plus the experts of the chosen layers, into the disk cache */
    INSTALL_ALL,             /* the spine plus every routed expert written into its shard: a complete install */
} install_what;

typedef struct install_opts {
    const char *from;        /* org/name[@revision] (via $HF_ENDPOINT) or an http(s) URL of a revision */
    const char *dir;         /* install folder, created if needed (not by a dry run) */
    install_what what;
    const unsigned char *layers;  /* INSTALL_LAYERS: layers[l] != 0 selects decoder layer l < n_layers */
    int n_layers;
    int dry_run;             /* plan and check the disk only: nothing is written */
    int jobs;                /* parallel connections, 1..64; 0 = 8 */
    double min_free_gb;      /* refuse to start (and to cache) when less than this would stay free */
    double stall_s;          /* see remote_opts; 0 = its default */
} install_opts;

/* What a run will download and the disk it needs, known before any weight moves. */
typedef struct install_plan {
    int meta_files;          /* metadata files (config, tokenizer, index...) not in the folder yet */
    int n_shards, n_local;   /* shards, and of them complete local files no manifest tracks */
    int spine_shards;        /* shards whose spine is still to fetch */
    uint64_t spine_bytes;    /* their non-expert bytes, headers included */
    int64_t expert_spans;    /* routed-expert spans to download (cached or already written ones excluded) */
    uint64_t expert_bytes;
    uint64_t disk_bytes;     /* disk the run adds (sums saturate at UINT64_MAX, never wrap) */
    int disk_known;          /* free space was found for dir or its nearest existing parent */
    uint64_t disk_free;      /* bytes free there when planned */
    uint64_t keep_free;      /* min_free_gb in bytes */
} install_plan;

typedef struct install_result {
    install_plan plan;       /* filled once planning succeeded */
    remote_stats net;        /* requests and bytes of the run */
} install_result;

/* Every callback may be NULL. progress runs on the caller's thread or on the remote's transfer thread
 * while the caller waits, never two at once: done counts bytes downloaded (not bytes copied from the
 * cache) out of total = spine_bytes + expert_bytes, plus any span planned as cached that had to be
 * downloaded after all (a corrupt entry); the last call has final = 1, done == total, and comes only on
 * success. */
typedef struct install_events {
    void *ctx;
    void (*plan)(void *ctx, const install_plan *p);   /* once, before the disk check */
    void (*progress)(void *ctx, uint64_t done, uint64_t total, int final);
    void (*warning)(void *ctx, const char *msg);  /* a fault recovered from (a corrupt cache entry) */
} install_events;

/* Plans, checks the disk against min_free_gb, then (unless dry_run) works in an order that leaves a folder
 * the next run completes after an interruption at any point. res (may be NULL) gets the plan and network
 * counters. Returns DF_OK or a status with err naming the file, span or URL at fault. */
int install_job_run(const install_opts *o, const install_events *ev, install_result *res, df_error *err);

typedef struct install_span {
    const char *file;        /* shard name, owned by the list */
    uint64_t off, len;
    int layer, expert;
} install_span;

typedef struct install_span_list {
    install_span *v;
    int n;
    char **files;
    int n_files;
} install_span_list;

/* Every routed-expert span of the repository behind r, in (shard, offset) order, from its index and shard
 * headers only (no local copy needed). */
int install_list_experts(remote *r, install_span_list *out, df_error *err);
void install_span_list_free(install_span_list *l);

#endif
