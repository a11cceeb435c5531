/* tiktoken.c — the tiktoken rank file, the rank hash map, special tokens, byte-pair merging and decode.
 * Pre-tokenisation (PCRE2) lives in pretok.c; this file turns its pieces into ids. */
#include "tokenizer/tok_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

void tok_ids_free(tok_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* Short keys dominate (pairs of sub-tokens), so the hash reads whole words instead of bytes. */
static uint32_t tok_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
    }
    h *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

int32_t tok_rank(const tokenizer *t, const uint8_t *p, size_t n) {
    uint32_t h = tok_hash(p, n);
    for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
        const tok_slot *s = &t->slots[i];
        if (s->id < 0) return -1;
        if (s->hash == h && t->tok_len[s->id] == n && !memcmp(t->bytes + t->tok_off[s->id], p, n)) return s->id;
    }
}

static int b64_val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard padded base64 of n chars into out; returns the byte count or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    long k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
            } else {
                if (pad) return -1;
                v[j] = b64_val((unsigned char)s[i + j]);
                if (v[j] < 0) return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[k++] = (uint8_t)(w >> 16);
        if (pad < 2) out[k++] = (uint8_t)(w >> 8);
        if (pad < 1) out[k++] = (uint8_t)w;
    }
    return k;
}

static int tok_index(tokenizer *t, const char *path, df_error *err) {
    uint32_t size = 1024;
    while (size < (uint32_t)t->n_base * 2u) size *= 2;
    t->mask = size - 1;
    t->slots = xmalloc(size * sizeof *t->slots);
    for (uint32_t i = 0; i < size; i++) t->slots[i].id = -1;
    for (int32_t id = 0; id < t->n_base; id++) {
        if (t->tok_len[id] == TOK_NONE) continue;
        const uint8_t *p = t->bytes + t->tok_off[id];
        uint32_t h = tok_hash(p, t->tok_len[id]);
        uint32_t i = h & t->mask;
        for (; t->slots[i].id >= 0; i = (i + 1) & t->mask) {
            int32_t o = t->slots[i].id;
            if (t->slots[i].hash == h && t->tok_len[o] == t->tok_len[id] && !memcmp(t->bytes + t->tok_off[o], p, t->tok_len[id])) {
                df_error_set(err, DF_EFORMAT, "%s: ranks %d and %d have the same bytes", path, (int)o, (int)id);
                return DF_EFORMAT;
            }
        }
        t->slots[i].hash = h;
        t->slots[i].id = id;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (tok_rank(t, &c, 1) < 0) {
            df_error_set(err, DF_EFORMAT, "%s: byte 0x%02x is not a token, so some text cannot be encoded", path, b);
            return DF_EFORMAT;
        }
    }
    return DF_OK;
}

/* Parses `<base64> <rank>` lines. Ranks may have holes; ids are ranks. */
static int tok_parse_ranks(tokenizer *t, const char *path, const char *text, size_t len, df_error *err) {
    size_t nlines = 0;
    for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
    nlines++;
    uint32_t *off = xmalloc(nlines * sizeof *off), *blen = xmalloc(nlines * sizeof *blen);
    int32_t *rank = xmalloc(nlines * sizeof *rank);
    t->bytes = xmalloc(len + 1);
    size_t nb = 0, ntok = 0, line = 0;
    int32_t maxr = -1;
    int rc = DF_OK;
    for (size_t i = 0; i < len && rc == DF_OK;) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        line++;
        size_t end = e;
        if (end > i && text[end - 1] == '\r') end--;
        if (end > i) {
            const char *sp = memchr(text + i, ' ', end - i);
            char *q = NULL;
            long r = -1;
            long nbytes = -1;
            if (sp) {
                errno = 0;
                r = strtol(sp + 1, &q, 10);
                if (errno || q != text + end || q == sp + 1 || r < 0 || r >= INT32_MAX / 2) r = -1;
                nbytes = b64_decode(text + i, (size_t)(sp - (text + i)), t->bytes + nb);
            }
            if (!sp || r < 0 || nbytes <= 0) {
                df_error_set(err, DF_EFORMAT, "%s:%zu: expected `<base64 bytes> <rank>`", path, line);
                rc = DF_EFORMAT;
                break;
            }
            off[ntok] = (uint32_t)nb;
            blen[ntok] = (uint32_t)nbytes;
            rank[ntok++] = (int32_t)r;
            nb += (size_t)nbytes;
            if (r > maxr) maxr = (int32_t)r;
        }
        i = e + 1;
    }
    if (rc == DF_OK && ntok == 0) {
        df_error_set(err, DF_EFORMAT, "%s: no tokens", path);
        rc = DF_EFORMAT;
    }
    if (rc == DF_OK) {
        t->n_base = maxr + 1;
        t->tok_off = xmalloc((size_t)t->n_base * sizeof *t->tok_off);
        t->tok_len = xmalloc((size_t)t->n_base * sizeof *t->tok_len);
        for (int32_t id = 0; id < t->n_base; id++) t->tok_len[id] = TOK_NONE;
        for (size_t k = 0; k < ntok && rc == DF_OK; k++) {
            if (t->tok_len[rank[k]] != TOK_NONE) {
                df_error_set(err, DF_EFORMAT, "%s: rank %d appears twice", path, (int)rank[k]);
                rc = DF_EFORMAT;
            }
            t->tok_off[rank[k]] = off[k];
            t->tok_len[rank[k]] = blen[k];
        }
        t->n_vocab = t->n_base;
    }
    free(off);
    free(blen);
    free(rank);
    return rc == DF_OK ? tok_index(t, path, err) : rc;
}

