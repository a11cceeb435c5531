/* test_install_job.c — the install job (install/install_job.h) driven through its API against the test
 * server serving tests/fixtures: dry-run plans for the spine, one layer and everything, checked against
 * sums taken from the fixture's own header (read here with jansson, not through the fetch plan); a spine
 * install then a complete one (progress reaching exactly the planned bytes, the shard byte-identical); a
 * corrupt cache entry reported through the warning callback and fetched again; the disk check; refused
 * options; and the expert list `bench fetch` uses. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "install/dcache.h"
#include "install/install_job.h"
#include "remote_server.h"
#include "test.h"

#define FIX "kl-mxfp4"
#define SHARD "tests/fixtures/" FIX "/model.safetensors"

/* The fixture shard as the tests' reference: its bytes, and per routed-expert tensor its layer and range. */
typedef struct ref_tensor {
    int layer, expert;
    uint64_t off, len;       /* absolute in the file */
} ref_tensor;

typedef struct ref {
    uint8_t *file;
    size_t size;
    ref_tensor *t;
    int n;
} ref;

static int ref_load(ref *R) {
    df_error err;
    memset(R, 0, sizeof *R);
    R->file = (uint8_t *)df_read_file(SHARD, &R->size, &err);
    if (!R->file || R->size < 8) return 0;
    uint64_t hl;
    memcpy(&hl, R->file, 8);
    json_t *h = json_loadb((const char *)R->file + 8, (size_t)hl, 0, NULL);
    if (!h) return 0;
    R->t = xcalloc(json_object_size(h) + 1, sizeof *R->t);
    const char *k;
    json_t *v;
    json_object_foreach(h, k, v) {
        int layer, expert, used = 0;
        if (sscanf(k, "model.layers.%d.block_sparse_moe.experts.%d.w%*d.%n", &layer, &expert, &used) != 2 || !used)
            continue;
        json_t *o = json_object_get(v, "data_offsets");
        uint64_t a = (uint64_t)json_integer_value(json_array_get(o, 0));
        uint64_t b = (uint64_t)json_integer_value(json_array_get(o, 1));
        R->t[R->n++] = (ref_tensor){layer, expert, 8 + hl + a, b - a};
    }
    json_decref(h);
    return R->n > 0;
}

/* Bytes and distinct experts of the routed-expert tensors in the layer (-1: all layers). */
static uint64_t ref_expert_bytes(const ref *R, int layer, int *experts) {
    uint64_t b = 0;
    int n = 0;
    for (int i = 0; i < R->n; i++) {
        if (layer >= 0 && R->t[i].layer != layer) continue;
        b += R->t[i].len;
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = R->t[k].layer == R->t[i].layer && R->t[k].expert == R->t[i].expert;
        n += !seen;
    }
    if (experts) *experts = n;
    return b;
}

/* Whether the file at path equals the fixture outside the expert tensors (all of it: experts too). */
static int same_as_fixture(const ref *R, const char *path, int experts) {
    size_t n;
    df_error err;
    uint8_t *got = (uint8_t *)df_read_file(path, &n, &err);
    if (!got || n != R->size) return free(got), 0;
    if (!experts)
        for (int i = 0; i < R->n; i++) memcpy(got + R->t[i].off, R->file + R->t[i].off, R->t[i].len);
    int same = !memcmp(got, R->file, n);
    free(got);
    return same;
}

typedef struct events_seen {
    int plans, progress, finals, warnings;
    install_plan plan;
    uint64_t last_done, last_total;
    int monotonic;
    char warning[1200];
} events_seen;

static void on_plan(void *ctx, const install_plan *p) {
    events_seen *e = ctx;
    e->plans++;
    e->plan = *p;
}

static void on_progress(void *ctx, uint64_t done, uint64_t total, int final) {
    events_seen *e = ctx;
    if (done < e->last_done || total < e->last_total || done > total) e->monotonic = 0;
    e->progress++;
    e->finals += final;
    e->last_done = done;
    e->last_total = total;
}

static void on_warning(void *ctx, const char *msg) {
    events_seen *e = ctx;
    e->warnings++;
    snprintf(e->warning, sizeof e->warning, "%s", msg);
}

static int run(const char *from, const char *dir, install_what what, const unsigned char *layers, int dry,
               events_seen *e, install_result *res, df_error *err) {
    memset(e, 0, sizeof *e);
    e->monotonic = 1;
    install_opts o = {.from = from, .dir = dir, .what = what, .layers = layers, .n_layers = layers ? 8 : 0,
                      .dry_run = dry, .jobs = 4};
    install_events ev = {e, on_plan, on_progress, on_warning};
    memset(err, 0, sizeof *err);
    return install_job_run(&o, &ev, res, err);
}

