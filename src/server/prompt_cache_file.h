/* prompt_cache_file.h — the prompt cache's on-disk names and token files, apart from the cache itself so a
 * fuzz target can take them without the engine.
 *
 * An entry is HASH-N.kv (the session state) and HASH-N.tok: 16 lowercase hex digits of the tokens' FNV-1a
 * hash, '-', the token count N, then the extension. The .tok holds a 28-byte header (little-endian on the
 * machines deltafin runs on: magic "DFP2", u64 count, u64 token hash, u64 key of the engine that computed
 * the state) and the N int32 tokens. Writers' temp files are ".HASH-N.EXT.tmp-XXXXXX". */
#ifndef DF_SRV_PROMPT_CACHE_FILE_H
#define DF_SRV_PROMPT_CACHE_FILE_H

#include <stddef.h>
#include <stdint.h>

#define PC_TOK_MAGIC 0x32504644u   /* "DFP2" */
#define PC_TOK_HEAD 28
#define PC_MAX_TOKENS ((int64_t)1 << 26)   /* past any context: a larger count in a name is no entry */

/* FNV-1a over the tokens' little-endian bytes. */
uint64_t pc_hash_tokens(const int32_t *ids, int64_t n);
/* Whether a file name is of the cache's making (an entry's .kv or .tok, or a writer's temp file, current or
 * of older spellings); *is_tok is set for HASH-N.tok, *hash and *n from the name. */
int pc_name_parse(const char *name, unsigned long long *hash, long long *n, int *is_tok);
/* The header of a .tok for n tokens of that hash, saved by the engine of that key. */
void pc_tokens_head(uint8_t head[PC_TOK_HEAD], int64_t n, uint64_t hash, uint64_t key);
/* The tokens of a .tok's bytes, checked against the name's count and hash and the engine's key (a count is
 * compared with the bounded one of the name before it sizes anything); a new array, or NULL with *why
 * saying what is wrong. */
int32_t *pc_tokens_parse(const uint8_t *buf, size_t len, int64_t want_n, uint64_t want_hash, uint64_t key,
                         const char **why);

#endif
