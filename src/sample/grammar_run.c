/* grammar_run.c — the deterministic pushdown machine over bytes and special tokens: a state is a stack of
 * frames over the node graph; alternatives are chosen by their first symbol only (one state, no backtracking).
 * Also the fewest bytes that complete a state, which the logits mask compares with the token budget.
 *
 * A construct is opened only when its shortest completion fits the frames left above it (gnode.need), and an
 * optional member, item or repetition only when its own does: so every state the machine reaches can still
 * be finished, and the completion grammar_cost counts is one the stack can hold. */
#include "sample/grammar_internal.h"

#include <math.h>
#include <string.h>

/* ---- numbers: the fewest bytes that complete a number within [lo, hi] ---- */

enum { N_START, N_SIGN, N_INT, N_DOT, N_FRAC };

static const uint64_t POW10[] = {1ull,
                                 10ull,
                                 100ull,
                                 1000ull,
                                 10000ull,
                                 100000ull,
                                 1000000ull,
                                 10000000ull,
                                 100000000ull,
                                 1000000000ull,
                                 10000000000ull,
                                 100000000000ull,
                                 1000000000000ull,
                                 10000000000000ull,
                                 100000000000000ull,
                                 1000000000000000ull,
                                 10000000000000000ull};

/* Some multiple of 10^-f lies in [a, b] ∩ [L, H] (magnitudes). */
static int frac_fits(long double a, long double b, long double L, long double H, int f) {
    long double lo = a > L ? a : L, hi = b < H ? b : H;
    if (lo > hi) return 0;
    long double s = (long double)POW10[f];
    return ceill(lo * s) <= floorl(hi * s);
}

/* Cost of completing a magnitude whose integer part so far is m with d digits (d = 0: none yet). */
static uint32_t mag_cost(const gnode *nd, int d, uint64_t m, long double L, long double H) {
    int maxd = nd->kind == GN_INT ? MAX_INT_DIGITS : MAX_NUM_DIGITS;
    uint32_t best = GRAMMAR_INF;
    for (int k = d ? 0 : 1; d + k <= maxd; k++) {
        if (d == 1 && m == 0 && k > 0) break;   /* no leading zeros */
        uint64_t a, b;
        if (d == 0) {
            a = k == 1 ? 0 : POW10[k - 1];
            b = POW10[k] - 1;
        } else {
            a = m * POW10[k];
            b = a + POW10[k] - 1;
        }
        if ((uint32_t)k >= best) break;
        long double lo = (long double)a > L ? (long double)a : ceill(L), hi = (long double)b < H ? (long double)b : floorl(H);
        if (lo <= hi) return (uint32_t)k;   /* an integer fits: nothing shorter exists */
        if (nd->kind == GN_NUM)
            for (int f = 1; f <= MAX_FRAC && (uint32_t)(k + 1 + f) < best; f++)
                if (frac_fits((long double)a, (long double)b + 1 - 1.0L / (long double)POW10[f], L, H, f))
                    best = (uint32_t)(k + 1 + f);
    }
    return best;
}

static void mag_bounds(const gnode *nd, int neg, long double *L, long double *H) {
    if (!neg) {
        *L = nd->lo > 0 ? nd->lo : 0;
        *H = nd->hi;
    } else {   /* never "-0": a negative number is at least one unit of the last digit below zero */
        long double unit = nd->kind == GN_INT ? 1.0L : 1.0L / (long double)POW10[MAX_FRAC];
        *L = -nd->hi > unit ? -nd->hi : unit;
        *H = -nd->lo;
    }
}

uint32_t grammar_num_cost(const gnode *nd, const grammar_frame *f) {
    long double L, H;
    if (f->st == N_START) {
        mag_bounds(nd, 0, &L, &H);
        uint32_t p = L <= H ? mag_cost(nd, 0, 0, L, H) : GRAMMAR_INF;
        mag_bounds(nd, 1, &L, &H);
        uint32_t n = L <= H ? sat_add(1, mag_cost(nd, 0, 0, L, H)) : GRAMMAR_INF;
        return p < n ? p : n;
    }
    mag_bounds(nd, f->neg, &L, &H);
    if (L > H) return GRAMMAR_INF;
    if (f->st == N_SIGN) return mag_cost(nd, 0, 0, L, H);
    if (f->st == N_INT) return mag_cost(nd, f->i, f->a, L, H);
    /* fraction: f->n digits so far with value f->b */
    uint32_t best = GRAMMAR_INF;
    for (int tot = f->n > 1 ? f->n : 1; tot <= MAX_FRAC; tot++) {
        int k = tot - f->n;
        long double s = (long double)POW10[tot];
        long double jlo = (long double)(f->b * POW10[k]), jhi = jlo + (long double)POW10[k] - 1;
        long double base = (long double)f->a * s;
        long double need_lo = ceill(L * s - base), need_hi = floorl(H * s - base);
        if (need_lo < jlo) need_lo = jlo;
        if (need_hi > jhi) need_hi = jhi;
        if (need_lo <= need_hi) {
            best = (uint32_t)k;
            break;
        }
    }
    return best;
}

