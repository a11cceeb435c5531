/* test_tokenizer.c — BPE merge order (short and long pieces), Kimi's run split, special tokens, invalid UTF-8,
 * round trips, the streaming UTF-8 decoder and rank-file errors. Ids against the real tiktoken are checked by
 * tests/shell/test_tokenize.sh. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static int ids_eq(const tok_ids *a, const int32_t *want, size_t n) {
    if (a->n != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (a->v[i] != want[i]) return 0;
    return 1;
}

static tok_ids enc(const tokenizer *t, const char *s, size_t n, int special) {
    tok_ids ids = {0};
    df_error err = {0};
    if (tokenizer_encode(t, s, n, special, &ids, &err)) printf("# encode failed: %s\n", err.msg);
    return ids;
}

/* every byte plus the given merges, ranks in order */
static char *write_ranks(const char *const *merges, int with_byte_0x41) {
    char *path = xstrdup("/tmp/df_tok_XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int rank = 0;
    for (int b = 0; b < 256; b++, rank++)
        if (b != 0x41 || with_byte_0x41) fprintf(f, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], rank);
    for (; *merges; merges++, rank++) {
        const unsigned char *m = (const unsigned char *)*merges;
        size_t n = strlen(*merges);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t w = (uint32_t)m[i] << 16 | (i + 1 < n ? (uint32_t)m[i + 1] << 8 : 0) | (i + 2 < n ? m[i + 2] : 0);
            fprintf(f, "%c%c%c%c", b64[w >> 18], b64[(w >> 12) & 63], i + 1 < n ? b64[(w >> 6) & 63] : '=',
                    i + 2 < n ? b64[w & 63] : '=');
        }
        fprintf(f, " %d\n", rank);
    }
    fclose(f);
    return path;
}

static void test_merge_order(void) {
    static const char *const merges[] = {"ab", "bc", "abc", NULL};   /* 256, 257, 258 */
    char *path = write_ranks(merges, 1);
    tokenizer *t = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_tiktoken(&t, path, TOK_PATTERN_KIMI, &err) == DF_OK, "load custom ranks (%s)", err.msg);
    if (!t) return;
    tok_ids a = enc(t, "abc", 3, 0);
    CHECK(ids_eq(&a, (int32_t[]){258}, 1), "whole piece that is a token");
    tok_ids_free(&a);
    a = enc(t, "abcbc", 5, 0);
    CHECK(ids_eq(&a, (int32_t[]){258, 257}, 2), "lowest rank first: ab, bc, then abc");
    tok_ids_free(&a);
    /* the same periodic answer through the quadratic path (95 bytes) and the heap path (150 bytes) */
    for (int reps = 19; reps <= 30; reps += 11) {
        char s[160];
        int32_t want[64];
        for (int i = 0; i < reps; i++) {
            memcpy(s + 5 * i, "abcbc", 5);
            want[2 * i] = 258;
            want[2 * i + 1] = 257;
        }
        a = enc(t, s, (size_t)(5 * reps), 0);
        CHECK(ids_eq(&a, want, (size_t)(2 * reps)), "%d-byte piece merges like tiktoken", 5 * reps);
        tok_ids_free(&a);
    }
    tokenizer_free(t);
    unlink(path);
    free(path);
}

static void test_kimi_split(void) {
    tokenizer *dir = NULL, *flat = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_dir(&dir, "tests/tokenizer/tiny_k3", &err) == DF_OK, "load tiny_k3 folder (%s)", err.msg);
    CHECK(tokenizer_load_tiktoken(&flat, "tests/tokenizer/tiny_k3/tiktoken.model", TOK_PATTERN_KIMI, &err) == DF_OK,
          "load tiny_k3 ranks alone");
    if (!dir || !flat) return;
    size_t n = 1 + 25001;
    char *s = xmalloc(n);
    s[0] = 'z';
    memset(s + 1, 'x', n - 1);
    /* one 25 002-letter run: Kimi cuts it after 25 000 characters, plain tiktoken does not */
    tok_ids a = enc(dir, s, n, 0), b = enc(flat, s, n, 0);
    CHECK(a.n == 12502 && a.v[0] == 'z' && a.v[12499] == 256 && a.v[12500] == 'x' && a.v[12501] == 256,
          "model folder: 25 000-character run split (%zu ids)", a.n);
    CHECK(b.n == 12502 && b.v[12500] == 256 && b.v[12501] == 'x', "bare rank file: no split");
    tok_ids_free(&a);
    tok_ids_free(&b);
    free(s);
    CHECK(tokenizer_n_vocab(dir) == 257 + 256, "vocab = base + 256 reserved (%d)", (int)tokenizer_n_vocab(dir));
    CHECK(tokenizer_special_id(dir, "<|open|>") == 260 && tokenizer_special_id(dir, "<|reserved_token_300|>") == 300,
          "specials from tokenizer_config.json and reserved names");
    size_t l;
    const uint8_t *p = tokenizer_token_bytes(dir, 259, &l);
    CHECK(p && l == 14 && !memcmp(p, "<|end_of_msg|>", 14) && tokenizer_is_special(dir, 259) &&
              !tokenizer_is_special(dir, 'a'),
          "special token bytes are its name");
    tokenizer_free(dir);
    tokenizer_free(flat);
}

