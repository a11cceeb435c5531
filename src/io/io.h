/* io.h — how storage gets bytes: a pluggable "source" that fills an aligned buffer from (file, offset,
 * length), the local-disk source (O_DIRECT with a buffered fallback), an I/O thread pool with two
 * priorities, and anonymous memory that is accounted to the budget.
 *
 * Placement rule shared by every source: a read of [off, off+len) into dst (IO_ALIGN-aligned) leaves the
 * byte at file offset off at dst + off % IO_ALIGN, and dst must hold io_span_bytes(off, len) bytes. That
 * lets O_DIRECT read whole aligned blocks straight into place and lets a long read be split into pieces at
 * aligned file offsets that land contiguously. A remote source (HTTP ranges into a disk cache) implements the
 * same read. */
#ifndef DF_STORE_IO_H
#define DF_STORE_IO_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

#define IO_ALIGN 4096u

static inline uint64_t io_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
/* Bytes a destination needs for [off, off+len) under the placement rule. */
static inline uint64_t io_span_bytes(uint64_t off, uint64_t len) {
    return io_round_up(off % IO_ALIGN + len, IO_ALIGN);
}

typedef struct io_source io_source;
struct io_source {
    /* Reads [off, off+len) of file into dst (placement rule above). what names the data in errors
     * ("expert 3 of layer 2"). Thread-safe. */
    int (*read)(io_source *s, int file, uint64_t off, uint64_t len, uint8_t *dst, const char *what,
                df_error *err);
    void (*free)(io_source *s);
    const char *(*file_name)(const io_source *s, int file);
    atomic_uint_fast64_t bytes;      /* bytes transferred from the medium (alignment padding included) */
    atomic_uint_fast64_t net_bytes;  /* of those, bytes that first came over the network (remote fetch) */
    atomic_uint_fast64_t reads;      /* read calls */
    atomic_int direct_fallbacks;     /* files that refused O_DIRECT and are read buffered */
    int kind;                        /* IO_KIND_PREAD or IO_KIND_URING (set by the source) */
};

/* How a local source issues O_DIRECT reads: a pread loop per call (one request per span, parallelism from the
 * I/O pool's threads), or io_uring (each span split into IO_URING_CHUNK requests, all in flight at once, on
 * a ring borrowed per call). IO_KIND_DEFAULT is the one measured faster here (docs/PERFORMANCE.md). */
enum { IO_KIND_DEFAULT = 0, IO_KIND_PREAD = 1, IO_KIND_URING = 2 };
#define IO_URING_CHUNK (1u << 20)

typedef struct io_local_opts {
    int direct;      /* try O_DIRECT (falls back per file to buffered pread + POSIX_FADV_DONTNEED when the file
                        system refuses it); 0: always buffered */
    int kind;        /* IO_KIND_*; io_uring falls back to pread when rings cannot be set up (old kernel, seccomp) */
} io_local_opts;

/* Local files. The environment variable DELTAFIN_TEST_NO_DIRECT, read once here, makes O_DIRECT fail for
 * chosen files so tests reach the fallback: a comma-separated list of "open:NAME" (open(O_DIRECT) fails with
 * EINVAL) and "read:NAME" (direct reads fail with EINVAL), NAME a file's base name or "*". */
int io_local_open_ex(io_source **out, int n_files, const char *const *paths, const io_local_opts *o,
                     df_error *err);
/* The same with the default kind. */
int io_local_open(io_source **out, int n_files, const char *const *paths, int direct, df_error *err);
/* The kind a source actually uses (IO_KIND_PREAD after an io_uring fallback); IO_KIND_PREAD for non-local. */
int io_source_kind(const io_source *s);
static inline void io_source_free(io_source *s) { if (s) s->free(s); }

/* A pool of threads that run blocking reads; high-priority jobs (expert reads the model waits for) are
 * always taken before low-priority ones (the next layer's spine), and those before guesses (look-ahead,
 * warming), which may turn out not to be needed. */
typedef struct io_pool io_pool;
enum { IO_PRIO_HIGH = 0, IO_PRIO_LOW = 1, IO_PRIO_GUESS = 2, IO_PRIOS = 3 };
io_pool *io_pool_new(int n_threads);
void io_pool_free(io_pool *p);
void io_pool_submit(io_pool *p, int prio, void (*fn)(void *arg), void *arg);
/* Seconds since the pool started during which at least one job was running (reads in flight); with sure, one
 * job other than a guess. */
double io_pool_busy_seconds(io_pool *p, int sure);

/* A countdown that a submitter waits on while pool jobs finish. */
typedef struct io_latch io_latch;
io_latch *io_latch_new(void);
void io_latch_free(io_latch *l);
void io_latch_add(io_latch *l, int n);
void io_latch_done(io_latch *l);
void io_latch_wait(io_latch *l);

/* Page-aligned anonymous memory (untouched pages cost nothing until used), and its release. */
void *io_mem_alloc(size_t n);
void io_mem_free(void *p, size_t n);

#endif
