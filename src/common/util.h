/* util.h — small shared helpers: die-on-OOM allocation, timing, file reading. */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "common/error.h"
#include "deltafin.h"

#define DF_ASSERT(c) do { if (!(c)) df_die("%s:%d: assertion failed: %s", __FILE__, __LINE__, #c); } while (0)
#define DF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DF_MAX(a, b) ((a) > (b) ? (a) : (b))

_Noreturn void df_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void *xaligned_alloc(size_t align, size_t n);   /* zero-filled; free with free() */

double df_now(void);                             /* monotonic seconds */
/* The time `seconds` (>= 0) from now on the given clock: a deadline for pthread_cond_timedwait. */
struct timespec df_deadline(clockid_t clock, double seconds);
/* Caps on whole-file reads: JSON metadata (config, index, tokenizer config, manifest) is far smaller than
 * DF_JSON_FILE_MAX; any file read whole is smaller than DF_READ_FILE_MAX. */
#define DF_JSON_FILE_MAX ((size_t)64 << 20)
#define DF_READ_FILE_MAX ((size_t)1 << 30)
/* Reads a whole file (NUL-terminated, at most DF_READ_FILE_MAX bytes; pipes allowed, for command-line
 * input); returns NULL and fills err on failure. */
char *df_read_file(const char *path, size_t *len, df_error *err);
/* The same for a model or state file: only a regular file of at most max bytes (a FIFO, device or
 * directory in its place is refused at once instead of hanging or filling memory). */
char *df_read_file_max(const char *path, size_t max, size_t *len, df_error *err);
/* A JSON file read through df_read_file_max(DF_JSON_FILE_MAX) and parsed with jansson flags; NULL with err
 * naming the file (and line and column of bad JSON). In json_file.c. */
struct json_t *df_json_load_file(const char *path, size_t flags, df_error *err);
/* open(2) that refuses anything but a regular file without blocking on it; -1 with err filled. */
int df_open_regular(const char *path, int flags, df_error *err);
/* A new, empty temp file beside path (same folder, so a rename publishes it) under an unpredictable name:
 * created exclusively (O_CREAT|O_EXCL, so a symlink, FIFO or file planted at any name is never opened),
 * mode 0600 until committed. Returns the fd and sets *tmp (caller frees); -1 with err naming path. */
int df_temp_create(const char *path, char **tmp, df_error *err);
/* Finishes what df_temp_create began: fsync, mode 0644, close, rename onto path, folder fsync. On any
 * failure (failed: an errno the caller's own writes hit, 0 when none) the temp file is removed and err names
 * path. Frees tmp and closes fd either way. */
int df_temp_commit(int fd, char *tmp, const char *path, int failed, df_error *err);
/* write(2) of all n bytes, retried on EINTR; 0, or an errno (ENOSPC for a short write). */
int df_write_all(int fd, const void *p, size_t n);
/* Joins dir and name into a newly allocated path. */
char *df_path_join(const char *dir, const char *name);

/* mkdir -p: every missing folder of path, mode 0755; an error names the one that could not be made. */
int df_mkdir_p(const char *path, df_error *err);

#endif
