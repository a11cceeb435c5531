/* prompt_cache.h — conversation states kept on disk across restarts, keyed by the token prefix they hold
 * (DIR/<hash of the prefix>.kv with the prefix's tokens beside it): a request whose prompt starts with a
 * cached prefix restores that state instead of prefilling it. Size-capped, least recently used evicted,
 * written atomically by the library's df_session_save and verified by df_session_load. */
#ifndef DF_SRV_PROMPT_CACHE_H
#define DF_SRV_PROMPT_CACHE_H

#include <stdint.h>
#include "deltafin.h"

typedef struct prompt_cache prompt_cache;

/* Opens (creating) dir for the states of one engine: key is its df_engine_fingerprint, recorded in every
 * entry; an entry of another key (other weights, spine or options), a damaged one, or anything but a
 * regular file under the cache's names is dropped with one message on stderr. max_bytes caps the total size
 * of the cache's files (entries, and files of its naming that are no entry); prompts shorter than
 * min_tokens are not kept. */
int pcache_open(prompt_cache **out, const char *dir, uint64_t key, uint64_t max_bytes, int min_tokens,
                df_error *err);
void pcache_free(prompt_cache *pc);
/* Restores into sess the longest cached prefix of ids[0..n) longer than `have` tokens; returns its length,
 * or `have` (sess untouched) when there is none or it fails to load. */
int64_t pcache_restore(prompt_cache *pc, df_session *sess, const int32_t *ids, int64_t n, int64_t have);
/* Saves sess, which holds exactly ids[0..n), unless that prefix is kept already. Returns 1 when written. */
int pcache_save(prompt_cache *pc, const df_session *sess, const int32_t *ids, int64_t n);
/* 0 once saving turned out to be unsupported: callers need not stop where an entry would be saved. */
int pcache_active(prompt_cache *pc);
/* Entries and bytes kept, and whether saving works (it turns itself off when the library cannot save
 * session state; *why then says so). For /props. */
void pcache_usage(prompt_cache *pc, int *entries, uint64_t *bytes, int *enabled, const char **why);

#endif
