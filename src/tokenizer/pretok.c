/* pretok.c — pre-tokenisation with PCRE2 (UTF + UCP, JIT) and the encode driver: Kimi's run split, special
 * tokens, invalid-UTF-8 handling, then byte-pair merging of each regex piece. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

/* Rust regex `\s` is Unicode White_Space; PCRE2's UCP `\s` also matches U+180E, so spell the set out. */
#define WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
/* PCRE2 10.42 has no class intersection: `[X&&[^\p{Han}]]` becomes `(?:(?!\p{Han})[X])`. */
#define UPPER_NOHAN "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define LOWER_NOHAN "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"

static const char PAT_KIMI[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER_NOHAN "*" LOWER_NOHAN "+" CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER_NOHAN "+" LOWER_NOHAN "*" CONTRACTIONS "?"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

static const char PAT_CL100K[] =
    CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

static const char PAT_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTIONS "?"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

int tok_pretok_compile(tokenizer *t, const char *pattern, df_error *err) {
    const char *re = pattern;
    if (!strcmp(pattern, TOK_PATTERN_KIMI)) re = PAT_KIMI;
    else if (!strcmp(pattern, TOK_PATTERN_CL100K)) re = PAT_CL100K;
    else if (!strcmp(pattern, TOK_PATTERN_O200K)) re = PAT_O200K;
    int ec;
    PCRE2_SIZE eoff;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eoff, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        df_error_set(err, DF_EINVAL, "pre-tokenisation regex: %s at offset %zu", (const char *)msg, (size_t)eoff);
        return DF_EINVAL;
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);   /* the interpreter is the fallback where JIT is missing */
    t->re = code;
    return DF_OK;
}

void tok_pretok_free(tokenizer *t) {
    pcre2_code_free((pcre2_code *)t->re);
    t->re = NULL;
}

typedef struct enc_ctx {
    const tokenizer *t;
    tok_ids *out;
    df_error *err;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
} enc_ctx;

static int pretok_run(enc_ctx *c, const uint8_t *p, size_t n) {
    if (!c->md) {
        c->md = pcre2_match_data_create_from_pattern((pcre2_code *)c->t->re, NULL);
        c->mc = pcre2_match_context_create(NULL);
        c->js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
        if (!c->md || !c->mc || !c->js) df_die("out of memory (PCRE2 match data)");
        pcre2_jit_stack_assign(c->mc, NULL, c->js);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    size_t off = 0;
    while (off < n) {
        int rc = pcre2_match((pcre2_code *)c->t->re, p, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;   /* tiktoken also drops text no alternative matches */
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            df_error_set(c->err, DF_EUNSUPPORTED, "pre-tokenisation failed at byte %zu: %s", off, (const char *)msg);
            return DF_EUNSUPPORTED;
        }
        size_t s = ov[0], e = ov[1];
        if (e == s) {   /* only a user regex can match empty; skip one character like find_iter */
            off = e + 1;
            while (off < n && (p[off] & 0xC0) == 0x80) off++;
            continue;
        }
        tok_bpe_piece(c->t, p + s, e - s, c->out);
        off = e;
    }
    return DF_OK;
}

/* Valid UTF-8 runs go through the regex; each invalid byte is a piece of its own (its byte token). */
static int encode_ordinary(enc_ctx *c, const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        int k;
        while (j < n && (k = utf8_valid_len(p + j, n - j)) > 0) j += (size_t)k;
        if (j > i) {
            int rc = pretok_run(c, p + i, j - i);
            if (rc) return rc;
        }
        if (j < n) tok_bpe_piece(c->t, p + j, 1, c->out);
        i = j + 1;
    }
    return DF_OK;
}

static int encode_segment(enc_ctx *c, const uint8_t *p, size_t n, int allow_special) {
    const tokenizer *t = c->t;
    size_t from = 0;
    if (allow_special && t->n_sp) {
        for (size_t i = 0; i < n; i++) {
            if (!t->sp_first[p[i]]) continue;
            int best = -1;
            for (int s = 0; s < t->n_sp; s++)
                if (t->sp_len[s] <= n - i && !memcmp(p + i, t->sp_name[s], t->sp_len[s]) &&
                    (best < 0 || t->sp_len[s] > t->sp_len[best]))
                    best = s;
            if (best < 0) continue;
            int rc = encode_ordinary(c, p + from, i - from);
            if (rc) return rc;
            tok_ids_push(c->out, t->sp_id[best]);
            i += t->sp_len[best] - 1;
            from = i + 1;
        }
    }
    return encode_ordinary(c, p + from, n - from);
}

/* Python's str.isspace, which Kimi's splitter uses. */
static int py_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static uint32_t utf8_cp(const uint8_t *p, int k) {
    if (k == 1) return p[0];
    uint32_t cp = p[0] & (0x7F >> k);
    for (int i = 1; i < k; i++) cp = cp << 6 | (p[i] & 0x3F);
    return cp;
}

/* Kimi's tokenizer encodes ≤ 400 000-character chunks, each cut further wherever a run of whitespace or of
 * non-whitespace would exceed 25 000 characters (a guard against tiktoken's recursion limits). */
static int encode_kimi_split(enc_ctx *c, const uint8_t *p, size_t n, int allow_special) {
    enum { CHUNK = 400000, RUN = 25000 };
    size_t i = 0;
    while (i < n) {
        size_t slice_start = i, run = 0, chars = 0;
        int cur_space = -1;
        while (i < n && chars < CHUNK) {
            int k = utf8_valid_len(p + i, n - i);
            int sp = k > 0 && py_isspace(utf8_cp(p + i, k));
            if (k <= 0) k = 1;
            if (cur_space < 0) cur_space = sp;
            if (sp != cur_space) {
                run = 1;
                cur_space = sp;
            } else if (++run > RUN) {
                int rc = encode_segment(c, p + slice_start, i - slice_start, allow_special);
                if (rc) return rc;
                slice_start = i;
                run = 1;
            }
            i += (size_t)k;
            chars++;
        }
        int rc = encode_segment(c, p + slice_start, i - slice_start, allow_special);
        if (rc) return rc;
    }
    return DF_OK;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special, tok_ids *out,
                     df_error *err) {
    enc_ctx c = {.t = t, .out = out, .err = err};
    const uint8_t *p = (const uint8_t *)text;
    int rc = t->kimi_split ? encode_kimi_split(&c, p, len, allow_special) : encode_segment(&c, p, len, allow_special);
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mc);
    pcre2_jit_stack_free(c.js);
    return rc;
}
