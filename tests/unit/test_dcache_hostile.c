/* test_dcache_hostile.c — the install manifest and the expert disk cache against a hostile .deltafin folder:
 * an entry replaced by a FIFO, a device, a folder, a symlink or a file of the wrong size is refused at once
 * (never read through, never blocking); dropping a shard whose cache folder is a symlink removes the link,
 * not what it points at; a manifest that is a FIFO, or whose shard names climb out of the model folder, is
 * refused with a message. A hang fails through alarm() instead of stalling the run. */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "common/util.h"
#include "install/dcache.h"

static char tmpdir[64];

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "not ok - the disk cache blocked (alarm)\n";
    if (write(1, msg, sizeof msg - 1)) _exit(1);
    _exit(1);
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) fputs(text, f), fclose(f);
}

static void test_entries(void) {
    dcache *c;
    df_error err = {0};
    dcache_open(&c, tmpdir, 0, &err);
    dc_span e = {5000, 3000};
    uint8_t data[3000], back[3000 + 2 * 4096];
    for (int i = 0; i < 3000; i++) data[i] = (uint8_t)(i * 5 + 3);
    int put_ok = !dcache_put(c, "s.safetensors", e, data, "expert 1", &err);
    char *p = dcache_entry_path(c, "s.safetensors", e), *good = df_path_join(tmpdir, "good-entry");
    rename(p, good);   /* a valid entry's bytes, elsewhere: linked to, they must still not be read */
    const char *kinds[] = {"FIFO", "device", "folder", "symlink", "longer file", "shorter file"};
    int refused = 0, not_had = 0;
    alarm(30);
    for (int k = 0; k < 6; k++) {
        unlink(p);
        rmdir(p);
        int made = k == 0 ? !mkfifo(p, 0644) : k == 1 ? !symlink("/dev/zero", p) : k == 2 ? !mkdir(p, 0755)
                 : k == 3 ? !symlink(good, p) : 1;
        if (k >= 4) {
            FILE *f = fopen(p, "wb");
            size_t n = k == 4 ? 5000 % 4096 + 3000 + 16 + 100 : 100;
            uint8_t *z = xcalloc(1, n);
            made = f && fwrite(z, 1, n, f) == n;
            if (f) fclose(f);
            free(z);
        }
        memset(&err, 0, sizeof err);
        int r1 = dcache_read(c, "s.safetensors", e, e.off, e.len, back, "expert 1", &err);
        int ok1 = r1 && strstr(err.msg, p) != NULL;
        memset(&err, 0, sizeof err);
        int r2 = dcache_read(c, "s.safetensors", e, e.off + 10, 20, back, "expert 1", &err);
        memset(&err, 0, sizeof err);
        int r3 = dcache_load(c, "s.safetensors", e, back, "expert 1", &err);
        if (made && ok1 && r2 && r3) refused++;
        else printf("# %s as an entry: read %d (%s), part %d, load %d\n", kinds[k], r1, err.msg, r2, r3);
        not_had += !dcache_has(c, "s.safetensors", e);
    }
    alarm(0);
    CHECK(put_ok && refused == 6 && not_had == 6, "an entry that is a FIFO, device, folder, symlink or of the wrong "
          "size is refused at once by read, partial read and load (%d of 6), and not counted as cached", refused);
    unlink(p);
    rmdir(p);
    free(p);

    /* a shard's cache folder that is a symlink to somewhere else */
    char *outside = df_path_join(tmpdir, "outside"), *victim = df_path_join(tmpdir, "outside/victim");
    char *shard_dir = df_path_join(tmpdir, ".deltafin/cache/t.safetensors");
    mkdir(outside, 0755);
    put(victim, "precious");
    int linked = !symlink(outside, shard_dir);
    dcache_drop_shard(c, "t.safetensors");
    struct stat sb;
    CHECK(linked && !stat(victim, &sb) && sb.st_size == 8 && lstat(shard_dir, &sb),
          "dropping a shard whose cache folder is a symlink removes the link, not the files it points at");
    unlink(victim);
    rmdir(outside);
    unlink(good);
    free(good), free(outside), free(victim), free(shard_dir);
    dcache_drop_shard(c, "s.safetensors");
    dcache_free(c);
}

static void test_manifest(void) {
    char *dir = df_path_join(tmpdir, ".deltafin"), *path = df_path_join(tmpdir, DC_MANIFEST);
    mkdir(dir, 0755);
    const char *names[] = {"../x.safetensors", "/etc/passwd", "a/../../b", ".", "..", "a/./b", "", "a//b"};
    int refused = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"version\":1,\"shards\":[{\"name\":\"%s\",\"size\":10,\"state\":\"pending\","
                 "\"holes\":[]}]}", names[i]);
        put(path, text);
        dc_manifest m;
        int found = 0;
        df_error err = {0};
        int rc = dc_manifest_load(tmpdir, &m, &found, &err);
        if (rc && strstr(err.msg, DC_MANIFEST)) refused++;
        else printf("# shard name '%s' accepted (%s)\n", names[i], err.msg);
        if (!rc) dc_manifest_free(&m);
    }
    CHECK(refused == (int)(sizeof names / sizeof *names), "%d manifests whose shard names climb out of the model "
          "folder (.., absolute, ., empty parts) are refused naming the manifest", refused);
    put(path, "{\"version\":1,\"shards\":[{\"name\":\"sub/m.safetensors\",\"size\":10,\"state\":\"pending\","
              "\"holes\":[]}]}");
    dc_manifest m;
    int found = 0;
    df_error err = {0};
    int rc = dc_manifest_load(tmpdir, &m, &found, &err);
    CHECK(!rc && m.n == 1, "a shard in a subfolder is still fine (%s)", err.msg);
    if (!rc) dc_manifest_free(&m);
    unlink(path);
    alarm(30);
    int fifo = !mkfifo(path, 0644);
    rc = dc_manifest_load(tmpdir, &m, &found, &err);
    alarm(0);
    CHECK(fifo && rc && strstr(err.msg, "not a regular file"), "a FIFO as the manifest is refused at once: %s",
          err.msg);
    unlink(path);
    free(path);
    free(dir);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_dch_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_entries();
    test_manifest();
    char *p = df_path_join(tmpdir, ".deltafin/cache");
    rmdir(p);
    free(p);
    p = df_path_join(tmpdir, ".deltafin");
    rmdir(p);
    free(p);
    rmdir(tmpdir);
    TEST_EXIT();
}
