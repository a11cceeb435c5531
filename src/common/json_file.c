/* json_file.c — df_json_load_file (util.h): JSON model and state files read through the bounded,
 * regular-file-only reader. Apart from util.c so the kernels' cross build needs no jansson. */
#include <jansson.h>
#include <stdlib.h>

#include "util.h"

json_t *df_json_load_file(const char *path, size_t flags, df_error *err) {
    size_t len;
    char *text = df_read_file_max(path, DF_JSON_FILE_MAX, &len, err);
    if (!text) return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, flags, &je);
    free(text);
    if (!root)
        df_error_set(err, DF_EFORMAT, "%s: bad JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
    return root;
}