static void test_specials_and_invalid(void) {
    tokenizer *t = NULL;
    df_error err = {0};
    tokenizer_load_dir(&t, "tests/tokenizer/tiny_k3", &err);
    if (!t) return;
    tok_ids a = enc(t, "a<|open|>b", 10, 1);
    CHECK(ids_eq(&a, (int32_t[]){'a', 260, 'b'}, 3), "special recognised when allowed");
    tok_ids_free(&a);
    a = enc(t, "<|open|>", 8, 0);
    CHECK(a.n == 8 && a.v[0] == '<', "special is text when not allowed");
    tok_ids_free(&a);
    CHECK(tokenizer_add_special(t, "[X]", 600, &err) == DF_OK && tokenizer_add_special(t, "[X]]", 601, &err) == DF_OK,
          "add specials");
    CHECK(tokenizer_add_special(t, "[Y]", 'a', &err) == DF_EFORMAT, "special on an ordinary id is refused");
    a = enc(t, "[X]][X]", 7, 1);
    CHECK(ids_eq(&a, (int32_t[]){601, 600}, 2), "longest special at the earliest position");
    tok_ids_free(&a);
    a = enc(t, "a\xff" "b\xe4\xb8", 5, 0);
    CHECK(ids_eq(&a, (int32_t[]){'a', 0xff, 'b', 0xe4, 0xb8}, 5), "invalid UTF-8 bytes are their byte tokens");
    tok_ids_free(&a);
    uint8_t rnd[3000];
    srand(3);
    for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (uint8_t)(i % 7 == 0 ? ' ' : rand());
    a = enc(t, (const char *)rnd, sizeof rnd, 1);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    CHECK(tokenizer_decode(t, a.v, a.n, &buf, &len, &cap, &err) == DF_OK && len == sizeof rnd &&
              !memcmp(buf, rnd, len),
          "decode(encode(random bytes)) == bytes");
    int32_t bad = 99999;
    len = 0;
    CHECK(tokenizer_decode(t, &bad, 1, &buf, &len, &cap, &err) == DF_EINVAL && strstr(err.msg, "99999"),
          "unknown id: %s", err.msg);
    free(buf);
    tok_ids_free(&a);
    tokenizer_free(t);
}

static int stream_is(const char *in, size_t n, int bytewise, const char *want) {
    utf8_stream s;
    utf8_stream_init(&s);
    char *out = NULL;
    size_t len = 0, cap = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i += bytewise ? 1 : n) {
        size_t before = len;
        utf8_stream_feed(&s, (const uint8_t *)in + i, bytewise ? 1 : n, &out, &len, &cap);
        for (size_t k = before; k < len; k++)   /* never a lone lead byte at the end of what was emitted */
            if (k + 1 == len && (uint8_t)out[k] >= 0xC0) ok = 0;
    }
    utf8_stream_flush(&s, &out, &len, &cap);
    ok = ok && len == strlen(want) && !memcmp(out, want, len);
    free(out);
    return ok;
}

static void test_utf8_stream(void) {
    const char *mixed = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80z";
    CHECK(stream_is(mixed, strlen(mixed), 1, mixed), "byte by byte: only whole characters come out");
    CHECK(stream_is(mixed, strlen(mixed), 0, mixed), "all at once");
    CHECK(stream_is("\xff", 1, 1, "\xef\xbf\xbd"), "invalid byte -> U+FFFD");
    CHECK(stream_is("\xe4\xb8" "A", 3, 1, "\xef\xbf\xbd" "A"), "truncated sequence -> one U+FFFD, next char kept");
    CHECK(stream_is("\xed\xa0\x80", 3, 1, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"), "surrogate -> 3 x U+FFFD");
    CHECK(stream_is("x\xf0\x9f", 3, 1, "x\xef\xbf\xbd"), "flush: pending partial -> U+FFFD");
    int held = 1;
    utf8_stream s;
    utf8_stream_init(&s);
    char *out = NULL;
    size_t len = 0, cap = 0;
    utf8_stream_feed(&s, (const uint8_t *)"\xf0\x9f\x98", 3, &out, &len, &cap);
    held = len == 0;
    utf8_stream_feed(&s, (const uint8_t *)"\x80", 1, &out, &len, &cap);
    CHECK(held && len == 4, "3 of 4 bytes held back, then the emoji");
    free(out);
}

static void test_bad_files(void) {
    static const char *const none[] = {NULL};
    char *path = write_ranks(none, 0);
    tokenizer *t = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_tiktoken(&t, path, TOK_PATTERN_KIMI, &err) == DF_EFORMAT && strstr(err.msg, "0x41"),
          "missing byte token: %s", err.msg);
    unlink(path);
    free(path);
    static const char *const dup[] = {"A", NULL};
    path = write_ranks(dup, 1);
    CHECK(tokenizer_load_tiktoken(&t, path, TOK_PATTERN_KIMI, &err) == DF_EFORMAT && strstr(err.msg, "same bytes"),
          "duplicate token bytes: %s", err.msg);
    unlink(path);
    free(path);
    CHECK(tokenizer_load_tiktoken(&t, "/nonexistent/x.tiktoken", TOK_PATTERN_KIMI, &err) == DF_EIO && !t,
          "missing file: %s", err.msg);
}

int main(void) {
    test_merge_order();
    test_kimi_split();
    test_specials_and_invalid();
    test_utf8_stream();
    test_bad_files();
    TEST_EXIT();
}
