/* util.h — small shared helpers: die-on-OOM allocation, timing, file reading. */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <stddef.h>
#include <stdint.h>
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
/* Reads a whole file (NUL-terminated); returns NULL and fills err on failure. */
char *df_read_file(const char *path, size_t *len, df_error *err);
/* Joins dir and name into a newly allocated path. */
char *df_path_join(const char *dir, const char *name);

#endif
