/* test_harden.c — hostile inputs the engine must refuse cleanly: prompt files that once double-freed,
 * config integers past int range or sized to abort an allocation, FIFOs and devices in place of model
 * files, oversized JSON, extreme tensor shapes, bad remote indexes and shard headers. Each case is a
 * reproduction of a crash, hang or silent truncation; the check is the clean error that replaced it. */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "common/hash.h"
#include "common/prompt.h"
#include "common/util.h"
#include "model/config.h"
#include "install/dcache.h"
#include "install/fetch_plan.h"
#include "format/safetensors.h"

static char tmpdir[64];

static char *write_tmp(const char *name, const char *text) {
    char *p = df_path_join(tmpdir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
    return p;
}

static void test_prompts(void) {
    static const char *const bad[] = {"{\"prefill\":[],\"decode\":[]}", "{\"prefill\":[1],\"decode\":\"x\"}",
                                      "{\"prefill\":[1],\"decode\":[-1]}", "{\"prefill\":[1],\"decode\":[1.5]}",
                                      "[1,2]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = write_tmp("prompt.json", bad[i]);
        int32_t *pre = (int32_t *)1, *dec = (int32_t *)1;
        int np = -1, nd = -1;
        df_error err = {0};
        int rc = prompt_read_file(p, &pre, &np, &dec, &nd, &err);
        CHECK(rc && !pre && !dec && np == 0 && nd == 0 && strstr(err.msg, "prompt.json"),
              "prompt %s refused, nothing left to free: %s", bad[i], err.msg);
        free(pre);   /* what a caller does on its error path: must not double free */
        free(dec);
        free(p);
    }
    char *p = write_tmp("prompt.json", "{\"prefill\":[1,2],\"decode\":[3]}");
    int32_t *pre, *dec;
    int np, nd;
    df_error err = {0};
    int rc = prompt_read_file(p, &pre, &np, &dec, &nd, &err);
    CHECK(!rc && np == 2 && nd == 1 && pre[1] == 2 && dec[0] == 3, "a good prompt still reads");
    if (!rc) free(pre), free(dec);
    free(p);
}

#define CFG_HEAD "{\"model_type\":\"kimi_linear\",\"vocab_size\":64,\"intermediate_size\":32," \
                 "\"num_attention_heads\":2,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
                 "\"v_head_dim\":4,\"num_experts\":8,\"num_experts_per_token\":2,\"moe_intermediate_size\":8," \
                 "\"first_k_dense_replace\":1,"
#define CFG_LAC(heads) "\"linear_attn_config\":{\"num_heads\":" heads ",\"head_dim\":4,\"kda_layers\":[1,2,3]," \
                       "\"full_attn_layers\":[4]}}"

static void cfg_expect(const char *json, const char *needle, const char *name) {
    df_config c;
    df_error err = {0};
    int rc = config_parse(&c, json, "cfg.json", &err);
    CHECK(rc && strstr(err.msg, needle), "%s: %s", name, err.msg);
    if (!rc) config_free(&c);
}

static void test_config(void) {
    df_config c;
    df_error err = {0};
    int rc = config_parse(&c, CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":4," CFG_LAC("2"), "cfg.json", &err);
    CHECK(!rc && c.n_layers == 4 && c.kda_heads == 2, "the base config parses (%s)", err.msg);
    if (!rc) config_free(&c);
    cfg_expect(CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":-1," CFG_LAC("2"), "num_hidden_layers",
               "num_hidden_layers -1 refused before any allocation");
    cfg_expect(CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":2147483648," CFG_LAC("2"), "out of range",
               "num_hidden_layers 2^31 refused, not truncated");
    cfg_expect(CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":2147483647," CFG_LAC("2"), "num_hidden_layers",
               "num_hidden_layers 2^31-1 refused before any allocation");
    cfg_expect(CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":4," CFG_LAC("4294967297"), "num_heads",
               "num_heads 4294967297 refused (it once read as 1)");
    cfg_expect(CFG_HEAD "\"hidden_size\":16,\"num_hidden_layers\":4.0e300," CFG_LAC("2"), "must be an integer",
               "a real past int64 refused");
    cfg_expect(CFG_HEAD "\"hidden_size\":2147483647,\"num_hidden_layers\":4," CFG_LAC("2147483647"), "2^62",
               "widths whose parameter count overflows int64 refused");
}

static void test_files(void) {
    char *fifo = df_path_join(tmpdir, "fifo");
    mkfifo(fifo, 0600);
    df_error err = {0};
    size_t len;
    char *t = df_read_file_max(fifo, DF_JSON_FILE_MAX, &len, &err);
    CHECK(!t && strstr(err.msg, "not a regular file"), "a FIFO in place of a JSON file is refused at once: %s",
          err.msg);
    st_file f;
    memset(&err, 0, sizeof err);
    int rc = st_file_open(&f, fifo, &err);
    CHECK(rc && strstr(err.msg, "not a regular file"), "a FIFO in place of a shard is refused at once: %s", err.msg);
    memset(&err, 0, sizeof err);
    t = df_read_file_max("/dev/zero", DF_JSON_FILE_MAX, &len, &err);
    CHECK(!t && strstr(err.msg, "not a regular file"), "/dev/zero as a config is refused: %s", err.msg);
    unlink(fifo);
    free(fifo);
    /* a regular file past the cap */
    char *big = df_path_join(tmpdir, "big.json");
    int fd = open(big, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 3 << 20) == 0, "sparse 3 MiB file");
    close(fd);
    memset(&err, 0, sizeof err);
    t = df_read_file_max(big, 1 << 20, &len, &err);
    CHECK(!t && strstr(err.msg, "larger than 1 MiB"), "a file past its cap is refused: %s", err.msg);
    t = df_read_file_max(big, 4 << 20, &len, &err);
    CHECK(t && len == 3u << 20, "under the cap it reads whole");
    free(t);
    unlink(big);
    free(big);
}

