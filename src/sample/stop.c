/* stop.c — text buffer and stop-string matcher (stop.h). */
#include "stop.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

void text_buf_append(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void text_buf_puts(text_buf *b, const char *s) { text_buf_append(b, s, strlen(s)); }

void text_buf_printf(text_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    DF_ASSERT(n >= 0);
    if ((size_t)n < sizeof small) {
        text_buf_append(b, small, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    text_buf_append(b, big, (size_t)n);
    free(big);
}

void text_buf_clear(text_buf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void text_buf_free(text_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void stop_init(stop_matcher *m, const char *const *stops, int n) {
    memset(m, 0, sizeof *m);
    m->stops = xcalloc((size_t)(n > 0 ? n : 1), sizeof *m->stops);
    m->lens = xcalloc((size_t)(n > 0 ? n : 1), sizeof *m->lens);
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        m->lens[m->n] = strlen(stops[i]);
        m->stops[m->n++] = xstrdup(stops[i]);
    }
}

void stop_free(stop_matcher *m) {
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    text_buf_free(&m->pend);
    memset(m, 0, sizeof *m);
}

/* Is the tail p[0..n) a proper prefix of some stop string? */
static int stop_is_prefix(const stop_matcher *m, const char *p, size_t n) {
    for (int i = 0; i < m->n; i++)
        if (n < m->lens[i] && !memcmp(m->stops[i], p, n)) return 1;
    return 0;
}

int stop_feed(stop_matcher *m, const char *p, size_t n, text_buf *out) {
    if (m->stopped) return 1;
    if (!m->n) {
        text_buf_append(out, p, n);
        return 0;
    }
    text_buf_append(&m->pend, p, n);
    const char *t = m->pend.p;
    size_t len = m->pend.len, first = len;
    for (int i = 0; i < m->n; i++) {
        const char *hit = memmem(t, len, m->stops[i], m->lens[i]);
        if (hit && (size_t)(hit - t) < first) {
            first = (size_t)(hit - t);
            m->hit = m->stops[i];
        }
    }
    if (first < len) {
        text_buf_append(out, t, first);
        text_buf_clear(&m->pend);
        m->stopped = 1;
        return 1;
    }
    size_t keep_from = len;
    for (size_t k = 0; k < len; k++)
        if (stop_is_prefix(m, t + k, len - k)) {
            keep_from = k;
            break;
        }
    text_buf_append(out, t, keep_from);
    memmove(m->pend.p, t + keep_from, len - keep_from);
    m->pend.len = len - keep_from;
    m->pend.p[m->pend.len] = 0;
    return 0;
}

void stop_flush(stop_matcher *m, text_buf *out) {
    if (!m->stopped && m->pend.len) text_buf_append(out, m->pend.p, m->pend.len);
    text_buf_clear(&m->pend);
}
