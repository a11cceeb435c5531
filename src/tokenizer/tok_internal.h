/* tok_internal.h — the tokenizer struct and helpers shared by the files of src/tokenizer/ only. */
#ifndef DF_TOK_INTERNAL_H
#define DF_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

#define TOK_NONE UINT32_MAX   /* tok_len of a rank with no token (a hole in the rank file) */

typedef struct tok_slot {
    uint32_t hash;
    int32_t id;               /* -1: empty */
} tok_slot;

struct tokenizer {
    uint8_t *bytes;           /* all token bytes, back to back */
    uint32_t *tok_off, *tok_len;
    int32_t n_base;           /* 1 + the largest rank */
    int32_t n_vocab;          /* 1 + the largest id, specials included */
    tok_slot *slots;          /* open addressing: bytes -> rank */
    uint32_t mask;
    char **sp_name;
    size_t *sp_len;
    int32_t *sp_id;
    int n_sp, cap_sp;
    uint8_t sp_first[256];    /* first bytes of special names, for a fast scan */
    void *re;                 /* pcre2_code_8 */
    int kimi_split;           /* Kimi's ≤ 25 000-char whitespace/non-whitespace runs, ≤ 400 000-char chunks */
};

int tok_load_ranks(tokenizer **out, const char *path, df_error *err);
int32_t tok_rank(const tokenizer *t, const uint8_t *p, size_t n);
void tok_bpe_piece(const tokenizer *t, const uint8_t *p, size_t n, tok_ids *out);
int tok_pretok_compile(tokenizer *t, const char *pattern, df_error *err);
void tok_pretok_free(tokenizer *t);
void tok_buf_append(char **buf, size_t *len, size_t *cap, const void *p, size_t n);

#endif