/* ---- running ---- */

static int has_bit(const uint64_t *f, int c) { return (int)((f[c >> 6] >> (c & 63)) & 1); }

enum { R_REJECT, R_OK, R_DONE, R_PASS, R_AGAIN };
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_IN, S_ESC, S_HEX, S_UTF, S_TMPL, S_EMAIL };

/* node, opened above the first `depth` frames, can be finished within the stack */
static int fits_at(const grammar *g, int depth, int node) {
    return node >= 0 && (uint32_t)depth + g->nodes[node].need <= GRAMMAR_MAX_DEPTH;
}

static int push(const grammar *g, grammar_state *s, int node) {
    if (!fits_at(g, s->depth, node)) return R_REJECT;
    grammar_frame *f = &s->f[s->depth++];
    memset(f, 0, sizeof *f);
    f->node = node;
    if (g->nodes[node].kind == GN_LITS || g->nodes[node].kind == GN_SELECT) {
        int n = g->nodes[node].n_lits;
        f->a = n >= 64 ? ~0ull : (1ull << n) - 1;
    }
    return R_AGAIN;
}

static int replace_top(const grammar *g, grammar_state *s, int node) {
    s->depth--;
    return push(g, s, node);
}

static int is_ws(int c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static int take_ws(grammar_frame *f, int c) {
    if (!is_ws(c)) return 0;
    return f->ws < GRAMMAR_MAX_WS ? (f->ws++, 1) : -1;
}

/* Which unseen properties can still be added to an object whose frame is the depth-th (their values
 * opened above it). */
static uint64_t obj_open_keys(const grammar *g, const gnode *nd, uint64_t seen, int depth) {
    uint64_t open = 0;
    for (int p = 0; p < nd->n_lits; p++)
        if (!(seen >> p & 1) && fits_at(g, depth, nd->kids[p])) open |= 1ull << p;
    return open;
}

/* A key outside the properties (its string, then its value, opened above the depth-th frame). */
static int obj_free_key_fits(const grammar *g, const gnode *nd, int depth) {
    return nd->additional >= 0 && fits_at(g, depth, g->str_node) && fits_at(g, depth, nd->additional);
}

static int obj_key_start(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd) {
    if (nd->n_lits) {
        uint64_t cand = obj_open_keys(g, nd, f->a, s->depth);
        if (!cand) return R_REJECT;
        f->st = O_KEY;
        f->b = cand;
        f->i = 1;   /* every key literal begins with the quote just read */
        return R_OK;
    }
    if (!obj_free_key_fits(g, nd, s->depth)) return R_REJECT;
    f->st = O_COLON;
    f->n = -1;
    f->ws = 0;
    return push(g, s, g->str_node);
}

static int step_object(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    int w;
    switch (f->st) {
    case O_OPEN:
        if (c != '{') return R_REJECT;
        f->st = O_FIRST;
        return R_OK;
    case O_FIRST:
    case O_NEXT:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == '}' && f->st == O_FIRST) return (nd->required & ~f->a) ? R_REJECT : R_DONE;
        if (c != '"') return R_REJECT;
        return obj_key_start(g, s, f, nd);
    case O_KEY: {
        uint64_t cand = 0;
        for (int p = 0; p < nd->n_lits; p++)
            if ((f->b >> p & 1) && nd->lit_len[p] > (uint32_t)f->i && (uint8_t)nd->lits[p][f->i] == c)
                cand |= 1ull << p;
        if (!cand) return R_REJECT;
        f->b = cand;
        f->i++;
        for (int p = 0; p < nd->n_lits; p++)
            if ((cand >> p & 1) && nd->lit_len[p] == (uint32_t)f->i) {
                f->n = p;
                f->a |= 1ull << p;
                f->st = O_COLON;
                f->ws = 0;
            }
        return R_OK;
    }
    case O_COLON:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        if (c != ':') return R_REJECT;
        f->st = O_VALUE;
        f->ws = 0;
        return R_OK;
    case O_VALUE:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        if (c < 0) return R_REJECT;
        f->st = O_AFTER;
        f->ws = 0;
        return push(g, s, f->n >= 0 ? nd->kids[f->n] : nd->additional);
    case O_AFTER:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == '}') return (nd->required & ~f->a) ? R_REJECT : R_DONE;
        if (c != ',') return R_REJECT;
        if (nd->n_lits ? !obj_open_keys(g, nd, f->a, s->depth) : !obj_free_key_fits(g, nd, s->depth)) return R_REJECT;
        f->st = O_NEXT;
        return R_OK;
    }
    return R_REJECT;
}

