/* prompt.c — reads the fixture prompt format {"prefill":[ids],"decode":[ids]}. */
#include "prompt.h"

#include <jansson.h>
#include <stdlib.h>
#include "util.h"

static int32_t *read_ids(json_t *root, const char *key, int *n, const char *path, df_error *err) {
    json_t *a = json_object_get(root, key);
    *n = 0;
    if (!a) return xmalloc(sizeof(int32_t));
    if (!json_is_array(a)) {
        df_error_set(err, DF_EFORMAT, "%s: \"%s\" must be an array of token ids", path, key);
        return NULL;
    }
    int32_t *ids = xmalloc((json_array_size(a) + 1) * sizeof(int32_t));
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            df_error_set(err, DF_EFORMAT, "%s: %s[%zu] is not a token id", path, key, i);
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)json_array_size(a);
    return ids;
}

int prompt_read_file(const char *path, int32_t **prefill, int *np, int32_t **decode, int *nd, df_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root || !json_is_object(root)) {
        df_error_set(err, DF_EFORMAT, "%s: bad JSON (line %d: %s)", path, jerr.line, root ? "not an object" : jerr.text);
        json_decref(root);
        return DF_EFORMAT;
    }
    *prefill = read_ids(root, "prefill", np, path, err);
    *decode = *prefill ? read_ids(root, "decode", nd, path, err) : NULL;
    json_decref(root);
    if (!*prefill || !*decode) {
        free(*prefill);
        return DF_EFORMAT;
    }
    if (*np == 0) {
        df_error_set(err, DF_EFORMAT, "%s: \"prefill\" must hold at least one token", path);
        free(*prefill);
        free(*decode);
        return DF_EFORMAT;
    }
    return DF_OK;
}
