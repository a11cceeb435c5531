/* util.c — die-on-OOM allocation, errors, timing and bounded whole-file reads shared by every module. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void df_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("deltafin: fatal: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) df_die("out of memory (%zu bytes)", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) df_die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) df_die("out of memory (%zu bytes)", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void *xaligned_alloc(size_t align, size_t n) {
    void *p = NULL;
    size_t sz = (n + align - 1) / align * align;
    if (posix_memalign(&p, align, sz ? sz : align)) df_die("out of memory (%zu aligned bytes)", n);
    memset(p, 0, sz ? sz : align);
    return p;
}

void df_error_set(df_error *err, int code, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

double df_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct timespec df_deadline(clockid_t clock, double seconds) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(seconds * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

int df_open_regular(const char *path, int flags, df_error *err) {
    int fd = open(path, flags | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        df_error_set(err, DF_EIO, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

static void util_too_large(const char *path, size_t max, df_error *err) {
    if (max >= (1 << 20))
        df_error_set(err, DF_EFORMAT, "%s: larger than %zu MiB, too large for this kind of file", path, max >> 20);
    else
        df_error_set(err, DF_EFORMAT, "%s: larger than %zu bytes, too large for this kind of file", path, max);
}

static char *util_read_fd(int fd, const char *path, size_t max, size_t *len, df_error *err) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) {
            if (n > max) break;
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            df_error_set(err, DF_EIO, "%s: read error: %s", path, strerror(errno));
            free(buf);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n > max) {
        util_too_large(path, max, err);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *df_read_file(const char *path, size_t *len, df_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        df_error_set(err, DF_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = util_read_fd(fd, path, DF_READ_FILE_MAX, len, err);
    close(fd);
    return buf;
}

char *df_read_file_max(const char *path, size_t max, size_t *len, df_error *err) {
    int fd = df_open_regular(path, O_RDONLY, err);
    if (fd < 0) return NULL;
    struct stat sb;   /* refused before a byte is read or a buffer sized by it */
    if (!fstat(fd, &sb) && (uint64_t)sb.st_size > max) {
        close(fd);
        util_too_large(path, max, err);
        return NULL;
    }
    char *buf = util_read_fd(fd, path, max, len, err);
    close(fd);
    return buf;
}

int df_temp_create(const char *path, char **tmp, df_error *err) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0, n = strlen(path) + 32;
    *tmp = xmalloc(n);
    snprintf(*tmp, n, "%.*s.%s.tmp-XXXXXX", (int)dl, path, path + dl);
    int fd = mkostemp(*tmp, O_CLOEXEC);
    if (fd < 0) {
        df_error_set(err, DF_EIO, "%s: cannot create a temp file beside it: %s", path, strerror(errno));
        free(*tmp);
        *tmp = NULL;
    }
    return fd;
}

int df_write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int df_temp_commit(int fd, char *tmp, const char *path, int failed, df_error *err) {
    int e = failed;
    if (!e && fsync(fd)) e = errno;
    if (!e && fchmod(fd, 0644)) e = errno;
    if (close(fd) && !e) e = errno;
    if (!e && rename(tmp, path)) e = errno;
    if (e) {
        unlink(tmp);
        df_error_set(err, DF_EIO, "%s: %s%s (nothing written)", path,
                     e == ENOSPC || e == EFBIG || e == EDQUOT ? "disk full: " : "write failed: ", strerror(e));
    } else {
        const char *slash = strrchr(path, '/');
        char *dir = slash ? xstrdup(path) : xstrdup(".");
        if (slash) dir[slash - path + (slash == path)] = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) fsync(dfd), close(dfd);
        free(dir);
    }
    free(tmp);
    return e ? DF_EIO : DF_OK;
}

char *df_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

int df_mkdir_p(const char *path, df_error *err) {
    char *p = xstrdup(path);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST) {
            df_error_set(err, DF_EIO, "%s: cannot create folder: %s", p, strerror(errno));
            free(p);
            return DF_EIO;
        }
        if (!c) break;
        *s = c;
    }
    free(p);
    return DF_OK;
}
