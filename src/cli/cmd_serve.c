/* cmd_serve.c — `deltafin serve`: parses flags, starts the server, and waits for SIGINT/SIGTERM. The
 * signals are blocked in every thread and taken synchronously with sigwait, so no handler state is needed. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_opts.h"
#include "api/api.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: deltafin serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--api-key-file FILE] [--parallel N]\n"
            "                      [--queue 16] [--max-tokens 4096] [--threads N] [--keepalive SECONDS] [options]\n"
            "  OpenAI-compatible server: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize;\n"
            "  GET /v1/models, /props, /health, /metrics, and a chat page at /. --port 0 picks a free port.\n"
            "  --api-key-file FILE  the API key, read from FILE (or DELTAFIN_API_KEY), so that it does not show in\n"
            "                       the process list as --api-key KEY would\n"
            "  --parallel N      conversations decoded together (default: up to 4, as the slot memory allows)\n"
            "  --queue N         requests that may wait for a slot (default 16); 0: none, 429 when all are busy\n"
            "  --slot-mem SIZE   memory for all slots' conversation state, taken from --mem (default 1/8 of it)\n"
            "  --strict          refuse unknown request fields and model names other than the served ones\n"
            "  --alias NAME      a name /v1/models lists and --strict accepts (repeatable; default: the folder's)\n"
            "  --cors ORIGIN     let web pages from ORIGIN call the API (repeatable; * = any); others get 403\n"
            "  --allowed-host NAME  without an API key, answer requests for Host NAME too (repeatable; * = any);\n"
            "                    addresses, localhost and --host always are, other names get 403\n"
            "  --read-timeout S  a request's headers and body must arrive within S seconds (default 20)\n"
            "  --max-conns-per-client N  open connections per client address (default 16)\n"
            "  --prompt-cache DIR  where prompt states are kept across restarts (default MODEL/.deltafin/kv)\n"
            "  --prompt-cache-max SIZE  its size cap (default 4G); --no-prompt-cache turns it off\n"
            "  --no-access-log   no line per request on stderr\n"
            "speculative decoding (constrained answers, response_format or forced tool calls, never draft):\n"
            CLI_SPEC_USAGE "storage options:\n" CLI_STORAGE_USAGE);
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

static int parse_seconds(const char *s, const char *flag, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0 && v <= 3600)) {
        fprintf(stderr, "deltafin serve: %s needs seconds in (0, 3600], got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int add_name(const char **list, int *n, const char *v, const char *flag) {
    if (*n >= SRV_MAX_NAMES || !*v) {
        fprintf(stderr, "deltafin serve: %s takes a non-empty value, at most %d times\n", flag, SRV_MAX_NAMES);
        return -1;
    }
    list[(*n)++] = v;
    return 0;
}

/* The key from a file: its first line, without the line end. */
static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "deltafin serve: --api-key-file: cannot read '%s'\n", path);
        return NULL;
    }
    char buf[1024];
    char *line = fgets(buf, sizeof buf, f);
    fclose(f);
    size_t n = line ? strcspn(buf, "\r\n") : 0;
    if (!n) {
        fprintf(stderr, "deltafin serve: --api-key-file: '%s' holds no key on its first line\n", path);
        return NULL;
    }
    buf[n] = 0;
    return strdup(buf);
}

enum { O_PARALLEL = 0x2000, O_STRICT, O_ALIAS, O_CORS, O_HOSTS, O_KEYFILE, O_SLOTMEM, O_READTO, O_PERCLIENT, O_PCACHE,
       O_PCACHE_MAX, O_NO_PCACHE, O_NO_LOG };

