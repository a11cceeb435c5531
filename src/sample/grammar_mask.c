/* grammar_mask.c — the logits mask of grammar.h over one tokenizer's vocabulary: which tokens the machine
 * accepts from the current state and which of them still leave room to finish the document. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/grammar.h"

/* Inside a string, most tokens are plain text: no quote, backslash or control byte, whole UTF-8 characters.
 * Such a token only adds its characters to the string, so it is judged by its character count alone and
 * the walk over shared prefixes is left to the other tokens. */
#define NOT_PLAIN 0xFFFF

typedef struct tok_list {
    int32_t *ids;        /* sorted by bytes */
    uint16_t *lcp;       /* common prefix with the previous token of the list */
    int n;
} tok_list;

struct grammar_vocab {
    const tokenizer *t;
    int32_t n_vocab;
    tok_list all;        /* non-special tokens */
    tok_list other;      /* non-special tokens that are not plain string text */
    int32_t *plain;      /* plain string text tokens */
    uint16_t *plain_chars;   /* [n_plain]: characters in each */
    int n_plain;
    int32_t *specials;
    int n_specials;
    uint32_t max_len;
};

static int tok_cmp(const tokenizer *t, int32_t a, int32_t b) {
    size_t la, lb;
    const uint8_t *pa = tokenizer_token_bytes(t, a, &la), *pb = tokenizer_token_bytes(t, b, &lb);
    size_t m = la < lb ? la : lb;
    int c = memcmp(pa, pb, m);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (a > b) - (a < b);
}

/* merge sort with the tokenizer passed down, so no global state is needed */
static void tok_sort(const tokenizer *t, int32_t *v, int32_t *tmp, int n) {
    if (n < 2) return;
    int h = n / 2;
    tok_sort(t, v, tmp, h);
    tok_sort(t, v + h, tmp, n - h);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = tok_cmp(t, v[i], v[j]) <= 0 ? v[i++] : v[j++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

static void list_finish(const tokenizer *t, tok_list *l) {
    int32_t *tmp = xmalloc((size_t)(l->n ? l->n : 1) * sizeof *tmp);
    tok_sort(t, l->ids, tmp, l->n);
    free(tmp);
    l->lcp = xcalloc((size_t)(l->n ? l->n : 1), sizeof *l->lcp);
    for (int i = 1; i < l->n; i++) {
        size_t la, lb, k = 0;
        const uint8_t *a = tokenizer_token_bytes(t, l->ids[i - 1], &la), *b = tokenizer_token_bytes(t, l->ids[i], &lb);
        while (k < la && k < lb && a[k] == b[k] && k < 65535) k++;
        l->lcp[i] = (uint16_t)k;
    }
}

/* Characters in a plain string-text token, or NOT_PLAIN. */
static unsigned plain_chars(const uint8_t *p, size_t n) {
    unsigned chars = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == '"' || p[i] == '\\' || p[i] < 0x20) return NOT_PLAIN;
        int k = utf8_valid_len(p + i, n - i);
        if (k <= 0 || chars >= NOT_PLAIN - 1) return NOT_PLAIN;
        i += (size_t)k;
        chars++;
    }
    return chars;
}

grammar_vocab *grammar_vocab_new(const tokenizer *t) {
    grammar_vocab *v = xcalloc(1, sizeof *v);
    v->t = t;
    v->n_vocab = tokenizer_n_vocab(t);
    size_t cap = (size_t)(v->n_vocab ? v->n_vocab : 1);
    v->all.ids = xmalloc(cap * sizeof(int32_t));
    v->other.ids = xmalloc(cap * sizeof(int32_t));
    v->plain = xmalloc(cap * sizeof *v->plain);
    v->plain_chars = xmalloc(cap * sizeof *v->plain_chars);
    v->specials = xmalloc(cap * sizeof *v->specials);
    for (int32_t id = 0; id < v->n_vocab; id++) {
        size_t n;
        const uint8_t *b = tokenizer_token_bytes(t, id, &n);
        if (!b || n == 0) continue;
        if (tokenizer_is_special(t, id)) {
            v->specials[v->n_specials++] = id;
            continue;
        }
        v->all.ids[v->all.n++] = id;
        if (n > v->max_len) v->max_len = (uint32_t)n;
        unsigned c = plain_chars(b, n);
        if (c == NOT_PLAIN) {
            v->other.ids[v->other.n++] = id;
        } else {
            v->plain_chars[v->n_plain] = (uint16_t)c;
            v->plain[v->n_plain++] = id;
        }
    }
    list_finish(t, &v->all);
    list_finish(t, &v->other);
    return v;
}

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->all.ids);
    free(v->all.lcp);
    free(v->other.ids);
    free(v->other.lcp);
    free(v->plain);
    free(v->plain_chars);
    free(v->specials);
    free(v);
}

