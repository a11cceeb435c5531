/* prompt_cache_file.c — the prompt cache's names and token files (prompt_cache_file.h). */
#include "server/prompt_cache_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

uint64_t pc_hash_tokens(const int32_t *ids, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint8_t)((uint32_t)ids[i] >> (8 * b));
            h *= 1099511628211ull;
        }
    return h;
}

int pc_name_parse(const char *name, unsigned long long *h, long long *n, int *is_tok) {
    int used = 0;
    *is_tok = 0;
    const char *s = name[0] == '.' ? name + 1 : name;
    if (strlen(s) < 20 || s[16] != '-' || s[17] < '0' || s[17] > '9') return 0;
    for (int i = 0; i < 16; i++)
        if (!strchr("0123456789abcdef", s[i]) || !s[i]) return 0;
    if (sscanf(s, "%16llx-%lld%n", h, n, &used) != 2 || *n <= 0) return 0;
    const char *ext = s + used;
    if (name[0] == '.') return !strncmp(ext, ".tok.tmp-", 9) || !strncmp(ext, ".kv.tmp-", 8);
    if (!strcmp(ext, ".tok")) return *is_tok = 1;
    if (!strcmp(ext, ".kv")) return 1;
    return !strncmp(ext, ".tok.", 5) || !strncmp(ext, ".kv.tmp.", 8);
}

void pc_tokens_head(uint8_t head[PC_TOK_HEAD], int64_t n, uint64_t hash, uint64_t key) {
    uint32_t magic = PC_TOK_MAGIC;
    uint64_t count = (uint64_t)n;
    memcpy(head, &magic, 4);
    memcpy(head + 4, &count, 8);
    memcpy(head + 12, &hash, 8);
    memcpy(head + 20, &key, 8);
}

int32_t *pc_tokens_parse(const uint8_t *buf, size_t len, int64_t want_n, uint64_t want_hash, uint64_t key,
                         const char **why) {
    *why = "shorter than a token file's header";
    if (want_n <= 0 || want_n > PC_MAX_TOKENS || len < PC_TOK_HEAD) {
        if (want_n <= 0 || want_n > PC_MAX_TOKENS) *why = "not a token file of this cache";
        return NULL;
    }
    uint32_t magic;
    uint64_t n, sum, k;
    memcpy(&magic, buf, 4);
    memcpy(&n, buf + 4, 8);
    memcpy(&sum, buf + 12, 8);
    memcpy(&k, buf + 20, 8);
    if (magic != PC_TOK_MAGIC) {
        *why = "bad magic (another format or version)";
        return NULL;
    }
    /* want_n is at most PC_MAX_TOKENS: 4 * want_n cannot wrap, and n is compared with it first */
    if (n != (uint64_t)want_n || len != PC_TOK_HEAD + 4 * (size_t)want_n) {
        *why = "count or size mismatch";
        return NULL;
    }
    if (k != key) {
        *why = "saved by other weights, spine or options";
        return NULL;
    }
    int32_t *ids = xmalloc((size_t)n * 4);
    memcpy(ids, buf + PC_TOK_HEAD, (size_t)n * 4);
    if (pc_hash_tokens(ids, (int64_t)n) != sum || sum != want_hash) {
        *why = "checksum mismatch";
        free(ids);
        return NULL;
    }
    return ids;
}