static int step_array(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    int w;
    switch (f->st) {
    case A_OPEN:
        if (c != '[') return R_REJECT;
        f->st = A_FIRST;
        return R_OK;
    case A_FIRST:
    case A_NEXT:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == ']' && f->st == A_FIRST) return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c < 0 || (nd->max >= 0 && f->n >= nd->max)) return R_REJECT;
        f->st = A_AFTER;
        f->n++;
        return push(g, s, nd->item);
    case A_AFTER:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == ']') return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c != ',' || (nd->max >= 0 && f->n >= nd->max) || !fits_at(g, s->depth, nd->item)) return R_REJECT;
        f->st = A_NEXT;
        return R_OK;
    }
    return R_REJECT;
}

static int tmpl_ok(char cls, int prev, int c) {
    switch (cls) {
    case 'Y': return c >= '0' && c <= '9';
    case 'M': return c == '0' || c == '1';
    case 'm': return prev == '0' ? c >= '1' && c <= '9' : c >= '0' && c <= '2';
    case 'D': return c >= '0' && c <= '2';
    case 'd': return prev == '0' ? c >= '1' && c <= '9' : prev == '2' ? c >= '0' && c <= '8' : c >= '0' && c <= '9';
    case 'H': return c >= '0' && c <= '2';
    case 'h': return prev == '2' ? c >= '0' && c <= '3' : c >= '0' && c <= '9';
    case 'S': return c >= '0' && c <= '5';
    case 's': return c >= '0' && c <= '9';
    case 'x': return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    default: return c == cls;
    }
}

static int alnum_lower(int c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

/* email, generated as [a-z0-9._-]{1,32} @ [a-z0-9]{1,32} . [a-z]{2,6}, the local part neither starting nor
 * ending with a dot nor holding two in a row; i = part, n = length in it, b = last. A dot is taken only
 * where a character can still follow it, so the part never ends in a state with no way on. */
static int step_email(grammar_frame *f, int c) {
    if (f->i == 0) {
        int sep_ok = f->n > 0 && f->b != '.';
        if (c == '@' && sep_ok) f->i = 1, f->n = 0;
        else if (f->n < 32 && (alnum_lower(c) || ((c == '_' || c == '-') && sep_ok) || (c == '.' && sep_ok && f->n < 31))) f->n++;
        else return R_REJECT;
    } else if (f->i == 1) {
        if (c == '.' && f->n > 0) f->i = 2, f->n = 0;
        else if (f->n < 32 && alnum_lower(c)) f->n++;
        else return R_REJECT;
    } else {
        if (c == '"' && f->n >= 2) return R_DONE;
        if (f->n < 6 && c >= 'a' && c <= 'z') f->n++;
        else return R_REJECT;
    }
    f->b = (uint64_t)c;
    return R_OK;
}

static int step_string(grammar_frame *f, const gnode *nd, int c) {
    if (c < 0 || c > 255) return R_REJECT;
    int room = nd->max < 0 || f->n < nd->max;
    switch (f->st) {
    case S_OPEN:
        if (c != '"') return R_REJECT;
        f->st = nd->format == FMT_TEMPLATE ? S_TMPL : nd->format == FMT_EMAIL ? S_EMAIL : S_IN;
        return R_OK;
    case S_IN:
        if (c == '"') return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c < 0x20 || !room) return R_REJECT;
        if (c == '\\') {
            f->st = S_ESC;
            return R_OK;
        }
        if (c < 0x80) {
            f->n++;
            return R_OK;
        }
        f->st = S_UTF;
        if (c >= 0xC2 && c <= 0xDF) f->i = 1, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xE0) f->i = 2, f->a = 0xA0 | 0xBF << 8;
        else if (c == 0xED) f->i = 2, f->a = 0x80 | 0x9F << 8;
        else if (c >= 0xE1 && c <= 0xEF) f->i = 2, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xF0) f->i = 3, f->a = 0x90 | 0xBF << 8;
        else if (c >= 0xF1 && c <= 0xF3) f->i = 3, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xF4) f->i = 3, f->a = 0x80 | 0x8F << 8;
        else return R_REJECT;
        return R_OK;
    case S_UTF:
        if (c < (int)(f->a & 0xFF) || c > (int)(f->a >> 8)) return R_REJECT;
        f->a = 0x80 | 0xBF << 8;
        if (--f->i == 0) {
            f->n++;
            f->st = S_IN;
        }
        return R_OK;
    case S_ESC:
        if (c == 'u') {
            f->st = S_HEX;
            f->i = 0;
            f->a = 0;
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return R_REJECT;
        f->n++;
        f->st = S_IN;
        return R_OK;
    case S_HEX: {
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) return R_REJECT;
        f->a = f->a * 16 + (uint64_t)v;
        if (++f->i == 2 && f->a >= 0xD8 && f->a <= 0xDF) return R_REJECT;   /* no surrogate halves */
        if (f->i == 4) {
            f->n++;
            f->st = S_IN;
        }
        return R_OK;
    }
    case S_TMPL: {
        int len = (int)strlen(nd->tmpl);
        if (f->i == len) return c == '"' ? R_DONE : R_REJECT;
        if (!tmpl_ok(nd->tmpl[f->i], (int)f->b, c)) return R_REJECT;
        f->b = (uint64_t)c;
        f->i++;
        return R_OK;
    }
    case S_EMAIL: return step_email(f, c);
    }
    return R_REJECT;
}

