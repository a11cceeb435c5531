/* fuzz_index.c — libFuzzer target for the model.safetensors.index.json parser fetch trusts with file names:
 * any text gives a list of shard names or a message; every name listed is unique, relative and stays in
 * the model folder. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "install/fetch_plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char **names = NULL;
    int n = 0;
    df_error err = {0};
    int rc = fplan_index_shards((const char *)data, size, "fuzz/index.json", &names, &n, &err);
    DF_ASSERT(rc ? err.msg[0] != 0 : n >= 1);
    for (int i = 0; i < n; i++) {
        const char *s = names[i];
        DF_ASSERT(s[0] && s[0] != '/' && strcmp(s, "..") && strncmp(s, "../", 3) && !strstr(s, "/../") &&
                  !strstr(s, "//") && (strlen(s) < 3 || strcmp(s + strlen(s) - 3, "/..")));
        for (int k = 0; k < i; k++) DF_ASSERT(strcmp(names[k], s));
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return 0;
}
