/* tok_load.c — building a tokenizer from a rank file + pattern, or from a model folder (tiktoken.model and
 * the special tokens of tokenizer_config.json). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    const char *name;
    int32_t id;
} tok_named;

static const tok_named CL100K_SPECIALS[] = {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258},
                                            {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
                                            {"<|endofprompt|>", 100276}, {NULL, 0}};
static const tok_named O200K_SPECIALS[] = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}, {NULL, 0}};

int tokenizer_load_tiktoken(tokenizer **out, const char *path, const char *pattern, df_error *err) {
    tokenizer *t;
    int rc = tok_load_ranks(&t, path, err);
    if (rc) return rc;
    rc = tok_pretok_compile(t, pattern, err);
    const tok_named *sp = !strcmp(pattern, TOK_PATTERN_CL100K) ? CL100K_SPECIALS
                          : !strcmp(pattern, TOK_PATTERN_O200K) ? O200K_SPECIALS
                                                                : NULL;
    for (; rc == DF_OK && sp && sp->name; sp++) rc = tokenizer_add_special(t, sp->name, sp->id, err);
    if (rc) {
        tokenizer_free(t);
        *out = NULL;
        return rc;
    }
    *out = t;
    return DF_OK;
}

/* added_tokens_decoder: {"163584": {"content": "[BOS]", ...}, ...} */
static int tok_load_config(tokenizer *t, const char *path, df_error *err) {
    json_t *root = df_json_load_file(path, 0, err);
    if (!root) return err && err->code ? err->code : DF_EFORMAT;
    int rc = DF_OK;
    json_t *dec = json_object_get(root, "added_tokens_decoder");
    if (dec && !json_is_object(dec)) {
        df_error_set(err, DF_EFORMAT, "%s: added_tokens_decoder is not an object", path);
        rc = DF_EFORMAT;
    }
    const char *key;
    json_t *v;
    if (rc == DF_OK && dec) json_object_foreach(dec, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        const char *name = json_string_value(json_object_get(v, "content"));
        if (*end || end == key || id < 0 || id > INT32_MAX / 2 || !name) {
            df_error_set(err, DF_EFORMAT, "%s: added_tokens_decoder entry '%s' needs a numeric id and a content string",
                         path, key);
            rc = DF_EFORMAT;
            break;
        }
        if ((rc = tokenizer_add_special(t, name, (int32_t)id, err))) break;
    }
    json_decref(root);
    return rc;
}

int tokenizer_load_dir(tokenizer **out, const char *dir, df_error *err) {
    *out = NULL;
    char *rpath = df_path_join(dir, "tiktoken.model");
    char *cpath = df_path_join(dir, "tokenizer_config.json");
    tokenizer *t = NULL;
    int rc = tok_load_ranks(&t, rpath, err);
    if (rc == DF_OK) rc = tok_pretok_compile(t, TOK_PATTERN_KIMI, err);
    if (rc == DF_OK && access(cpath, F_OK) == 0) rc = tok_load_config(t, cpath, err);
    /* The 256 ids after the base vocabulary are special; unnamed ones keep a placeholder name. */
    for (int32_t id = t ? t->n_base : 0; rc == DF_OK && t && id < t->n_base + 256; id++) {
        size_t l;
        if (tokenizer_token_bytes(t, id, &l)) continue;
        char name[48];
        snprintf(name, sizeof name, "<|reserved_token_%d|>", (int)id);
        rc = tokenizer_add_special(t, name, id, err);
    }
    free(rpath);
    free(cpath);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    t->kimi_split = 1;
    *out = t;
    return DF_OK;
}