static int step_number(grammar_frame *f, const gnode *nd, int c) {
    grammar_frame t = *f;
    int digit = c >= '0' && c <= '9';
    switch (f->st) {
    case N_START:
        if (c == '-') {
            t.neg = 1;
            t.st = N_SIGN;
            break;
        }
        /* fallthrough */
    case N_SIGN:
        if (!digit) return R_REJECT;
        t.st = N_INT;
        t.i = 1;
        t.a = (uint64_t)(c - '0');
        break;
    case N_INT:
        if (digit) {
            if (f->a == 0 && f->i == 1) return R_REJECT;
            t.i++;
            t.a = f->a * 10 + (uint64_t)(c - '0');
            if (t.i > (nd->kind == GN_INT ? MAX_INT_DIGITS : MAX_NUM_DIGITS)) return R_REJECT;
            break;
        }
        if (c == '.' && nd->kind == GN_NUM) {
            t.st = N_DOT;
            t.n = 0;
            t.b = 0;
            break;
        }
        return grammar_num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
    case N_DOT:
    case N_FRAC:
        if (digit && f->n < MAX_FRAC) {
            t.st = N_FRAC;
            t.n++;
            t.b = f->b * 10 + (uint64_t)(c - '0');
            break;
        }
        return f->st == N_FRAC && grammar_num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
    }
    if (grammar_num_cost(nd, &t) >= GRAMMAR_INF) return R_REJECT;
    *f = t;
    return R_OK;
}

static int step_lits(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    uint64_t cand = 0, whole = 0;
    for (int k = 0; k < nd->n_lits; k++) {
        if (!(f->a >> k & 1)) continue;
        if (nd->lit_len[k] == (uint32_t)f->i) whole |= 1ull << k;
        else if (c >= 0 && (uint8_t)nd->lits[k][f->i] == c) cand |= 1ull << k;
    }
    if (!cand) return whole && nd->kind == GN_LITS ? R_PASS : R_REJECT;
    f->a = cand;
    f->i++;
    int all_whole = 1, one = -1;
    for (int k = 0; k < nd->n_lits; k++)
        if (cand >> k & 1) {
            if (nd->lit_len[k] != (uint32_t)f->i) all_whole = 0;
            else one = k;
        }
    if (nd->kind == GN_SELECT) {   /* select literals are prefix-free */
        if (one >= 0 && replace_top(g, s, nd->kids[one]) == R_REJECT) return R_REJECT;
        return R_OK;
    }
    return all_whole ? R_DONE : R_OK;
}

