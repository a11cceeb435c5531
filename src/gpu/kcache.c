/* kcache.c — compiling the embedded kernels with NVRTC and the disk cache of compiled images (kcache.h). An
 * entry: the header below (magic, format, the key, image length, XXH64 of the image), then the image. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kcache.h"
#include "common/hash.h"
#include "common/util.h"

#define KCACHE_MAGIC "DFKCUBIN"
#define KCACHE_FORMAT 1u
#define KCACHE_MAX_IMAGE (256u << 20)

typedef struct {
    char magic[8];
    uint32_t format;
    int32_t arch, nvrtc_major, nvrtc_minor, driver;
    uint32_t pad;
    uint64_t src_hash;
    uint64_t len;
    uint64_t checksum;
} kcache_header;

char *kcache_dir(void) {
    const char *e = getenv("DELTAFIN_KERNEL_CACHE");
    if (e && *e) return xstrdup(e);
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) return df_path_join(e, "deltafin");
    e = getenv("HOME");
    if (e && *e) return df_path_join(e, ".cache/deltafin");
    return NULL;
}

static uint64_t key_hash(const kcache_key *k) {
    int32_t v[5] = {k->arch, k->nvrtc_major, k->nvrtc_minor, k->driver, (int32_t)KCACHE_FORMAT};
    return df_hash64(v, sizeof v, k->src_hash);
}

char *kcache_path(const char *dir, const kcache_key *k) {
    char name[96];
    snprintf(name, sizeof name, "kernels-sm%d-%016llx.cubin", k->arch, (unsigned long long)key_hash(k));
    return df_path_join(dir, name);
}

int kcache_load(const char *dir, const kcache_key *k, void **img, size_t *len) {
    char *path = kcache_path(dir, k);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0) return -1;
    kcache_header h;
    struct stat sb;
    int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && read(fd, &h, sizeof h) == (ssize_t)sizeof h &&
             !memcmp(h.magic, KCACHE_MAGIC, 8) && h.format == KCACHE_FORMAT && h.arch == k->arch &&
             h.nvrtc_major == k->nvrtc_major && h.nvrtc_minor == k->nvrtc_minor && h.driver == k->driver &&
             h.src_hash == k->src_hash && h.len > 0 && h.len <= KCACHE_MAX_IMAGE &&
             (uint64_t)sb.st_size == sizeof h + h.len;
    void *buf = NULL;
    if (ok) {
        buf = xmalloc(h.len);
        size_t got = 0;
        while (got < h.len) {
            ssize_t r = read(fd, (char *)buf + got, h.len - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        ok = got == h.len && df_hash64(buf, h.len, 0) == h.checksum;
    }
    close(fd);
    if (!ok) {
        free(buf);
        return -1;
    }
    *img = buf;
    *len = h.len;
    return 0;
}

int kcache_store(const char *dir, const kcache_key *k, const void *img, size_t len, df_error *err) {
    if (df_mkdir_p(dir, err)) return DF_EIO;
    kcache_header h = {{0}, KCACHE_FORMAT, k->arch, k->nvrtc_major, k->nvrtc_minor, k->driver, 0, k->src_hash,
                       len, df_hash64(img, len, 0)};
    memcpy(h.magic, KCACHE_MAGIC, 8);
    char *path = kcache_path(dir, k);
    size_t tl = strlen(path) + 32;
    char *tmp = xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = DF_OK;
    if (fd < 0 || write(fd, &h, sizeof h) != (ssize_t)sizeof h || write(fd, img, len) != (ssize_t)len ||
        fsync(fd) || close(fd) || rename(tmp, path)) {
        df_error_set(err, DF_EIO, "kernel cache %s: cannot write it (%s)", path, strerror(errno));
        if (fd >= 0) close(fd);
        unlink(tmp);
        rc = DF_EIO;
    }
    free(tmp);
    free(path);
    return rc;
}

int kcache_compile(cu_api *a, const char *src, int arch, void **img, size_t *len, char **log, df_error *err) {
    if (log) *log = NULL;
    nvrtcProgram p;
    nvrtcResult r = a->nvrtcCreateProgram(&p, src, "deltafin_kernels.cu", 0, NULL, NULL);
    if (r) {
        df_error_set(err, DF_EUNSUPPORTED, "NVRTC cannot take the kernels: %s", a->nvrtcGetErrorString(r));
        return DF_EUNSUPPORTED;
    }
    char opt_arch[32];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=sm_%d", arch);
    const char *opts[] = {opt_arch, "--std=c++17", "-default-device", "--extra-device-vectorization"};
    r = a->nvrtcCompileProgram(p, 4, opts);
    size_t ln = 0;
    if (log && a->nvrtcGetProgramLogSize(p, &ln) == 0 && ln > 1) {
        *log = xmalloc(ln);
        a->nvrtcGetProgramLog(p, *log);
    }
    int rc = DF_OK;
    if (r) {
        df_error_set(err, DF_EUNSUPPORTED, "NVRTC could not compile the kernels for sm_%d: %s", arch,
                     a->nvrtcGetErrorString(r));
        rc = DF_EUNSUPPORTED;
    } else if (a->nvrtcGetCUBINSize(p, len) || !*len) {
        df_error_set(err, DF_EUNSUPPORTED, "NVRTC gave no sm_%d image", arch);
        rc = DF_EUNSUPPORTED;
    } else {
        *img = xmalloc(*len);
        a->nvrtcGetCUBIN(p, *img);
    }
    a->nvrtcDestroyProgram(&p);
    return rc;
}

int kcache_image(cu_api *a, int arch, void **img, size_t *len, int *compiled, df_error *err) {
    size_t n;
    const char *src = gpu_kernel_source(&n);
    *compiled = 0;
    int rc = cu_api_load_nvrtc(a, err);
    if (rc) return rc;
    kcache_key k = {df_hash64(src, n, 0), arch, a->nvrtc_major, a->nvrtc_minor, a->driver_version};
    char *dir = kcache_dir();
    if (dir && kcache_load(dir, &k, img, len) == 0) {
        free(dir);
        return DF_OK;
    }
    char *log = NULL;
    rc = kcache_compile(a, src, arch, img, len, &log, err);
    if (rc && log) {
        size_t m = strlen(err->msg);
        snprintf(err->msg + m, sizeof err->msg - m, ":\n%.800s", log);
    }
    free(log);
    if (!rc) {
        *compiled = 1;
        df_error e = {0};
        if (dir) kcache_store(dir, &k, *img, *len, &e);
    }
    free(dir);
    return rc;
}
