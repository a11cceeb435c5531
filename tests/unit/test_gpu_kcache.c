/* test_gpu_kcache.c — the GPU backend's parts that need no GPU: every kernel the backend looks up is in the
 * embedded source; the kernel cache (a stored image comes back; a corrupt, truncated or other-version entry is
 * refused, so it is compiled again); the loader's absent paths (no driver, no NVRTC: a message naming the
 * library). Where NVRTC is installed (it needs no GPU), the embedded source compiles for sm_90. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"
#include "gpu/cuda_api.h"
#include "gpu/kcache.h"
#include "common/hash.h"
#include "common/util.h"

static void test_sources(void) {
    size_t n = 0;
    const char *src = gpu_kernel_source(&n);
    CHECK(src && n > 1000 && strlen(src) == n, "embedded kernel source present (%zu bytes)", n);
    int missing = 0;
    for (int i = 0; i < gpu_kernel_count; i++) {
        char pat[128];
        snprintf(pat, sizeof pat, " %s(", gpu_kernel_names[i]);
        const char *at = strstr(src, pat);
        /* the definition: extern "C" __global__ ... name( */
        int ok = at && strstr(src, "extern \"C\" __global__") && at > src;
        if (!ok) {
            printf("# kernel %s not in the embedded source\n", gpu_kernel_names[i]);
            missing++;
        }
    }
    CHECK(missing == 0, "all %d kernels the backend uses are defined in the embedded source", gpu_kernel_count);
}

static void test_cache(void) {
    char dir[] = "/tmp/df_kcache_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "temp dir");
    char sub[256];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    kcache_key k = {0x1234abcdULL, 90, 13, 0, 13000};
    uint8_t img[4096];
    for (size_t i = 0; i < sizeof img; i++) img[i] = (uint8_t)(i * 7 + 3);
    df_error err = {0};
    CHECK(kcache_store(sub, &k, img, sizeof img, &err) == 0, "store an entry (creating the folder) %s", err.msg);
    void *got = NULL;
    size_t len = 0;
    CHECK(kcache_load(sub, &k, &got, &len) == 0 && len == sizeof img && !memcmp(got, img, len),
          "the stored image comes back");
    free(got);
    kcache_key k2 = k;
    k2.nvrtc_minor = 1;
    CHECK(kcache_load(sub, &k2, &got, &len) != 0, "another NVRTC version misses");
    k2 = k;
    k2.driver = 13010;
    CHECK(kcache_load(sub, &k2, &got, &len) != 0, "another driver version misses");
    k2 = k;
    k2.arch = 89;
    CHECK(kcache_load(sub, &k2, &got, &len) != 0, "another architecture misses");
    k2 = k;
    k2.src_hash ^= 1;
    CHECK(kcache_load(sub, &k2, &got, &len) != 0, "another kernel source misses");
    /* a corrupt entry under the right name: one image byte flipped */
    char *path = kcache_path(sub, &k);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "open the entry");
    if (f) {
        fseek(f, -100, SEEK_END);
        int c = fgetc(f);
        fseek(f, -100, SEEK_END);
        fputc(c ^ 0x40, f);
        fclose(f);
    }
    CHECK(kcache_load(sub, &k, &got, &len) != 0, "a corrupt entry is refused (checksum)");
    CHECK(kcache_store(sub, &k, img, sizeof img, &err) == 0 && kcache_load(sub, &k, &got, &len) == 0,
          "rewritten, it loads again");
    free(got);
    CHECK(truncate(path, 200) == 0 && kcache_load(sub, &k, &got, &len) != 0, "a truncated entry is refused");
    /* a stale entry: a valid header of another key placed under this key's name */
    k2 = k;
    k2.nvrtc_major = 12;
    char *p2 = kcache_path(sub, &k2);
    CHECK(kcache_store(sub, &k2, img, sizeof img, &err) == 0 && rename(p2, path) == 0 &&
          kcache_load(sub, &k, &got, &len) != 0, "an entry made for another version is refused even under this name");
    free(p2);
    free(path);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "clean up");
    setenv("DELTAFIN_KERNEL_CACHE", "/x/y", 1);
    char *d = kcache_dir();
    CHECK(d && !strcmp(d, "/x/y"), "DELTAFIN_KERNEL_CACHE names the folder");
    free(d);
    unsetenv("DELTAFIN_KERNEL_CACHE");
    setenv("XDG_CACHE_HOME", "/c", 1);
    d = kcache_dir();
    CHECK(d && !strcmp(d, "/c/deltafin"), "else $XDG_CACHE_HOME/deltafin");
    free(d);
}

static void test_loader_absent(void) {
    cu_api a;
    df_error err = {0};
    setenv("DELTAFIN_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    int rc = cu_api_load_driver(&a, &err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err.msg, "no NVIDIA driver") && strstr(err.msg, "/nonexistent/libcuda.so.1"),
          "no driver: a message naming the library (%s)", err.msg);
    unsetenv("DELTAFIN_LIBCUDA");
    memset(&a, 0, sizeof a);
    setenv("DELTAFIN_LIBNVRTC", "/nonexistent/libnvrtc.so.13", 1);
    rc = cu_api_load_nvrtc(&a, &err);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err.msg, "no NVRTC"), "no NVRTC: a message naming it (%s)", err.msg);
    unsetenv("DELTAFIN_LIBNVRTC");
}

/* In a child process: NVRTC keeps allocations to the end of the process, which the leak checker of the
 * sanitizer build would count; the child reports by its exit status and leaves by _exit. */
static void test_compile(void) {
    cu_api a;
    df_error err = {0};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        memset(&a, 0, sizeof a);
        if (cu_api_load_nvrtc(&a, &err)) _exit(2);
        size_t n;
        const char *src = gpu_kernel_source(&n);
        void *img = NULL;
        size_t len = 0;
        char *log = NULL;
        double t0 = df_now();
        int rc = cu_api_load_nvrtc(&a, &err) || kcache_compile(&a, src, 90, &img, &len, &log, &err);
        if (log && *log) printf("# NVRTC log:\n%s\n", log);
        printf("# NVRTC %d.%d: %zu bytes in %.2f s%s%s\n", a.nvrtc_major, a.nvrtc_minor, len, df_now() - t0,
               rc ? ": " : "", rc ? err.msg : "");
        fflush(stdout);
        _exit(rc == 0 && len > 0 ? 0 : 1);
    }
    int st = 0;
    int done = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st);
    if (done && WEXITSTATUS(st) == 2) {
        SKIP("no NVRTC here", "the embedded kernels compile for sm_90");
        return;
    }
    CHECK(done && WEXITSTATUS(st) == 0, "the embedded kernels compile for sm_90 with NVRTC");
}

int main(void) {
    test_sources();
    test_cache();
    test_loader_absent();
    test_compile();
    TEST_EXIT();
}
