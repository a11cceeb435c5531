/* prompt_cache.c — placeholder until written; see prompt_cache.h. */
#include "server/prompt_cache.h"
#include <stdlib.h>
struct prompt_cache { int unused; };
int pcache_open(prompt_cache **out, const char *dir, uint64_t max_bytes, int min_tokens, df_error *err) {
    *out = NULL;
    df_error_set(err, DF_EUNSUPPORTED, "not yet");
    return DF_EUNSUPPORTED;
}
void pcache_free(prompt_cache *pc) { free(pc); }
int64_t pcache_restore(prompt_cache *pc, df_session *sess, const int32_t *ids, int64_t n, int64_t have) { return have; }
int pcache_save(prompt_cache *pc, const df_session *sess, const int32_t *ids, int64_t n) { return 0; }
void pcache_usage(prompt_cache *pc, int *entries, uint64_t *bytes) { *entries = 0; *bytes = 0; }