static int step(const grammar *g, grammar_state *s, int64_t c) {
    grammar_frame *f = &s->f[s->depth - 1];
    const gnode *nd = &g->nodes[f->node];
    int b = c >= 0 && c < 256 ? (int)c : c == SYM_END ? -1 : -2;   /* -2: a special token */
    switch (nd->kind) {
    case GN_OBJECT: return b == -2 ? R_REJECT : step_object(g, s, f, nd, b);
    case GN_ARRAY: return b == -2 ? R_REJECT : step_array(g, s, f, nd, b);
    case GN_STRING: return step_string(f, nd, b);
    case GN_INT:
    case GN_NUM:
        if (b == -1) return (f->st == N_INT || f->st == N_FRAC) && grammar_num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
        return b == -2 ? (grammar_num_cost(nd, f) == 0 && f->st != N_START && f->st != N_SIGN && f->st != N_DOT ? R_PASS : R_REJECT)
                       : step_number(f, nd, b);
    case GN_LITS:
    case GN_SELECT: return b == -2 ? (nd->kind == GN_LITS && f->i && step_lits(g, s, f, nd, -1) == R_PASS ? R_PASS : R_REJECT)
                                   : step_lits(g, s, f, nd, b);
    case GN_UNION:
        if (c == SYM_END) return R_REJECT;
        for (int k = 0; k < nd->n_kids; k++) {
            const gnode *kd = &g->nodes[nd->kids[k]];
            if (b >= 0 ? has_bit(kd->first, b) : kd->first_tok >= 0 && c == SYM_TOKEN(kd->first_tok))
                return replace_top(g, s, nd->kids[k]);
        }
        return R_REJECT;
    case GN_TOKEN: return c == SYM_TOKEN(nd->token) ? R_DONE : R_REJECT;
    case GN_SEQ:
        if (f->i == nd->n_kids) return R_PASS;
        return push(g, s, nd->kids[f->i++]);
    case GN_REPEAT: {
        const gnode *it = &g->nodes[nd->item];
        int starts = b >= 0 ? has_bit(it->first, b) : it->first_tok >= 0 && c == SYM_TOKEN(it->first_tok);
        if (starts && (nd->max < 0 || f->n < nd->max) && fits_at(g, s->depth, nd->item)) {
            f->n++;
            return push(g, s, nd->item);
        }
        return f->n >= nd->min ? R_PASS : R_REJECT;
    }
    }
    return R_REJECT;
}

static int feed_symbol(const grammar *g, grammar_state *s, int64_t c) {
    for (;;) {
        if (s->depth == 0) return s->done && c == SYM_END ? 0 : -1;
        int r = step(g, s, c);
        switch (r) {
        case R_REJECT: return -1;
        case R_OK: return 0;
        case R_DONE:
            if (--s->depth == 0) s->done = 1;
            return 0;
        case R_PASS:
            if (--s->depth == 0) s->done = 1;
            break;
        case R_AGAIN: break;
        }
    }
}

void grammar_state_init(const grammar *g, grammar_state *s) {
    s->depth = 0;
    s->done = 0;
    push(g, s, g->root);
}

void grammar_state_copy(grammar_state *dst, const grammar_state *src) {
    dst->depth = src->depth;
    dst->done = src->done;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof *src->f);
}

int grammar_feed(const grammar *g, grammar_state *s, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (feed_symbol(g, s, p[i])) return -1;
    return 0;
}

int grammar_feed_token(const grammar *g, grammar_state *s, int32_t id) { return feed_symbol(g, s, SYM_TOKEN(id)); }

int grammar_accepting(const grammar *g, const grammar_state *s) {
    grammar_state t;
    grammar_state_copy(&t, s);
    return feed_symbol(g, &t, SYM_END) == 0;
}

