/* cmd_fetch.c — `deltafin fetch --from URL -m DIR [--spine | --all | --layers 1-40,92]`: flags, the plan and
 * a progress display around the library's install job (install/install_job.h), which does the work. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/util.h"
#include "install/install_job.h"

#define FETCH_MAX_LAYERS 4096

typedef struct fetch_cli {
    install_opts o;
    unsigned char layers[FETCH_MAX_LAYERS];
    double t0, last;         /* progress display */
    int tty;
} fetch_cli;

static void fetch_usage(FILE *f) {
    fprintf(f, "usage: deltafin fetch --from URL -m DIR [--spine | --all | --layers 1-40,92] [--dry-run]\n"
               "                      [--min-free GB] [--jobs N] [--stall-timeout S]\n"
               "  --from URL        repository: org/name[@revision] (via $HF_ENDPOINT) or an http(s) URL of\n"
               "                    {endpoint}/{repo}/resolve/{revision}; $HF_TOKEN is sent as a bearer token\n"
               "  -m, --model DIR   install folder (created if needed)\n"
               "  --spine           config, tokenizer, index, shard headers and every non-expert tensor (default)\n"
               "  --all             also every routed expert: a complete install\n"
               "  --layers LIST     the spine plus the experts of these decoder layers (into the disk cache)\n"
               "  --dry-run         print what would be downloaded and the disk it needs\n"
               "  --min-free GB     refuse to start if it would leave less free disk than this (default 1)\n"
               "  --jobs N          parallel connections (default 8)\n");
}

/* A bar on a TTY, a plain line every few seconds otherwise. */
static void fetch_on_progress(void *ctx, uint64_t done, uint64_t total, int final) {
    fetch_cli *c = ctx;
    double now = df_now(), dt = now - c->t0;
    if (!final && now - c->last < (c->tty ? 0.2 : 5.0)) return;
    c->last = now;
    double rate = dt > 0 ? (double)done / dt : 0;
    double eta = rate > 0 ? (double)(total - DF_MIN(done, total)) / rate : 0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    if (c->tty) {
        char bar[31];
        int fill = (int)(pct * 30 / 100);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[30] = 0;
        fprintf(stderr, "\r\033[K[%s] %.2f/%.2f GiB %.1f MB/s ETA %.0f s", bar, (double)done / (1 << 30),
                (double)total / (1 << 30), rate / 1e6, eta);
        if (final) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "fetch: %llu of %llu bytes (%.0f%%), %.1f MB/s, ETA %.0f s\n", (unsigned long long)done,
                (unsigned long long)total, pct, rate / 1e6, eta);
    }
}

static void fetch_on_plan(void *ctx, const install_plan *p) {
    fetch_cli *c = ctx;
    printf("%s: %d metadata files to get; %d shards (%d local), spine of %d to fetch: %.3f GB; %lld expert spans "
           "to fetch: %.3f GB\n", c->o.dry_run ? "would fetch" : "fetching", p->meta_files, p->n_shards, p->n_local,
           p->spine_shards, (double)p->spine_bytes / 1e9, (long long)p->expert_spans, (double)p->expert_bytes / 1e9);
    if (p->disk_known)
        printf("disk: needs %.3f GB, %.3f GB free in %s, keeping at least %.3f GB free\n", (double)p->disk_bytes / 1e9,
               (double)p->disk_free / 1e9, c->o.dir, (double)p->keep_free / 1e9);
    fflush(stdout);
    c->t0 = df_now();
}

static void fetch_on_warning(void *ctx, const char *msg) { fprintf(stderr, "deltafin fetch: warning: %s\n", msg); }

static int fetch_parse_layers(fetch_cli *c, const char *spec) {
    const char *p = spec;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0 || a >= FETCH_MAX_LAYERS) return -1;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a || b >= FETCH_MAX_LAYERS) return -1;
            p = end;
        }
        for (long l = a; l <= b; l++) c->layers[l] = 1;
        c->o.what = INSTALL_LAYERS;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return c->o.what == INSTALL_LAYERS ? 0 : -1;
}

/* 0: go on; 1: --help answered; 2: bad usage. */
static int fetch_parse_args(fetch_cli *c, int argc, char **argv) {
    static const struct option lo[] = {
        {"from", 1, 0, 'f'},  {"model", 1, 0, 'm'},    {"spine", 0, 0, 's'}, {"all", 0, 0, 'a'},
        {"layers", 1, 0, 'l'}, {"dry-run", 0, 0, 'd'}, {"min-free", 1, 0, 'F'}, {"jobs", 1, 0, 'j'},
        {"stall-timeout", 1, 0, 'S'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    install_opts *o = &c->o;
    *o = (install_opts){.what = INSTALL_SPINE, .layers = c->layers, .n_layers = FETCH_MAX_LAYERS, .jobs = 8,
                        .min_free_gb = 1};
    int ch, spine = 0, all = 0, layers = 0;
    char *end;
    while ((ch = getopt_long(argc, argv, "m:j:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'f': o->from = optarg; break;
        case 'm': o->dir = optarg; break;
        case 's': spine = 1; break;
        case 'a': all = 1; break;
        case 'l':
            if (fetch_parse_layers(c, optarg)) {
                fprintf(stderr, "deltafin fetch: --layers '%s': expected a list like 1-40,92\n", optarg);
                return 2;
            }
            layers = 1;
            break;
        case 'd': o->dry_run = 1; break;
        case 'F':
            o->min_free_gb = strtod(optarg, &end);
            if (end == optarg || *end || !(o->min_free_gb >= 0 && o->min_free_gb <= 1e9)) return fetch_usage(stderr), 2;
            break;
        case 'j':
            o->jobs = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end || o->jobs < 1 || o->jobs > 64) return fetch_usage(stderr), 2;
            break;
        case 'S':
            o->stall_s = strtod(optarg, &end);
            if (end == optarg || *end || o->stall_s <= 0) return fetch_usage(stderr), 2;
            break;
        case 'h': fetch_usage(stdout); return 1;
        default: fetch_usage(stderr); return 2;
        }
    }
    if (!o->from || !o->dir || optind < argc || all + spine + layers > 1) {
        fetch_usage(stderr);
        return 2;
    }
    if (all) o->what = INSTALL_ALL;
    return 0;
}

int cmd_fetch(int argc, char **argv) {
    fetch_cli c;
    memset(&c, 0, sizeof c);
    int a = fetch_parse_args(&c, argc, argv);
    if (a) return a == 1 ? 0 : a;
    c.tty = isatty(STDERR_FILENO);
    install_events ev = {.ctx = &c, .plan = fetch_on_plan, .progress = fetch_on_progress,
                         .warning = fetch_on_warning};
    install_result res;
    df_error err = {0};
    double t0 = df_now();
    int rc = install_job_run(&c.o, &ev, &res, &err);
    if (!rc && !c.o.dry_run)
        printf("done: %llu bytes in %llu requests over %llu connections (%llu retries) in %.1f s\n",
               (unsigned long long)res.net.bytes, (unsigned long long)res.net.requests,
               (unsigned long long)res.net.connects, (unsigned long long)res.net.retries, df_now() - t0);
    if (rc) fprintf(stderr, "deltafin fetch: %s\n", err.msg);
    return rc ? 1 : 0;
}