int cmd_serve(int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", 1, 0, 'm'},  {"host", 1, 0, 'H'},    {"port", 1, 0, 'p'},      {"api-key", 1, 0, 'k'},
        {"queue", 1, 0, 'q'},  {"max-tokens", 1, 0, 'n'}, {"threads", 1, 0, 't'}, {"keepalive", 1, 0, 'a'},
        {"parallel", 1, 0, O_PARALLEL}, {"strict", 0, 0, O_STRICT}, {"alias", 1, 0, O_ALIAS},
        {"cors", 1, 0, O_CORS}, {"allowed-host", 1, 0, O_HOSTS}, {"api-key-file", 1, 0, O_KEYFILE}, {"slot-mem", 1, 0, O_SLOTMEM},
        {"read-timeout", 1, 0, O_READTO}, {"max-conns-per-client", 1, 0, O_PERCLIENT},
        {"prompt-cache", 1, 0, O_PCACHE}, {"prompt-cache-max", 1, 0, O_PCACHE_MAX},
        {"no-prompt-cache", 0, 0, O_NO_PCACHE}, {"no-access-log", 0, 0, O_NO_LOG},
        {"help", 0, 0, 'h'},   CLI_STORAGE_LONGOPTS, CLI_SPEC_LONGOPTS, {0, 0, 0, 0}};
    srv_opts o;
    srv_opts_default(&o);
    o.api_key = getenv("DELTAFIN_API_KEY");
    if (o.api_key && !*o.api_key) o.api_key = NULL;
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.heat = DF_HEAT_ON;
    o.engine = &eo;
    spec_opts spo;
    spec_opts_default(&spo);
    o.spec = &spo;
    o.api = api_routes();
    char *file_key = NULL;
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "m:p:t:h", longopts, NULL)) != -1) {
        int so = cli_storage_opt(c, optarg, &eo);
        if (so < 0) return 2;
        if (so) continue;
        int sp = cli_spec_opt(c, optarg, &spo);
        if (sp < 0) {
            free(file_key);
            return 2;
        }
        if (sp) continue;
        switch (c) {
        case 'm': o.model_dir = optarg; break;
        case 'H': o.host = optarg; break;
        case 'p': bad |= parse_int(optarg, "--port", 0, 65535, &o.port); break;
        case 'k': o.api_key = *optarg ? optarg : NULL; break;
        case O_KEYFILE:
            free(file_key);
            file_key = read_key_file(optarg);
            bad |= !file_key;
            o.api_key = file_key;
            break;
        case 'q': bad |= parse_int(optarg, "--queue", 0, 4096, &o.queue); break;
        case 'n': bad |= parse_int(optarg, "--max-tokens", 1, 1 << 30, &o.max_tokens); break;
        case 't': bad |= parse_int(optarg, "--threads", 0, 4096, &o.n_threads); break;
        case 'a': bad |= parse_seconds(optarg, "--keepalive", &o.keepalive_s); break;
        case O_PARALLEL: bad |= parse_int(optarg, "--parallel", 1, 256, &o.parallel); break;
        case O_STRICT: o.strict = 1; break;
        case O_ALIAS: bad |= add_name(o.aliases, &o.n_aliases, optarg, "--alias"); break;
        case O_CORS: bad |= add_name(o.cors, &o.n_cors, optarg, "--cors"); break;
        case O_HOSTS: bad |= add_name(o.hosts, &o.n_hosts, optarg, "--allowed-host"); break;
        case O_SLOTMEM:
            if (cli_parse_bytes(optarg, &o.slot_mem) || !o.slot_mem) {
                fprintf(stderr, "deltafin serve: --slot-mem needs a size such as 2G or 512M, got '%s'\n", optarg);
                bad = 1;
            }
            break;
        case O_READTO: bad |= parse_seconds(optarg, "--read-timeout", &o.read_timeout_s); break;
        case O_PERCLIENT: bad |= parse_int(optarg, "--max-conns-per-client", 1, 65535, &o.max_conns_per_client); break;
        case O_PCACHE: o.prompt_cache_dir = optarg; break;
        case O_PCACHE_MAX:
            if (cli_parse_bytes(optarg, &o.prompt_cache_max) || !o.prompt_cache_max) {
                fprintf(stderr, "deltafin serve: --prompt-cache-max needs a size such as 4G, got '%s'\n", optarg);
                bad = 1;
            }
            break;
        case O_NO_PCACHE: o.prompt_cache = 0; break;
        case O_NO_LOG: o.access_log = 0; break;
        case 'h': serve_usage(stdout); free(file_key); return 0;
        default: serve_usage(stderr); free(file_key); return 2;
        }
    }
    if (bad || optind < argc) {
        if (optind < argc) fprintf(stderr, "deltafin serve: unexpected argument '%s'\n", argv[optind]);
        serve_usage(stderr);
        free(file_key);
        return 2;
    }
    char defm[4096];
    if (!o.model_dir) o.model_dir = cli_default_model(defm, sizeof defm);
    int served;
    eo.model_dir = o.model_dir;
    eo.n_threads = o.n_threads;
    if (cli_rank_serve(&eo, "serve", &served)) {
        free(file_key);
        return served;
    }
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
        free(file_key);
        return 1;
    }
    fprintf(stderr, "deltafin serve: model '%s' listening on http://%s:%d/ with %d slot%s%s\n", srv_model_id(s),
            strchr(o.host, ':') ? "[::1]" : o.host, srv_port(s), srv_parallel(s), srv_parallel(s) == 1 ? "" : "s",
            o.api_key ? " (API key required)" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "deltafin serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(s);
    free(file_key);
    return 0;
}
