/* io.c — the local-disk source (O_DIRECT reads through a pread loop or io_uring, with a per-file buffered
 * fallback), the I/O thread pool, the latch and accounted anonymous memory. Reads are retried on EINTR/EAGAIN
 * and short transfers; EIO is retried twice before it becomes an error naming the file, the range and what
 * was being read. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

#define IO_EIO_RETRIES 2
#define IO_URING_DEPTH 64
/* The kind measured faster on this project's disk (docs/PERFORMANCE.md, "Reader"). */
#define IO_KIND_FASTEST IO_KIND_URING

typedef struct io_file {
    char *path;
    int fd_buf;
    int fd_direct;            /* -1 when the file was opened without O_DIRECT */
    int refuse_direct;        /* test hook: direct reads fail with EINVAL */
    atomic_int direct_ok;     /* cleared when the file system refuses O_DIRECT reads */
} io_file;

/* One io_uring, used by one read call at a time. */
typedef struct io_ring {
    struct io_uring ring;
    struct io_ring *next;
} io_ring;

typedef struct io_local {
    io_source base;
    int n;
    io_file *f;
    pthread_mutex_t ring_mu;
    io_ring *rings_free;      /* rings not in use; more are made when concurrent callers need them */
    io_ring **rings_made;
    int n_rings, cap_rings;
} io_local;

/* Reads up to want bytes at off; stops early only at end of file. Returns 0 or an errno value, with the bytes
 * transferred in *got. */
static int io_pread_loop(int fd, uint8_t *dst, uint64_t want, uint64_t off, uint64_t *got) {
    int eio = 0;
    *got = 0;
    while (*got < want) {
        ssize_t r = pread(fd, dst + *got, want - *got, (off_t)(off + *got));
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            if (errno == EIO && eio++ < IO_EIO_RETRIES) continue;
            return errno;
        }
        if (r == 0) break;
        *got += (uint64_t)r;
    }
    return 0;
}

/* ---- io_uring ---------------------------------------------------------------------------------------- */

typedef struct io_chunk {
    uint64_t len, done;
    int eio;       /* EIO retries used */
    int err;       /* errno that ended it */
    int eof;
} io_chunk;

/* Submits what is prepared and waits for at least one completion; retries interruptions. */
static void io_ring_submit_wait(io_ring *r) {
    for (;;) {
        int rc = io_uring_submit_and_wait(&r->ring, 1);
        if (rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
            if (rc >= 0) return;
            struct io_uring_cqe *cqe;
            if (io_uring_peek_cqe(&r->ring, &cqe) == 0) return;   /* completions to reap first */
            continue;
        }
        df_die("io_uring_submit_and_wait: %s", strerror(-rc));
    }
}

/* Like io_pread_loop for an O_DIRECT fd (off, want and dst aligned), as IO_URING_CHUNK requests all in flight
 * at once. Short transfers are resubmitted for the rest; EINTR/EAGAIN are resubmitted; EIO twice per chunk.
 * *got is the contiguous prefix read. */
static int io_uring_loop(io_ring *r, int fd, uint8_t *dst, uint64_t want, uint64_t off, uint64_t *got) {
    int n = (int)((want + IO_URING_CHUNK - 1) / IO_URING_CHUNK);
    io_chunk *c = xcalloc((size_t)n + 1, sizeof *c);
    int *todo = xmalloc(sizeof *todo * ((size_t)n + 1));
    int n_todo = 0, next = 0, inflight = 0;
    for (int i = 0; i < n; i++) c[i].len = DF_MIN((uint64_t)IO_URING_CHUNK, want - (uint64_t)i * IO_URING_CHUNK);
    while (next < n || n_todo || inflight) {
        while (inflight < IO_URING_DEPTH && (n_todo || next < n)) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (!sqe) break;
            int i = n_todo ? todo[--n_todo] : next++;
            uint64_t at = (uint64_t)i * IO_URING_CHUNK + c[i].done;
            io_uring_prep_read(sqe, fd, dst + at, (unsigned)(c[i].len - c[i].done), off + at);
            io_uring_sqe_set_data64(sqe, (uint64_t)i);
            inflight++;
        }
        io_ring_submit_wait(r);
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&r->ring, &cqe) == 0) {
            int i = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
            io_uring_cqe_seen(&r->ring, cqe);
            inflight--;
            io_chunk *k = &c[i];
            if (res == -EINTR || res == -EAGAIN || (res == -EIO && k->eio++ < IO_EIO_RETRIES)) todo[n_todo++] = i;
            else if (res < 0) k->err = -res;
            else if (res == 0) k->eof = 1;
            else if ((k->done += (uint64_t)res) < k->len) {
                if (k->done % IO_ALIGN) k->eof = 1;   /* an unaligned short transfer only happens at end of file */
                else todo[n_todo++] = i;
            }
        }
    }
    int e = 0;
    *got = 0;
    for (int i = 0; i < n; i++) {
        *got += c[i].done;
        if (c[i].done < c[i].len) {
            e = c[i].err;
            break;
        }
    }
    free(c);
    free(todo);
    return e;
}

