/* dcache.h — what a partial install keeps on disk besides its shards: the install manifest and the expert
 * disk cache, both under DIR/.deltafin/.
 *
 * Manifest (install.json, replaced atomically, written only by `deltafin fetch`): the source URL and, per
 * shard, its size and state: PENDING (the file may be anything), SPINE (header and every non-expert byte
 * present and synced; the listed holes, the expert spans, are not) or COMPLETE. A shard the manifest does
 * not list, or a folder without a manifest, is a normal local file. Holes are never read from the shard (a
 * sparse file would give zeros): they come from the cache.
 *
 * Cache entries: one file per span, cache/<shard name>/<offset>-<length>, holding the raw shard bytes of
 * [offset, offset+length) after offset % 4096 zero bytes, so file positions keep the shard's alignment and
 * O_DIRECT reads work, then a 16-byte trailer: a magic and the XXH64 of those bytes, written at fetch time
 * and checked on every read into memory (a corrupt entry is an error, never served). Written to a temp
 * file, fsynced, renamed, directory fsynced: an entry that is visible is whole. A writer holds an flock on
 * its temp file; temp files nobody holds (their writer died, on any host or container sharing the folder)
 * are removed at open.
 *
 * Disk use: writes keep min_free bytes free on the file system; $DELTAFIN_CACHE_MAX_GB caps the cache's
 * size, evicting least recently read entries to make room. */
#ifndef DF_STORE_DCACHE_H
#define DF_STORE_DCACHE_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

#define DC_STATE_DIR ".deltafin"
#define DC_MANIFEST ".deltafin/install.json"

typedef struct dc_span {
    uint64_t off, len;
} dc_span;

enum { DC_PENDING = 0, DC_SPINE = 1, DC_COMPLETE = 2 };

typedef struct dc_shard {
    char *name;              /* relative to the model folder */
    uint64_t size;
    int state;
    int n_holes;
    dc_span *holes;          /* sorted by offset, disjoint */
    char *sha256;            /* the whole file's SHA-256 as the remote published it, or NULL */
    int verified;            /* complete and its SHA-256 checked against sha256 */
} dc_shard;

typedef struct dc_manifest {
    char *source;
    int n;
    dc_shard *shards;
} dc_manifest;

/* *found = 0 (and an empty manifest) when the folder has none. */
int dc_manifest_load(const char *dir, dc_manifest *m, int *found, df_error *err);
int dc_manifest_save(const char *dir, const dc_manifest *m, df_error *err);
void dc_manifest_free(dc_manifest *m);
dc_shard *dc_manifest_find(const dc_manifest *m, const char *name);
/* The hole holding all of [off, off+len): its index; -1 when the range touches no hole; -2 when it touches
 * one without lying inside it. */
int dc_shard_hole(const dc_shard *s, uint64_t off, uint64_t len);

/* Writes a whole file atomically (temp in the same folder, fsync, rename, folder fsync); pad zero bytes
 * come first. The error names path and says "disk full" for ENOSPC/EFBIG. */
int dc_write_atomic(const char *path, uint64_t pad, const void *data, size_t len, df_error *err);

typedef struct dcache dcache;

#define DC_ENV_CAP "DELTAFIN_CACHE_MAX_GB"
#define DC_ENV_RESERVE "DELTAFIN_CACHE_RESERVE_GB"
#define DC_DEFAULT_RESERVE 1000000000ull   /* bytes kept free by caching while serving */

/* min_free: refuse to write an entry that would leave less than this many bytes free. */
int dcache_open(dcache **out, const char *dir, uint64_t min_free, df_error *err);
/* The reserve serving keeps free: $DELTAFIN_CACHE_RESERVE_GB, else DC_DEFAULT_RESERVE. */
uint64_t dcache_default_reserve(void);
void dcache_free(dcache *c);
char *dcache_entry_path(const dcache *c, const char *shard, dc_span e);
int dcache_has(const dcache *c, const char *shard, dc_span e);
/* Reads [off, off+len) (inside entry e) into dst under the placement rule of io.h, O_DIRECT when the file
 * system allows, and verifies the entry's checksum: DF_EFORMAT ("corrupt") on a mismatch. */
int dcache_read(dcache *c, const char *shard, dc_span e, uint64_t off, uint64_t len, uint8_t *dst, const char *what,
                df_error *err);
/* The whole of entry e (e.len bytes) into dst, verified like dcache_read. */
int dcache_load(dcache *c, const char *shard, dc_span e, uint8_t *dst, const char *what, df_error *err);
/* Deletes entry e (a corrupt one, before fetching it again). */
void dcache_remove(dcache *c, const char *shard, dc_span e);
/* Publishes entry e with its e.len bytes. */
int dcache_put(dcache *c, const char *shard, dc_span e, const uint8_t *data, const char *what, df_error *err);
/* Removes every entry of a shard (once the shard itself is complete). */
void dcache_drop_shard(dcache *c, const char *shard);
/* Entries and bytes cached for a shard. */
void dcache_shard_usage(const dcache *c, const char *shard, uint64_t *entries, uint64_t *bytes);

#endif