/* Marks the tokens of l that the grammar accepts from m->st and that leave a completion of at most room. */
static int walk(grammar_mask *m, const tok_list *l, int32_t room) {
    const grammar *g = m->g;
    grammar_state *sc = m->scratch;
    int n_allowed = 0, valid = 0;   /* sc[0..valid] hold the states after the previous token's first bytes */
    grammar_state_copy(&sc[0], &m->st);
    for (int idx = 0; idx < l->n; idx++) {
        int32_t id = l->ids[idx];
        size_t len;
        const uint8_t *p = tokenizer_token_bytes(m->v->t, id, &len);
        int k = l->lcp[idx] < valid ? l->lcp[idx] : valid;
        int ok = 1;
        for (; k < (int)len; k++) {
            grammar_state_copy(&sc[k + 1], &sc[k]);
            m->n_checked++;
            if (grammar_feed(g, &sc[k + 1], p + k, 1)) {
                ok = 0;
                break;
            }
        }
        valid = k;
        if (!ok) {   /* every following token with this failing prefix fails too */
            while (idx + 1 < l->n && l->lcp[idx + 1] > k) idx++;
            continue;
        }
        if (room < 0 || grammar_cost(g, &sc[len]) > (uint32_t)room) continue;
        m->allow[id] = 1;
        n_allowed++;
    }
    return n_allowed;
}

/* Inside a plain string (no escape or character pending, no format) a plain token only adds characters. */
static int plain_tokens(grammar_mask *m, int32_t room, int len, int min, int max) {
    uint32_t cost = grammar_cost(m->g, &m->st), need = len < min ? (uint32_t)(min - len) : 0;
    int n_allowed = 0;
    for (int i = 0; i < m->v->n_plain; i++) {
        uint32_t c = m->v->plain_chars[i];
        if (max >= 0 && (uint32_t)len + c > (uint32_t)max) continue;
        uint32_t after = cost - (c < need ? c : need);
        if (room < 0 || after > (uint32_t)room) continue;
        m->allow[m->v->plain[i]] = 1;
        n_allowed++;
    }
    return n_allowed;
}

void grammar_mask_init(grammar_mask *m, const grammar *g, const grammar_vocab *v, int32_t eos_id) {
    memset(m, 0, sizeof *m);
    m->g = g;
    m->v = v;
    m->eos_id = eos_id;
    grammar_state_init(g, &m->st);
    m->scratch = xmalloc(((size_t)v->max_len + 1) * sizeof *m->scratch);
    m->allow = xcalloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1), 1);
}

void grammar_mask_free(grammar_mask *m) {
    free(m->scratch);
    free(m->allow);
    memset(m, 0, sizeof *m);
}

int grammar_mask_apply(grammar_mask *m, float *logits, int n_vocab, int budget) {
    double t0 = df_now();
    const grammar *g = m->g;
    const grammar_vocab *v = m->v;
    int n_allowed = 0;
    memset(m->allow, 0, (size_t)v->n_vocab);
    /* a token is allowed when the document can still be completed (and ended) in the tokens left after it */
    int32_t room = (int32_t)budget - 1 - (m->eos_id >= 0);
    /* when even the shortest completion no longer fits (the last token included), the budget cannot be
     * kept: generation will stop at max_tokens with a partial document (finish "length"), so any token the
     * grammar accepts is allowed rather than none */
    if ((int64_t)grammar_cost(g, &m->st) > (int64_t)room + 1) room = INT32_MAX;
    if (!m->st.done) {
        int len, min, max;
        if (grammar_plain_string(g, &m->st, &len, &min, &max))
            n_allowed += plain_tokens(m, room, len, min, max) + walk(m, &v->other, room);
        else n_allowed += walk(m, &v->all, room);
        for (int i = 0; i < v->n_specials; i++) {
            int32_t id = v->specials[i];
            if (id == m->eos_id) continue;
            grammar_state t;
            grammar_state_copy(&t, &m->st);
            if (grammar_feed_token(g, &t, id) || room < 0 || grammar_cost(g, &t) > (uint32_t)room) continue;
            m->allow[id] = 1;
            n_allowed++;
        }
    }
    if (m->eos_id >= 0 && m->eos_id < v->n_vocab && budget >= 1 && grammar_accepting(g, &m->st)) {
        m->allow[m->eos_id] = 1;
        n_allowed++;
    }
    int lim = n_vocab < v->n_vocab ? n_vocab : v->n_vocab;
    for (int i = 0; i < lim; i++)
        if (!m->allow[i]) logits[i] = -INFINITY;
    for (int i = lim; i < n_vocab; i++) logits[i] = -INFINITY;
    m->n_steps++;
    m->seconds += df_now() - t0;
    return n_allowed;
}

int grammar_mask_accept(grammar_mask *m, int32_t id) {
    if (id == m->eos_id) return grammar_accepting(m->g, &m->st) ? 0 : -1;
    if (tokenizer_is_special(m->v->t, id)) return grammar_feed_token(m->g, &m->st, id);
    size_t n;
    const uint8_t *p = tokenizer_token_bytes(m->v->t, id, &n);
    return p ? grammar_feed(m->g, &m->st, p, n) : -1;
}
