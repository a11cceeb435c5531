/* remote.h — HTTP range reads of a model repository (Hugging Face hub layout: every file at
 * {base}/{file}, base = {endpoint}/{repo}/resolve/{revision}), and the source that lets storage run on a
 * partial install.
 *
 * remote_fetch runs a set of range requests in parallel over a pool of keep-alive HTTP/1.1 connections
 * (libcurl multi interface, one background thread shared by every caller). Each request is exactly one
 * "Range: bytes=a-b" GET; the answer must be 206 with exactly that Content-Range and exactly len body bytes.
 * Transient faults (connection reset, short body, stall, 429/500/502/503/504 with or without Retry-After)
 * are retried with exponential backoff, asking only for the bytes still missing; the rest (200 instead of
 * 206, a wrong Content-Range, 404, 401/403, DNS failure) fail at once with an error naming what was being
 * fetched and the URL. Redirects are followed; the final URL of a file is remembered so later ranges of it
 * cost one request (a remembered URL that starts failing is dropped and the original asked again). */
#ifndef DF_STORE_REMOTE_H
#define DF_STORE_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"
#include "io/io.h"

typedef struct remote remote;

typedef struct remote_opts {
    int jobs;                /* parallel connections; 0 = 8 */
    double stall_s;          /* a transfer moving < 1 KiB/s for this long is a fault; 0 = 30 */
    double connect_s;        /* connect timeout; 0 = 15 */
    int attempts;            /* tries per request, first included; 0 = 6 */
    double backoff_s;        /* first retry delay, doubled each time up to 8 s; 0 = 0.25 */
    double retry_after_max_s;/* longest Retry-After honoured; 0 = 30 */
    const char *token;       /* bearer token; NULL = $HF_TOKEN */
} remote_opts;

typedef struct remote_stats {
    uint64_t requests;       /* HTTP requests sent (retries and redirects included) */
    uint64_t bytes;          /* body bytes received */
    uint64_t retries;        /* attempts after a transient fault */
    uint64_t connects;       /* new connections opened */
} remote_stats;

/* Receives the bytes of a request as they arrive: at = offset within the request's range. Returns DF_OK
 * or fills err (a disk-full write, say): the request then fails at once with that error. */
typedef int (*remote_sink_fn)(void *ctx, uint64_t at, const uint8_t *p, size_t n, df_error *err);

typedef struct remote_req {
    const char *file;        /* path under the base URL */
    uint64_t off, len;       /* the byte range [off, off+len); len > 0 */
    const char *what;        /* for errors: "expert 3 of layer 2" */
    uint8_t *dst;            /* len bytes, or NULL to use sink */
    remote_sink_fn sink;
    void *ctx;
    /* results */
    int rc;                  /* DF_OK or the failure */
    int attempts;
} remote_req;

/* base: an http(s) URL, no trailing slash needed. */
int remote_open(remote **out, const char *base, const remote_opts *opts, df_error *err);
void remote_free(remote *r);
const char *remote_base(const remote *r);
/* Runs the requests (at most `jobs` at a time, more callers share the pool) and waits for all of them.
 * Returns DF_OK, or the first failure's status with err naming that request. Thread-safe. */
int remote_fetch(remote *r, remote_req *reqs, int n, df_error *err);
/* Total size of a file, from the Content-Range of a one-byte request. */
int remote_file_size(remote *r, const char *file, uint64_t *size, df_error *err);
/* The same, and the file's SHA-256 as 64 lowercase hex digits when the server publishes it (the hub's LFS
 * files: X-Linked-Etag on its redirect, or an ETag that is a SHA-256); "" when not. */
int remote_file_info(remote *r, const char *file, uint64_t *size, char sha256[65], df_error *err);
/* A whole (small) file: *data NUL-terminated, caller frees. *missing = 1 and DF_OK when the server says 404. */
int remote_get_file(remote *r, const char *file, char **data, size_t *len, int *missing, df_error *err);
void remote_get_stats(remote *r, remote_stats *out);

/* "org/name", "org/name@rev" (via $HF_ENDPOINT, default https://huggingface.co) or an http(s) URL of a
 * repository revision; returns the base URL (caller frees) or NULL with err set. */
char *remote_resolve_base(const char *from, df_error *err);

/* The source storage reads shards through. A complete install (no DIR/.deltafin/install.json) gets the
 * plain local source. A partial one reads present bytes locally and every missing expert span from the disk
 * cache, fetching it with one range request from remote_url first (NULL: an error naming the expert and
 * suggesting --remote or `deltafin fetch`). paths are the shards as storage opened them (DIR/name). */
int io_install_open(io_source **out, const char *dir, int n_files, const char *const *paths, int direct,
                    const char *remote_url, df_error *err);
/* The same over a local source storage already opened on the folder's n_files shards: when the folder is a
 * partial install, *src is replaced by the install source, which takes ownership of it; else unchanged. */
int io_install_wrap(io_source **src, const char *dir, int n_files, const char *remote_url, df_error *err);
/* Appends "local: ..." lines (how much of the model is on disk, and what is cached) for `deltafin info`;
 * nothing for a complete install. */
void install_describe(const char *dir, char *buf, size_t cap);

#endif