static void test_plans(const ref *R, const char *from, const char *tmp) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/dry/sub", tmp);
    events_seen e;
    install_result res;
    df_error err;
    int n_all, n_l2;
    uint64_t all = ref_expert_bytes(R, -1, &n_all), l2 = ref_expert_bytes(R, 2, &n_l2), spine = R->size - all;

    int rc = run(from, dir, INSTALL_SPINE, NULL, 1, &e, &res, &err);
    const install_plan *p = &res.plan;
    CHECK(rc == DF_OK && e.plans == 1 && !memcmp(&e.plan, p, sizeof *p), "dry run of the spine: planned once (%s)",
          rc ? err.msg : "ok");
    CHECK(p->meta_files == 1 && p->n_shards == 1 && p->n_local == 0 && p->spine_shards == 1,
          "spine plan: config.json and one shard to get (%d files, %d shards, %d local, %d spines)", p->meta_files,
          p->n_shards, p->n_local, p->spine_shards);
    CHECK(p->spine_bytes == spine && p->expert_spans == 0 && p->expert_bytes == 0 && p->disk_bytes == spine,
          "spine plan: %llu non-expert bytes (header says %llu), no experts, disk = spine",
          (unsigned long long)p->spine_bytes, (unsigned long long)spine);
    CHECK(p->disk_known && p->disk_free > 0 && p->keep_free == 0, "spine plan: free disk found via a parent folder");
    struct stat sb;
    CHECK(stat(dir, &sb) != 0 && e.progress == 0 && res.net.requests > 0, "dry run: no folder made, no progress");

    unsigned char layers[8] = {0, 0, 1};
    rc = run(from, dir, INSTALL_LAYERS, layers, 1, &e, &res, &err);
    CHECK(rc == DF_OK && p->expert_spans == n_l2 && p->expert_bytes == l2 && p->disk_bytes == spine + l2,
          "layer 2 plan: %lld spans of %llu bytes (header: %d experts, %llu bytes), disk spine + those",
          (long long)p->expert_spans, (unsigned long long)p->expert_bytes, n_l2, (unsigned long long)l2);
    rc = run(from, dir, INSTALL_ALL, NULL, 1, &e, &res, &err);
    CHECK(rc == DF_OK && p->expert_spans == n_all && p->expert_bytes == all && p->disk_bytes == R->size &&
              p->spine_bytes == spine, "all plan: %lld spans of %llu bytes (header: %d, %llu), disk = the shard",
          (long long)p->expert_spans, (unsigned long long)p->expert_bytes, n_all, (unsigned long long)all);

    install_opts o = {.from = from, .dir = dir, .what = INSTALL_ALL, .dry_run = 1, .min_free_gb = 1e9};
    rc = install_job_run(&o, NULL, &res, &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "not starting") && strstr(err.msg, "--min-free") && p->disk_known,
          "a min-free the disk cannot keep refuses: %s", err.msg);
    o = (install_opts){.from = from, .dir = dir, .what = INSTALL_LAYERS};
    CHECK(install_job_run(&o, NULL, NULL, &err) == DF_EINVAL, "layers chosen but none given: %s", err.msg);
    o = (install_opts){.from = from, .dir = dir, .jobs = 65};
    CHECK(install_job_run(&o, NULL, NULL, &err) == DF_EINVAL, "jobs past 64: %s", err.msg);
    o = (install_opts){.from = from, .dir = NULL};
    CHECK(install_job_run(&o, NULL, NULL, &err) == DF_EINVAL, "no folder: %s", err.msg);
    char nope[300];
    snprintf(nope, sizeof nope, "%s-nothing-here", from);
    rc = run(nope, dir, INSTALL_SPINE, NULL, 0, &e, &res, &err);
    CHECK(rc == DF_EIO && strstr(err.msg, "config.json: not found") && e.plans == 0 && p->n_shards == 0,
          "a repository without config.json: refused before any plan: %s", err.msg);
    CHECK(stat(dir, &sb) != 0 || rmdir(dir) == 0, "refused runs wrote nothing");
}