/* extra: data-region bytes of the remote file after the header (negative: a file shorter than its header) */
static int header_err(const char *json, int64_t extra, df_error *err) {
    st_file f;
    memset(err, 0, sizeof *err);
    int rc = st_header_parse(&f, "remote.safetensors", json, strlen(json), (uint64_t)(8 + (int64_t)strlen(json) + extra),
                             err);
    if (!rc) st_file_close(&f);
    return rc;
}

static void test_headers(void) {
    df_error err;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"model.layers.1.block_sparse_moe.experts.0.w1.weight\":"
                     "{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}";
    uint64_t size = 8 + strlen(ok) + 12;
    fplan_layout L;
    int rc = fplan_layout_parse(&L, "s", ok, strlen(ok), size, &err);
    CHECK(!rc && L.n_holes == 1 && L.holes[0].layer == 1 && L.holes[0].span.off == 8 + strlen(ok) + 8 &&
          L.n_runs == 1 && L.runs[0].len == 8 + strlen(ok) + 8, "a good remote header gives its spine runs and holes");
    fplan_layout_free(&L);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 1000, &err) &&
          strstr(err.msg, "overlaps"), "overlapping tensors in a fetched header refused: %s", err.msg);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8]}}", 1000, &err) &&
          strstr(err.msg, "data_offsets"), "non-integer offsets refused: %s", err.msg);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",8]}}", 1000, &err) &&
          strstr(err.msg, "data_offsets"), "string offsets refused: %s", err.msg);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, &err) &&
          strstr(err.msg, "outside"), "offsets past the remote file's size refused: %s", err.msg);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,2],\"data_offsets\":[0,0]}}", 1000,
                     &err) && strstr(err.msg, "shape too large"),
          "a zero-sized tensor with extreme widths refused (no int64 overflow later): %s", err.msg);
    CHECK(header_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,68719476736,68719476736],\"data_offsets\":[0,0]}}", 1000,
                     &err) && strstr(err.msg, "shape too large"),
          "two widths of 2^36 whose product wraps 64 bits refused: %s", err.msg);
    CHECK(header_err("{}", -1, &err) && strstr(err.msg, "does not fit"), "header longer than the file refused: %s",
          err.msg);
}

static void test_index(void) {
    static const struct { const char *json, *needle, *name; } bad[] = {
        {"{\"weight_map\":{\"a\":1}}", "must be a shard file name", "a non-string weight_map value"},
        {"{\"weight_map\":{\"a\":null}}", "must be a shard file name", "a null weight_map value"},
        {"{\"weight_map\":{\"a\":{\"x\":1}}}", "must be a shard file name", "an object weight_map value"},
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "must be a shard file name", "a name leaving the folder"},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "must be a shard file name", "an absolute name"},
        {"{\"weight_map\":{\"a\":\"\"}}", "must be a shard file name", "an empty name"},
        {"{\"weight_map\":[]}", "no weight_map", "a weight_map that is no object"},
        {"{\"weight_map\":{}}", "no weight_map", "an empty weight_map"},
        {"{\"weight_map\":", "bad JSON", "truncated JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char **names = NULL;
        int n = 0;
        df_error err = {0};
        int rc = fplan_index_shards(bad[i].json, strlen(bad[i].json), "index.json", &names, &n, &err);
        CHECK(rc && strstr(err.msg, bad[i].needle) && strstr(err.msg, "index.json"), "index: %s refused: %s",
              bad[i].name, err.msg);
        for (int k = 0; k < n; k++) free(names[k]);
        free(names);
    }
    const char *good = "{\"weight_map\":{\"a\":\"s1\",\"b\":\"s2\",\"c\":\"s1\",\"d\":\"sub/s3\"}}";
    char **names = NULL;
    int n = 0;
    df_error err = {0};
    int rc = fplan_index_shards(good, strlen(good), "index.json", &names, &n, &err);
    CHECK(!rc && n == 3 && !strcmp(names[0], "s1") && !strcmp(names[2], "sub/s3"), "a good index: its shards once each");
    for (int k = 0; k < n; k++) free(names[k]);
    free(names);
}