/* A ring for one call, or NULL (use pread) when none can be made. */
static io_ring *io_ring_get(io_local *L) {
    pthread_mutex_lock(&L->ring_mu);
    io_ring *r = L->rings_free;
    if (r) L->rings_free = r->next;
    pthread_mutex_unlock(&L->ring_mu);
    if (r) return r;
    r = xcalloc(1, sizeof *r);
    if (io_uring_queue_init(IO_URING_DEPTH, &r->ring, 0) < 0) {
        free(r);
        return NULL;
    }
    pthread_mutex_lock(&L->ring_mu);
    if (L->n_rings == L->cap_rings) {
        L->cap_rings = L->cap_rings ? 2 * L->cap_rings : 16;
        L->rings_made = xrealloc(L->rings_made, sizeof *L->rings_made * (size_t)L->cap_rings);
    }
    L->rings_made[L->n_rings++] = r;
    pthread_mutex_unlock(&L->ring_mu);
    return r;
}

static void io_ring_put(io_local *L, io_ring *r) {
    pthread_mutex_lock(&L->ring_mu);
    r->next = L->rings_free;
    L->rings_free = r;
    pthread_mutex_unlock(&L->ring_mu);
}

/* ---- the local source ------------------------------------------------------------------------------- */

/* O_DIRECT read of an aligned span through the source's kind. */
static int io_direct_read(io_local *L, io_file *f, uint8_t *dst, uint64_t want, uint64_t off, uint64_t *got) {
    *got = 0;
    if (f->refuse_direct) return EINVAL;
    io_ring *r = L->base.kind == IO_KIND_URING ? io_ring_get(L) : NULL;
    if (!r) return io_pread_loop(f->fd_direct, dst, want, off, got);
    int e = io_uring_loop(r, f->fd_direct, dst, want, off, got);
    io_ring_put(L, r);
    return e;
}

static int io_fail(io_local *L, int file, int code, uint64_t off, uint64_t len, const char *what, df_error *err) {
    const io_file *f = &L->f[file];
    struct stat sb;
    long long size = fstat(f->fd_buf, &sb) == 0 ? (long long)sb.st_size : -1;
    if (code == 0)
        return df_error_set(err, DF_EIO, "%s: unexpected end of file reading %s: bytes [%llu, %llu) needed, file is "
                            "%lld bytes (truncated?)", f->path, what, (unsigned long long)off,
                            (unsigned long long)(off + len), size), DF_EIO;
    return df_error_set(err, DF_EIO, "%s: read of %s failed at bytes [%llu, %llu): %s", f->path, what,
                        (unsigned long long)off, (unsigned long long)(off + len), strerror(code)), DF_EIO;
}

