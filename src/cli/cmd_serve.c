/* cmd_serve.c — `deltafin serve`: parses flags, starts the server, and waits for SIGINT/SIGTERM. The
 * signals are blocked in every thread and taken synchronously with sigwait, so no handler state is needed. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_opts.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    fprintf(f, "usage: deltafin serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--queue 16]\n"
               "                      [--max-tokens 4096] [--threads N] [--keepalive SECONDS] [--spec MODE]\n"
               "                      [--draft DIR] [storage options]\n"
               "  OpenAI-compatible server: POST /v1/chat/completions, /v1/completions; GET /v1/models, /health,\n"
               "  /metrics, and a chat page at /. --port 0 picks a free port. The API key may also be given in\n"
               "  DELTAFIN_API_KEY.\n"
               "speculative decoding:\n" CLI_SPEC_USAGE "storage options:\n" CLI_STORAGE_USAGE);
}

static int parse_int(const char *s, const char *flag, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "deltafin serve: %s needs an integer in %d..%d, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", 1, 0, 'm'},  {"host", 1, 0, 'H'},    {"port", 1, 0, 'p'},      {"api-key", 1, 0, 'k'},
        {"queue", 1, 0, 'q'},  {"max-tokens", 1, 0, 'n'}, {"threads", 1, 0, 't'}, {"keepalive", 1, 0, 'a'},
        {"help", 0, 0, 'h'},   CLI_STORAGE_LONGOPTS, CLI_SPEC_LONGOPTS, {0, 0, 0, 0}};
    srv_opts o;
    srv_opts_default(&o);
    o.api_key = getenv("DELTAFIN_API_KEY");
    if (o.api_key && !*o.api_key) o.api_key = NULL;
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    o.engine = &eo;
    spec_opts spo;
    spec_opts_default(&spo);
    o.spec = &spo;
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "m:p:t:h", longopts, NULL)) != -1) {
        int so = cli_storage_opt(c, optarg, &eo);
        if (so < 0) return 2;
        if (so) continue;
        int sp = cli_spec_opt(c, optarg, &spo);
        if (sp < 0) return 2;
        if (sp) continue;
        switch (c) {
        case 'm': o.model_dir = optarg; break;
        case 'H': o.host = optarg; break;
        case 'p': bad |= parse_int(optarg, "--port", 0, 65535, &o.port); break;
        case 'k': o.api_key = *optarg ? optarg : NULL; break;
        case 'q': bad |= parse_int(optarg, "--queue", 0, 4096, &o.queue); break;
        case 'n': bad |= parse_int(optarg, "--max-tokens", 1, 1 << 30, &o.max_tokens); break;
        case 't': bad |= parse_int(optarg, "--threads", 0, 4096, &o.n_threads); break;
        case 'a': {
            char *end;
            o.keepalive_s = strtod(optarg, &end);
            if (*end || !(o.keepalive_s > 0 && o.keepalive_s <= 3600)) {
                fprintf(stderr, "deltafin serve: --keepalive needs seconds in (0, 3600], got '%s'\n", optarg);
                bad = 1;
            }
            break;
        }
        case 'h': serve_usage(stdout); return 0;
        default: serve_usage(stderr); return 2;
        }
    }
    if (bad || optind < argc) {
        if (optind < argc) fprintf(stderr, "deltafin serve: unexpected argument '%s'\n", argv[optind]);
        serve_usage(stderr);
        return 2;
    }
    char defm[4096];
    if (!o.model_dir) o.model_dir = cli_default_model(defm, sizeof defm);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);   /* before any thread starts, so all inherit it */
    signal(SIGPIPE, SIG_IGN);
    df_error err = {0};
    srv *s = NULL;
    if (srv_start(&s, &o, &err)) {
        fprintf(stderr, "deltafin serve: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "deltafin serve: model '%s' listening on http://%s:%d/%s\n", srv_model_id(s),
            strchr(o.host, ':') ? "[::1]" : o.host, srv_port(s), o.api_key ? " (API key required)" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "deltafin serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(s);
    return 0;
}