int tok_load_ranks(tokenizer **out, const char *path, df_error *err) {
    *out = NULL;
    size_t len;
    char *text = df_read_file_max(path, DF_READ_FILE_MAX, &len, err);
    if (!text) return err ? err->code : DF_EIO;
    tokenizer *t = xcalloc(1, sizeof *t);
    int rc = tok_parse_ranks(t, path, text, len, err);
    free(text);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DF_OK;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_sp; i++) free(t->sp_name[i]);
    free(t->sp_name);
    free(t->sp_len);
    free(t->sp_id);
    free(t->bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->slots);
    tok_pretok_free(t);
    free(t);
}

int tokenizer_add_special(tokenizer *t, const char *name, int32_t id, df_error *err) {
    size_t n = strlen(name);
    if (id < 0 || n == 0) {
        df_error_set(err, DF_EINVAL, "special token '%s': bad id %d or empty name", name, (int)id);
        return DF_EINVAL;
    }
    if (id < t->n_base && t->tok_len[id] != TOK_NONE) {
        df_error_set(err, DF_EFORMAT, "special token '%s': id %d is already an ordinary token", name, (int)id);
        return DF_EFORMAT;
    }
    for (int i = 0; i < t->n_sp; i++) {
        if (t->sp_id[i] == id || (t->sp_len[i] == n && !memcmp(t->sp_name[i], name, n))) {
            df_error_set(err, DF_EFORMAT, "special token '%s' (id %d) clashes with '%s' (id %d)", name, (int)id,
                         t->sp_name[i], (int)t->sp_id[i]);
            return DF_EFORMAT;
        }
    }
    if (t->n_sp == t->cap_sp) {
        t->cap_sp = t->cap_sp ? t->cap_sp * 2 : 16;
        t->sp_name = xrealloc(t->sp_name, (size_t)t->cap_sp * sizeof *t->sp_name);
        t->sp_len = xrealloc(t->sp_len, (size_t)t->cap_sp * sizeof *t->sp_len);
        t->sp_id = xrealloc(t->sp_id, (size_t)t->cap_sp * sizeof *t->sp_id);
    }
    t->sp_name[t->n_sp] = xstrdup(name);
    t->sp_len[t->n_sp] = n;
    t->sp_id[t->n_sp++] = id;
    t->sp_first[(uint8_t)name[0]] = 1;
    if (id >= t->n_vocab) t->n_vocab = id + 1;
    return DF_OK;
}

int32_t tokenizer_special_id(const tokenizer *t, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < t->n_sp; i++)
        if (t->sp_len[i] == n && !memcmp(t->sp_name[i], name, n)) return t->sp_id[i];
    return -1;
}

static int tok_special_index(const tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_sp; i++)
        if (t->sp_id[i] == id) return i;
    return -1;
}

int tokenizer_is_special(const tokenizer *t, int32_t id) {
    return (id >= t->n_base || t->tok_len[id] == TOK_NONE) && tok_special_index(t, id) >= 0;
}

int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }

const uint8_t *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0) return NULL;
    if (id < t->n_base && t->tok_len[id] != TOK_NONE) {
        *len = t->tok_len[id];
        return t->bytes + t->tok_off[id];
    }
    int i = tok_special_index(t, id);
    if (i < 0) return NULL;
    *len = t->sp_len[i];
    return (const uint8_t *)t->sp_name[i];
}

void tok_buf_append(char **buf, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        *buf = xrealloc(*buf, c);
        *cap = c;
    }
    if (n) memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **buf, size_t *len, size_t *cap,
                     df_error *err) {
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(t, ids[i], &bl);
        if (!b) {
            df_error_set(err, DF_EINVAL, "token id %d (position %zu) is not in the vocabulary (%d ids)", (int)ids[i],
                         i, (int)t->n_vocab);
            return DF_EINVAL;
        }
        tok_buf_append(buf, len, cap, b, bl);
    }
    if (!*buf) tok_buf_append(buf, len, cap, "", 0);
    return DF_OK;
}

