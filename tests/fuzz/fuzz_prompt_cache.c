/* fuzz_prompt_cache.c — libFuzzer target for the prompt cache's folder reader: the input is a file name (up
 * to the first newline) and a token file's bytes (the rest). Any name parses or is not the cache's; any
 * bytes are refused with a reason or give exactly the tokens the name and header promise. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/prompt_cache_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_KEY 0x1234567890abcdefull   /* the seeds' key */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t name_len = nl ? (size_t)(nl - data) : size;
    char *name = xmalloc(name_len + 1);
    memcpy(name, data, name_len);
    name[name_len] = 0;
    const uint8_t *body = nl ? nl + 1 : data + size;
    size_t len = (size_t)(data + size - body);
    unsigned long long h = 0;
    long long n = 0;
    int is_tok = 0;
    if (pc_name_parse(name, &h, &n, &is_tok)) {
        DF_ASSERT(n > 0);
        const char *why = NULL;
        int32_t *ids = is_tok ? pc_tokens_parse(body, len, n, h, FUZZ_KEY, &why) : NULL;
        if (ids) {   /* accepted: the size, count, hash and key are what the name and header say */
            DF_ASSERT(n <= PC_MAX_TOKENS && len == PC_TOK_HEAD + 4 * (size_t)n);
            DF_ASSERT(pc_hash_tokens(ids, n) == h);
            uint8_t head[PC_TOK_HEAD];
            pc_tokens_head(head, n, h, FUZZ_KEY);
            DF_ASSERT(!memcmp(head, body, PC_TOK_HEAD));
            free(ids);
        } else if (is_tok) {
            DF_ASSERT(why && *why);
        }
    }
    free(name);
    return 0;
}
