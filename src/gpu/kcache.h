/* kcache.h — the GPU kernels as the device runs them: the embedded CUDA source (kernels.cu, kernel_src.c), compiled
 * by NVRTC for the device's exact architecture, and a disk cache of the compiled images so that only the first
 * run on a machine pays for the compile. An entry is keyed by the source's hash, the architecture and the NVRTC
 * and driver versions; its header repeats the key and a checksum of the image, and an entry whose header, key or
 * checksum does not match is compiled again and replaced, never loaded. */
#ifndef DF_GPU_KCACHE_H
#define DF_GPU_KCACHE_H

#include <stddef.h>
#include <stdint.h>
#include "cuda_api.h"

/* The embedded source and the names of the kernels the backend looks up in it. */
const char *gpu_kernel_source(size_t *len);
extern const char *const gpu_kernel_names[];
extern const int gpu_kernel_count;

typedef struct kcache_key {
    uint64_t src_hash;
    int arch;                /* compute capability major * 10 + minor */
    int nvrtc_major, nvrtc_minor;
    int driver;              /* cuDriverGetVersion */
} kcache_key;

/* The cache folder: $DELTAFIN_KERNEL_CACHE, else $XDG_CACHE_HOME/deltafin, else ~/.cache/deltafin (caller
 * frees; NULL when none can be named). */
char *kcache_dir(void);
/* The file an entry of key k lives in under dir (caller frees). */
char *kcache_path(const char *dir, const kcache_key *k);
/* 0 with *img (caller frees) and *len when a valid entry for k is there; -1 when it is absent, truncated,
 * corrupt or made for another key. */
int kcache_load(const char *dir, const kcache_key *k, void **img, size_t *len);
/* Writes the entry atomically (a temporary file, then rename); creates dir. */
int kcache_store(const char *dir, const kcache_key *k, const void *img, size_t len, df_error *err);

/* Compiles src for sm_<arch> with NVRTC (loaded into a): *img (caller frees) is a cubin; the compiler's log goes to
 * *log (caller frees; may be NULL) either way. */
int kcache_compile(cu_api *a, const char *src, int arch, void **img, size_t *len, char **log, df_error *err);
/* The image for the embedded source on arch: from the cache, else compiled (NVRTC loaded on demand) and stored.
 * *compiled says which; a cache that cannot be written is not an error. */
int kcache_image(cu_api *a, int arch, void **img, size_t *len, int *compiled, df_error *err);

#endif