/* depth: the frames up to and including f */
static uint32_t frame_cost(const grammar *g, const grammar_frame *f, int depth) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case GN_OBJECT: {
        uint32_t rest = required_rest(g, nd, f->a, -1);
        switch (f->st) {
        case O_OPEN: return nd->minlen;
        case O_FIRST: return rest ? rest : 1;   /* the first member has no comma; '}' adds one */
        case O_AFTER: return sat_add(rest, 1);
        case O_NEXT: {
            if (rest) return rest;   /* rest counts one comma (already written) too many, '}' one too few */
            if (!nd->n_lits)
                return obj_free_key_fits(g, nd, depth) ? sat_add(g->nodes[g->str_node].minlen + 1, sat_add(g->nodes[nd->additional].minlen, 1))
                                                       : GRAMMAR_INF;
            uint32_t best = GRAMMAR_INF;
            uint64_t open = obj_open_keys(g, nd, f->a, depth);
            for (int p = 0; p < nd->n_lits; p++)
                if ((open >> p & 1) && prop_cost(g, nd, p) < best) best = prop_cost(g, nd, p);
            return sat_add(best, 1);
        }
        case O_KEY: {
            uint32_t best = GRAMMAR_INF;
            for (int p = 0; p < nd->n_lits; p++)
                if (f->b >> p & 1) {
                    uint32_t x = sat_add(nd->lit_len[p] - (uint32_t)f->i + 1, g->nodes[nd->kids[p]].minlen);
                    x = sat_add(x, sat_add(required_rest(g, nd, f->a, p), 1));
                    best = x < best ? x : best;
                }
            return best;
        }
        case O_COLON:
        case O_VALUE: {
            uint32_t v = g->nodes[f->n >= 0 ? nd->kids[f->n] : nd->additional].minlen;
            return sat_add(sat_add(f->st == O_COLON, v), sat_add(rest, 1));
        }
        }
        return GRAMMAR_INF;
    }
    case GN_ARRAY: {
        uint32_t ml = g->nodes[nd->item].minlen, need = f->n < nd->min ? (uint32_t)(nd->min - f->n) : 0;
        switch (f->st) {
        case A_OPEN: return nd->minlen;
        case A_FIRST: return need ? sat_add(sat_mul(ml + 1, need), 0) : 1;   /* items, commas between, ']' */
        case A_AFTER: return sat_add(sat_mul(ml + 1, need), 1);
        case A_NEXT: return sat_add(sat_mul(ml + 1, need ? need : 1), 0);
        }
        return GRAMMAR_INF;
    }
    case GN_STRING:
        switch (f->st) {
        case S_OPEN: return nd->minlen;
        case S_TMPL: return (uint32_t)strlen(nd->tmpl) - (uint32_t)f->i + 1;
        case S_EMAIL:
            if (f->i == 0) return (f->n == 0 || f->b == '.') + 1 + 1 + 1 + 2 + 1;
            if (f->i == 1) return (f->n == 0) + 1 + 2 + 1;
            return (f->n < 2 ? 2 - (uint32_t)f->n : 0) + 1;
        default: {
            uint32_t pend = f->st == S_ESC ? 1 : f->st == S_HEX ? 4 - (uint32_t)f->i : f->st == S_UTF ? (uint32_t)f->i : 0;
            uint32_t have = (uint32_t)f->n + (f->st != S_IN);
            return pend + (have < (uint32_t)nd->min ? (uint32_t)nd->min - have : 0) + 1;
        }
        }
    case GN_INT:
    case GN_NUM: return grammar_num_cost(nd, f);
    case GN_LITS:
    case GN_SELECT: {
        uint32_t best = GRAMMAR_INF;
        for (int k = 0; k < nd->n_lits; k++)
            if (f->a >> k & 1) {
                uint32_t x = nd->lit_len[k] - (uint32_t)f->i;
                if (nd->kind == GN_SELECT) x = sat_add(x, g->nodes[nd->kids[k]].minlen);
                best = x < best ? x : best;
            }
        return best;
    }
    case GN_UNION:
    case GN_TOKEN: return nd->minlen;
    case GN_SEQ: {
        uint32_t c = 0;
        for (int k = f->i; k < nd->n_kids; k++) c = sat_add(c, g->nodes[nd->kids[k]].minlen);
        return c;
    }
    case GN_REPEAT: return f->n < nd->min ? sat_mul(g->nodes[nd->item].minlen, (uint32_t)(nd->min - f->n)) : 0;
    }
    return GRAMMAR_INF;
}

uint32_t grammar_cost(const grammar *g, const grammar_state *s) {
    uint32_t c = 0;
    for (int i = 0; i < s->depth; i++) c = sat_add(c, frame_cost(g, &s->f[i], i + 1));
    return c;
}

int grammar_plain_string(const grammar *g, const grammar_state *s, int *len, int *min, int *max) {
    if (!s->depth) return 0;
    const grammar_frame *f = &s->f[s->depth - 1];
    const gnode *nd = &g->nodes[f->node];
    if (nd->kind != GN_STRING || f->st != S_IN) return 0;
    *len = f->n;
    *min = nd->min;
    *max = nd->max;
    return 1;
}


int grammar_node_accepts(const grammar *g, int node, const uint8_t *p, size_t n) {
    grammar_state s;
    s.depth = 0;
    s.done = 0;
    if (push(g, &s, node) == R_REJECT) return 0;
    return !grammar_feed(g, &s, p, n) && grammar_accepting(g, &s);
}
