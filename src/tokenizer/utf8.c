/* utf8.c — strict UTF-8 validation and the incremental decoder used while streaming generated text: it holds
 * back an incomplete sequence until its last byte arrives and turns invalid bytes into U+FFFD. */
#include "tokenizer/tok_internal.h"

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

int utf8_valid_len(const uint8_t *p, size_t n) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    int k;
    uint8_t lo = 0x80, hi = 0xBF;   /* allowed range of the second byte (no overlongs, surrogates, > U+10FFFF) */
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < (size_t)k || p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < k; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    return k;
}

/* 1 if p[0..n) could still grow into a valid sequence (a proper prefix of one). */
static int utf8_prefix(const uint8_t *p, int n) {
    uint8_t full[4] = {p[0], 0x80, 0x80, 0x80};
    int k = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : 2;
    if (n >= k) return 0;
    for (int i = 1; i < n; i++) full[i] = p[i];
    /* complete with the smallest continuation that the lead byte allows */
    if (n == 1 && p[0] == 0xE0) full[1] = 0xA0;
    if (n == 1 && p[0] == 0xF0) full[1] = 0x90;
    return utf8_valid_len(full, (size_t)k) == k;
}

void utf8_stream_init(utf8_stream *s) { s->npend = 0; }

void utf8_stream_feed(utf8_stream *s, const uint8_t *p, size_t n, char **out, size_t *len, size_t *cap) {
    for (size_t i = 0; i < n; i++) {
        s->pend[s->npend++] = p[i];
        for (;;) {
            int k = utf8_valid_len(s->pend, (size_t)s->npend);
            if (k > 0) {
                tok_buf_append(out, len, cap, s->pend, (size_t)k);
            } else if (utf8_prefix(s->pend, s->npend)) {
                break;
            } else {
                /* one U+FFFD per maximal valid prefix (Unicode's "best practice"), then rescan the rest */
                tok_buf_append(out, len, cap, REPLACEMENT, 3);
                k = s->npend - 1;
                while (k > 1 && !utf8_prefix(s->pend, k)) k--;
                if (k < 1) k = 1;
            }
            s->npend -= k;
            for (int j = 0; j < s->npend; j++) s->pend[j] = s->pend[j + k];
            if (s->npend == 0) break;
        }
    }
    if (!*out) tok_buf_append(out, len, cap, "", 0);
}

void utf8_stream_flush(utf8_stream *s, char **out, size_t *len, size_t *cap) {
    if (s->npend) tok_buf_append(out, len, cap, REPLACEMENT, 3);
    s->npend = 0;
    if (!*out) tok_buf_append(out, len, cap, "", 0);
}