static void test_installs(const ref *R, const server *s, const char *from, const char *tmp) {
    char dir[600], shard[700];
    snprintf(dir, sizeof dir, "%s/inst", tmp);
    snprintf(shard, sizeof shard, "%s/model.safetensors", dir);
    events_seen e;
    install_result res;
    df_error err;
    uint64_t all = ref_expert_bytes(R, -1, NULL), l1 = ref_expert_bytes(R, 1, NULL), spine = R->size - all;
    char buf[4096];
    ctl(s, "/_reset", buf);

    int rc = run(from, dir, INSTALL_SPINE, NULL, 0, &e, &res, &err);
    CHECK(rc == DF_OK && same_as_fixture(R, shard, 0), "spine install: every non-expert byte identical (%s)",
          rc ? err.msg : "ok");
    CHECK(e.finals == 1 && e.monotonic && e.last_done == spine && e.last_total == spine,
          "spine install: progress rises to exactly the planned %llu bytes (%llu of %llu)", (unsigned long long)spine,
          (unsigned long long)e.last_done, (unsigned long long)e.last_total);
    CHECK(res.net.bytes >= spine && (long)res.net.requests == stat_of(s, "requests"),
          "spine install: network counters match the server's (%llu requests)", (unsigned long long)res.net.requests);

    unsigned char layers[8] = {0, 1};
    rc = run(from, dir, INSTALL_LAYERS, layers, 0, &e, &res, &err);
    CHECK(rc == DF_OK && res.plan.spine_shards == 0 && res.plan.meta_files == 0 && e.last_done == l1,
          "layer 1 into the cache: no spine again, %llu expert bytes (%s)", (unsigned long long)e.last_done,
          rc ? err.msg : "ok");

    /* corrupt one cached entry: the complete install warns, fetches it again and still ends byte-identical */
    dcache *c;
    CHECK(dcache_open(&c, dir, 0, &err) == DF_OK, "cache opened");
    remote *r;
    install_span_list L;
    remote_opts ro = {.jobs = 2};
    rc = remote_open(&r, from, &ro, &err);
    if (!rc) rc = install_list_experts(r, &L, &err);
    int n_all;
    ref_expert_bytes(R, -1, &n_all);
    uint64_t sum = 0;
    int ordered = 1;
    for (int i = 0; !rc && i < L.n; i++) {
        sum += L.v[i].len;
        if (i && L.v[i].off < L.v[i - 1].off + L.v[i - 1].len) ordered = 0;
    }
    CHECK(!rc && L.n == n_all && sum == all && ordered && L.n_files == 1,
          "expert list: %d spans, %llu bytes, in order (header: %d, %llu)", L.n, (unsigned long long)sum, n_all,
          (unsigned long long)all);
    int victim = -1;
    for (int i = 0; !rc && i < L.n && victim < 0; i++)
        if (L.v[i].layer == 1) victim = i;
    dc_span vs = victim >= 0 ? (dc_span){L.v[victim].off, L.v[victim].len} : (dc_span){0, 0};
    char *ep = victim >= 0 ? dcache_entry_path(c, "model.safetensors", vs) : NULL;
    uint64_t victim_len = vs.len;
    FILE *f = ep ? fopen(ep, "r+b") : NULL;
    long at = (long)(vs.off % 4096 + vs.len / 2);
    int byte = f && !fseek(f, at, SEEK_SET) ? fgetc(f) : EOF;
    int flipped = byte != EOF && !fseek(f, at, SEEK_SET) && fputc(byte ^ 0x55, f) != EOF;
    if (f) fclose(f);
    CHECK(flipped, "one cached entry of layer 1 corrupted");
    free(ep);
    install_span_list_free(&L);
    remote_free(r);
    dcache_free(c);

    rc = run(from, dir, INSTALL_ALL, NULL, 0, &e, &res, &err);
    CHECK(rc == DF_OK && same_as_fixture(R, shard, 1), "complete install: the shard is byte-identical (%s)",
          rc ? err.msg : "ok");
    CHECK(e.warnings == 1 && strstr(e.warning, "corrupt") && strstr(e.warning, "fetching it again"),
          "the corrupt entry came through the warning callback: %s", e.warning);
    CHECK(res.plan.expert_bytes == all - l1 && e.finals == 1 && e.monotonic && e.last_done == e.last_total &&
              e.last_total == all - l1 + victim_len, "complete install: planned the %llu uncached expert bytes; the "
          "refetched entry joins the total; progress ends at %llu of %llu", (unsigned long long)(all - l1),
          (unsigned long long)e.last_done, (unsigned long long)e.last_total);
    size_t mn;
    char mp[800];
    snprintf(mp, sizeof mp, "%s/" DC_MANIFEST, dir);
    char *man = df_read_file(mp, &mn, &err);
    CHECK(man && strstr(man, "\"state\":\"complete\""), "manifest says complete");
    free(man);
    rc = run(from, dir, INSTALL_ALL, NULL, 0, &e, &res, &err);
    CHECK(rc == DF_OK && res.plan.spine_shards == 0 && res.plan.expert_spans == 0 && res.plan.disk_bytes == 0 &&
              e.last_total == 0, "a complete install plans nothing more");
}

int main(void) {
    char tmp[] = "/tmp/df_install_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    server s = {0};
    int up = server_start(&s, "tests/fixtures", tmp);
    CHECK(up, "test server started on 127.0.0.1");
    if (!up) return 1;
    ref R;
    CHECK(ref_load(&R), "fixture header read (%d expert tensors)", R.n);
    char from[256];
    snprintf(from, sizeof from, "%s/" FIX, s.base);
    test_plans(&R, from, tmp);
    test_installs(&R, &s, from, tmp);
    free(R.file);
    free(R.t);
    if (server_finish(&s, tmp)) return 1;
    TEST_EXIT();
}
