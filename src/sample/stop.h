/* stop.h — a growable text buffer, and the stop-string matcher: generated text is fed in pieces; text that
 * could still be the start of a stop string is held back, a stop string and everything after it is never
 * emitted. Stop strings are valid UTF-8 and the input is fed in whole characters, so the emitted text never
 * ends inside a character. */
#ifndef DF_STOP_H
#define DF_STOP_H

#include <stddef.h>

typedef struct text_buf {
    char *p;       /* NUL-terminated when non-NULL */
    size_t len, cap;
} text_buf;

void text_buf_append(text_buf *b, const char *s, size_t n);
void text_buf_puts(text_buf *b, const char *s);
void text_buf_printf(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void text_buf_clear(text_buf *b);
void text_buf_free(text_buf *b);

typedef struct stop_matcher {
    char **stops;
    size_t *lens;
    int n;
    text_buf pend;   /* held-back text */
    int stopped;
    const char *hit;   /* the stop string that matched (one of stops), or NULL */
} stop_matcher;

/* Copies the stop strings; empty ones are ignored. */
void stop_init(stop_matcher *m, const char *const *stops, int n);
void stop_free(stop_matcher *m);
/* Feeds n bytes and appends what is safe to emit to out. Returns 1 once a stop string has matched (the
 * text before it has been emitted; later input is ignored), else 0. */
int stop_feed(stop_matcher *m, const char *p, size_t n, text_buf *out);
/* End of generation: emits the held-back text (unless a stop matched). */
void stop_flush(stop_matcher *m, text_buf *out);

#endif