static int io_local_read(io_source *s, int file, uint64_t off, uint64_t len, uint8_t *dst, const char *what,
                         df_error *err) {
    io_local *L = (io_local *)s;
    DF_ASSERT(file >= 0 && file < L->n && (uintptr_t)dst % IO_ALIGN == 0);
    io_file *f = &L->f[file];
    uint64_t head = off % IO_ALIGN, got = 0;
    atomic_fetch_add(&s->reads, 1);
    if (f->fd_direct >= 0 && atomic_load(&f->direct_ok)) {
        uint64_t want = io_span_bytes(off, len);
        int e = io_direct_read(L, f, dst, want, off - head, &got);
        atomic_fetch_add(&s->bytes, got);
        if (got >= head + len) return DF_OK;   /* EOF past the span's end is fine */
        if (e && e != EINVAL) return io_fail(L, file, e, off, len, what, err);
        if (!e && got % IO_ALIGN == 0) return io_fail(L, file, 0, off, len, what, err);
        /* refused (EINVAL) or an unaligned short transfer: finish with buffered reads */
        if (e == EINVAL && got == 0 && atomic_exchange(&f->direct_ok, 0)) atomic_fetch_add(&s->direct_fallbacks, 1);
        got = got > head ? got - head : 0;
    }
    uint64_t more = 0;
    int e = io_pread_loop(f->fd_buf, dst + head + got, len - got, off + got, &more);
    atomic_fetch_add(&s->bytes, more);
    posix_fadvise(f->fd_buf, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    if (e) return io_fail(L, file, e, off, len, what, err);
    if (got + more < len) return io_fail(L, file, 0, off, len, what, err);
    return DF_OK;
}

static const char *io_local_name(const io_source *s, int file) { return ((const io_local *)s)->f[file].path; }

static void io_local_free(io_source *s) {
    io_local *L = (io_local *)s;
    for (int i = 0; i < L->n_rings; i++) {
        io_uring_queue_exit(&L->rings_made[i]->ring);
        free(L->rings_made[i]);
    }
    free(L->rings_made);
    pthread_mutex_destroy(&L->ring_mu);
    for (int i = 0; i < L->n; i++) {
        if (L->f[i].fd_buf >= 0) close(L->f[i].fd_buf);
        if (L->f[i].fd_direct >= 0) close(L->f[i].fd_direct);
        free(L->f[i].path);
    }
    free(L->f);
    free(L);
}

/* Does the DELTAFIN_TEST_NO_DIRECT list (see io.h) name this file for this mode ("open" or "read")? */
static int io_test_refuses(const char *list, const char *mode, const char *path) {
    if (!list) return 0;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t ml = strlen(mode), bl = strlen(base);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > ml && !strncmp(p, mode, ml) && p[ml] == ':') {
            const char *name = p + ml + 1;
            size_t nl = n - ml - 1;
            if ((nl == 1 && name[0] == '*') || (nl == bl && !strncmp(name, base, bl))) return 1;
        }
        p += n + (end != NULL);
    }
    return 0;
}

int io_local_open_ex(io_source **out, int n_files, const char *const *paths, const io_local_opts *o,
                     df_error *err) {
    io_local *L = xcalloc(1, sizeof *L);
    L->base.read = io_local_read;
    L->base.free = io_local_free;
    L->base.file_name = io_local_name;
    L->base.kind = o->kind == IO_KIND_DEFAULT ? IO_KIND_FASTEST : o->kind;
    pthread_mutex_init(&L->ring_mu, NULL);
    L->f = xcalloc((size_t)n_files + 1, sizeof *L->f);
    *out = &L->base;
    const char *hook = getenv("DELTAFIN_TEST_NO_DIRECT");
    for (int i = 0; i < n_files; i++) {
        io_file *f = &L->f[L->n++];
        f->path = xstrdup(paths[i]);
        f->fd_direct = -1;
        f->fd_buf = df_open_regular(paths[i], O_RDONLY, err);
        if (f->fd_buf < 0) {
            io_local_free(&L->base);
            *out = NULL;
            return DF_EIO;
        }
        if (o->direct && !io_test_refuses(hook, "open", paths[i]))
            f->fd_direct = open(paths[i], O_RDONLY | O_CLOEXEC | O_DIRECT);
        f->refuse_direct = io_test_refuses(hook, "read", paths[i]);
        atomic_store(&f->direct_ok, f->fd_direct >= 0);
        if (o->direct && f->fd_direct < 0) atomic_fetch_add(&L->base.direct_fallbacks, 1);
    }
    if (L->base.kind == IO_KIND_URING && o->direct) {   /* probe once: no io_uring here means pread */
        io_ring *r = io_ring_get(L);
        if (r) io_ring_put(L, r);
        else L->base.kind = IO_KIND_PREAD;
    }
    return DF_OK;
}

