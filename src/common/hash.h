/* hash.h — the two hashes storage checks bytes with: a fast 64-bit one for disk-cache entries (the XXH64
 * algorithm: several GB/s, so verifying an entry on every load costs little next to reading it) and SHA-256
 * for whole shards, compared with the hash the hub publishes for LFS files. */
#ifndef DF_HASH_H
#define DF_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t df_hash64(const void *data, size_t len, uint64_t seed);

typedef struct df_sha256 {
    uint32_t h[8];
    uint64_t len;            /* bytes so far */
    uint8_t buf[64];
    size_t nbuf;
} df_sha256;

void df_sha256_init(df_sha256 *s);
void df_sha256_update(df_sha256 *s, const void *data, size_t len);
/* The digest as 64 lowercase hex digits and a NUL. */
void df_sha256_hex(df_sha256 *s, char out[65]);

#endif
