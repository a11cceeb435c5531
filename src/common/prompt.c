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
    *prefill = *decode = NULL;
    *np = *nd = 0;
    json_t *root = df_json_load_file(path, 0, err);
    if (!root) return err && err->code ? err->code : DF_EFORMAT;
    if (!json_is_object(root)) {
        df_error_set(err, DF_EFORMAT, "%s: not a JSON object", path);
        json_decref(root);
        return DF_EFORMAT;
    }
    int32_t *pre = read_ids(root, "prefill", np, path, err), *dec = pre ? read_ids(root, "decode", nd, path, err) : NULL;
    json_decref(root);
    int rc = pre && dec ? DF_OK : DF_EFORMAT;
    if (!rc && *np == 0)
        rc = (df_error_set(err, DF_EFORMAT, "%s: \"prefill\" must hold at least one token", path), DF_EFORMAT);
    if (rc) {   /* the caller gets nothing to free on failure */
        free(pre);
        free(dec);
        *np = *nd = 0;
        return rc;
    }
    *prefill = pre;
    *decode = dec;
    return DF_OK;
}