int io_local_open(io_source **out, int n_files, const char *const *paths, int direct, df_error *err) {
    io_local_opts o = {direct, IO_KIND_DEFAULT};
    return io_local_open_ex(out, n_files, paths, &o, err);
}

int io_source_kind(const io_source *s) { return s->kind ? s->kind : IO_KIND_PREAD; }

/* ---------------------------------------------------------------------------------------------------- */

typedef struct io_job {
    void (*fn)(void *);
    void *arg;
    struct io_job *next;
} io_job;

struct io_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    io_job *head[IO_PRIOS], *tail[IO_PRIOS];
    int stop;
    int n;
    pthread_t *threads;
    int active, active_sure;   /* jobs running; of them, not IO_PRIO_GUESS */
    double busy_since, busy_s; /* time with at least one job running */
    double sure_since, sure_s; /* time with at least one sure job running (look-ahead's disk utilisation) */
};

/* Lock held. A job starts (1) or ends (-1): the busy clocks. */
static void io_pool_count(io_pool *p, int prio, int d) {
    double t = df_now();
    if (d > 0 && p->active++ == 0) p->busy_since = t;
    if (d < 0 && --p->active == 0) p->busy_s += t - p->busy_since;
    if (prio == IO_PRIO_GUESS) return;
    if (d > 0 && p->active_sure++ == 0) p->sure_since = t;
    if (d < 0 && --p->active_sure == 0) p->sure_s += t - p->sure_since;
}

static void *io_pool_main(void *arg) {
    io_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int q = 0;
        while (q < IO_PRIOS && !p->head[q]) q++;
        if (q == IO_PRIOS) {
            if (p->stop) break;
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        io_job *j = p->head[q];
        p->head[q] = j->next;
        if (!p->head[q]) p->tail[q] = NULL;
        io_pool_count(p, q, 1);
        pthread_mutex_unlock(&p->mu);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&p->mu);
        io_pool_count(p, q, -1);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

io_pool *io_pool_new(int n_threads) {
    io_pool *p = xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, io_pool_main, p)) df_die("cannot start I/O thread");
        p->n++;
    }
    return p;
}

void io_pool_free(io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

void io_pool_submit(io_pool *p, int prio, void (*fn)(void *), void *arg) {
    io_job *j = xmalloc(sizeof *j);
    *j = (io_job){fn, arg, NULL};
    pthread_mutex_lock(&p->mu);
    if (p->tail[prio]) p->tail[prio]->next = j;
    else p->head[prio] = j;
    p->tail[prio] = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

double io_pool_busy_seconds(io_pool *p, int sure) {
    pthread_mutex_lock(&p->mu);
    double t = df_now(), s = sure ? p->sure_s + (p->active_sure ? t - p->sure_since : 0.0)
                                  : p->busy_s + (p->active ? t - p->busy_since : 0.0);
    pthread_mutex_unlock(&p->mu);
    return s;
}

struct io_latch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
};

io_latch *io_latch_new(void) {
    io_latch *l = xcalloc(1, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    return l;
}

void io_latch_free(io_latch *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

void io_latch_add(io_latch *l, int n) {
    pthread_mutex_lock(&l->mu);
    l->n += n;
    pthread_mutex_unlock(&l->mu);
}

void io_latch_done(io_latch *l) {
    pthread_mutex_lock(&l->mu);
    if (--l->n == 0) pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void io_latch_wait(io_latch *l) {
    pthread_mutex_lock(&l->mu);
    while (l->n > 0) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

void *io_mem_alloc(size_t n) {
    if (!n) n = IO_ALIGN;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) df_die("out of memory (%zu bytes of buffers)", n);
    return p;
}

void io_mem_free(void *p, size_t n) {
    if (p) munmap(p, n ? n : IO_ALIGN);
}