/* ---- byte-pair merging (tiktoken's byte_pair_merge: repeatedly merge the lowest-rank adjacent pair,
 * leftmost on ties). Short pieces use the plain quadratic scan; long ones a heap with the same order. ---- */

#define BPE_SHORT 96

static void bpe_short(const tokenizer *t, const uint8_t *p, size_t n, tok_ids *out) {
    uint32_t start[BPE_SHORT + 1];
    int32_t rank[BPE_SHORT + 1];
    size_t m = n + 1;
    for (size_t i = 0; i <= n; i++) start[i] = (uint32_t)i;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = tok_rank(t, p + i, 2);
        rank[i] = r < 0 ? INT32_MAX : r;
    }
    rank[n - 1] = rank[n] = INT32_MAX;
    for (;;) {
        int32_t best = INT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) best = rank[i], bi = i;
        if (best == INT32_MAX) break;
        /* parts[bi] absorbs parts[bi+1]; the pairs starting at bi-1 and bi change. */
        if (bi > 0) {
            int32_t r = bi + 2 < m ? tok_rank(t, p + start[bi - 1], start[bi + 2] - start[bi - 1]) : -1;
            rank[bi - 1] = r < 0 ? INT32_MAX : r;
        }
        int32_t r = bi + 3 < m ? tok_rank(t, p + start[bi], start[bi + 3] - start[bi]) : -1;
        rank[bi] = r < 0 ? INT32_MAX : r;
        memmove(start + bi + 1, start + bi + 2, (m - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof *rank);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) tok_ids_push(out, tok_rank(t, p + start[i], start[i + 1] - start[i]));
}

typedef struct {
    int32_t rank;
    uint32_t pos;
} bpe_heap_ent;

static int heap_less(bpe_heap_ent a, bpe_heap_ent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(bpe_heap_ent *h, size_t *n, bpe_heap_ent e) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static bpe_heap_ent heap_pop(bpe_heap_ent *h, size_t *n) {
    bpe_heap_ent top = h[0], e = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], e)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = e;
    return top;
}

/* Parts are a linked list over byte positions; rank[pos] is the rank of the pair (part at pos, next part). */
static void bpe_long(const tokenizer *t, const uint8_t *p, size_t n, tok_ids *out) {
    uint32_t *next = xmalloc((n + 1) * sizeof *next), *prev = xmalloc((n + 1) * sizeof *prev);
    int32_t *rank = xmalloc((n + 1) * sizeof *rank);
    bpe_heap_ent *h = xmalloc(4 * (n + 1) * sizeof *h);
    size_t hn = 0;
    for (size_t i = 0; i <= n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i ? i - 1 : 0);
        rank[i] = INT32_MAX;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = tok_rank(t, p + i, 2);
        if (r >= 0) {
            rank[i] = r;
            heap_push(h, &hn, (bpe_heap_ent){r, (uint32_t)i});
        }
    }
    while (hn) {
        bpe_heap_ent e = heap_pop(h, &hn);
        uint32_t i = e.pos;
        if (rank[i] != e.rank) continue;   /* stale: this pair changed since it was queued */
        uint32_t j = next[i];               /* absorbed part */
        next[i] = next[j];
        prev[next[j]] = i;
        rank[j] = INT32_MAX;
        uint32_t k = next[i];
        int32_t r = k < n ? tok_rank(t, p + i, next[k] - i) : -1;
        rank[i] = r < 0 ? INT32_MAX : r;
        if (r >= 0) heap_push(h, &hn, (bpe_heap_ent){r, i});
        if (i > 0) {
            uint32_t a = prev[i];
            int32_t ra = tok_rank(t, p + a, next[i] - a);
            rank[a] = ra < 0 ? INT32_MAX : ra;
            if (ra >= 0) heap_push(h, &hn, (bpe_heap_ent){ra, a});
        }
        if (hn + 4 > 4 * (n + 1)) {   /* compact: drop stale entries */
            size_t w = 0;
            for (size_t q = 0; q < hn; q++)
                if (rank[h[q].pos] == h[q].rank) h[w++] = h[q];
            hn = 0;
            for (size_t q = 0; q < w; q++) heap_push(h, &hn, h[q]);
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) tok_ids_push(out, tok_rank(t, p + i, next[i] - i));
    free(next);
    free(prev);
    free(rank);
    free(h);
}

void tok_bpe_piece(const tokenizer *t, const uint8_t *p, size_t n, tok_ids *out) {
    if (n == 0) return;
    int32_t whole = tok_rank(t, p, n);
    if (whole >= 0) {
        tok_ids_push(out, whole);
        return;
    }
    if (n <= BPE_SHORT)
        bpe_short(t, p, n, out);
    else
        bpe_long(t, p, n, out);
}