static void test_hashes(void) {
    /* published vectors: XXH64 (seed 0) and SHA-256 (FIPS 180-2 examples) */
    CHECK(df_hash64("", 0, 0) == 0xef46db3751d8e999ull && df_hash64("abc", 3, 0) == 0x44bc2cf5ad770999ull &&
          df_hash64("Nobody inspects the spammish repetition", 39, 0) == 0xfbcea83c8a378bf1ull,
          "XXH64 matches its published vectors (short and 4-lane paths)");
    static const struct { const char *in, *hex; } v[] = {
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        df_sha256 s;
        char hex[65];
        df_sha256_init(&s);
        for (const char *c = v[i].in; *c; c++) df_sha256_update(&s, c, 1);   /* byte by byte: the buffering path */
        df_sha256_hex(&s, hex);
        CHECK(!strcmp(hex, v[i].hex), "SHA-256 of \"%.20s\" matches FIPS 180-2", v[i].in);
    }
    df_sha256 s;
    char hex[65];
    df_sha256_init(&s);
    static char a[1000];
    memset(a, 'a', sizeof a);
    for (int i = 0; i < 1000; i++) df_sha256_update(&s, a, sizeof a);
    df_sha256_hex(&s, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "SHA-256 of a million 'a' matches FIPS 180-2");
}

/* An entry with a flipped byte is never served: read and load fail with DF_EFORMAT naming it corrupt. */
static void test_dcache(void) {
    dcache *c;
    df_error err = {0};
    CHECK(!dcache_open(&c, tmpdir, 0, &err), "cache opens");
    dc_span e = {5000, 3000};
    uint8_t data[3000], back[3000 + 2 * 4096] = {0};
    for (int i = 0; i < 3000; i++) data[i] = (uint8_t)(i * 7 + 1);
    CHECK(!dcache_put(c, "s.safetensors", e, data, "expert 1", &err) && dcache_has(c, "s.safetensors", e),
          "an entry is written with its checksum (%s)", err.msg);
    CHECK(!dcache_read(c, "s.safetensors", e, e.off, e.len, back, "expert 1", &err) &&
          !memcmp(back + e.off % 4096, data, sizeof data), "a whole-entry read verifies and returns the bytes");
    memset(back, 0, sizeof back);
    CHECK(!dcache_read(c, "s.safetensors", e, e.off + 100, 50, back, "expert 1", &err) &&
          !memcmp(back + (e.off + 100) % 4096, data + 100, 50), "a partial read verifies and returns its bytes");
    char *p = dcache_entry_path(c, "s.safetensors", e);
    FILE *f = fopen(p, "r+b");
    fseek(f, (long)(e.off % 4096 + 1234), SEEK_SET);
    fputc(data[1234] ^ 0x10, f);
    fclose(f);
    memset(&err, 0, sizeof err);
    int rc = dcache_read(c, "s.safetensors", e, e.off, e.len, back, "expert 1", &err);
    CHECK(rc == DF_EFORMAT && strstr(err.msg, "corrupt") && strstr(err.msg, "expert 1"),
          "one flipped bit: the whole-entry read refuses it: %s", err.msg);
    rc = dcache_read(c, "s.safetensors", e, e.off, 10, back, "expert 1", &err);
    CHECK(rc == DF_EFORMAT, "a partial read of the corrupt entry refuses it too");
    rc = dcache_load(c, "s.safetensors", e, back, "expert 1", &err);
    CHECK(rc == DF_EFORMAT, "a load of the corrupt entry refuses it");
    dcache_remove(c, "s.safetensors", e);
    CHECK(!dcache_has(c, "s.safetensors", e), "dcache_remove deletes the entry");
    free(p);
    dcache_drop_shard(c, "s.safetensors");
    dcache_free(c);
    char *root = df_path_join(tmpdir, ".deltafin/cache");
    rmdir(root);
    free(root);
    root = df_path_join(tmpdir, ".deltafin");
    rmdir(root);
    free(root);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_harden_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_prompts();
    test_config();
    test_files();
    test_headers();
    test_index();
    test_hashes();
    test_dcache();
    rmdir(tmpdir);
    TEST_EXIT();
}
