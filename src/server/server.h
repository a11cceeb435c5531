/* server.h — `deltafin serve`: an OpenAI-compatible HTTP server (libmicrohttpd) over one engine. Requests
 * are validated and tokenised on their connection's thread, then decoded by one worker that runs up to
 * `parallel` conversations together (one forward pass per step, continuous batching) behind a bounded
 * FIFO queue. */
#ifndef DF_SERVER_H
#define DF_SERVER_H

#include <stddef.h>
#include "deltafin.h"

#define SRV_MAX_NAMES 16

typedef struct srv_opts {
    const char *model_dir;
    const char *host;         /* default 127.0.0.1 */
    int port;                 /* 0 = any free port (see srv_port) */
    const char *api_key;      /* NULL = no authentication */
    int parallel;             /* conversation slots decoded together; 0 = from the memory (see srv_start) */
    int queue;                /* requests that may wait for a slot (default 16); 0 = none: 429 when busy */
    int max_tokens;           /* cap and default for a request's max_tokens (default 4096) */
    int n_threads;            /* engine threads; 0 = all cores */
    double keepalive_s;       /* SSE comment while nothing else is sent (default 5 s) */
    size_t max_body;          /* request body limit in bytes (default 16 MiB) */
    double read_timeout_s;    /* a request's headers and body must arrive within this (default 20 s) */
    int max_conns;            /* open connections in all (default parallel + queue + 64) */
    int max_conns_per_client; /* open connections per client address (default 16) */
    int strict;               /* refuse unknown fields and model names other than the served ones */
    const char *aliases[SRV_MAX_NAMES];   /* names /v1/models lists (default: the folder's name) */
    int n_aliases;
    const char *cors[SRV_MAX_NAMES];      /* origins allowed to call from a browser ("*" = any) */
    int n_cors;
    const char *hosts[SRV_MAX_NAMES];     /* Host names answered besides addresses, localhost and --host (no key) */
    int n_hosts;
    int access_log;           /* one line per request on stderr (default on) */
    uint64_t slot_mem;        /* bytes for all slots' conversation state; 0 = 1/8 of the memory budget */
    int prompt_cache;         /* keep prompt states under MODEL/.deltafin/kv across restarts (default on) */
    const char *prompt_cache_dir;   /* NULL = MODEL/.deltafin/kv */
    uint64_t prompt_cache_max;      /* bytes on disk (default 4 GiB) */
    int prompt_cache_min;     /* prompts shorter than this are not cached (default 64 tokens) */
    const df_engine_opts *engine;   /* storage options etc. (model_dir, n_threads above win); NULL = defaults */
    const struct spec_opts *spec;   /* speculative decoding (sample/spec.h); NULL = off */
    /* The wire APIs answered beside OpenAI's (api/api.h: api_routes()); NULL = OpenAI's alone. The caller hands
     * them in, so that the server knows their routes only as ids and reaches them through this table. */
    const struct http_api *api;
} srv_opts;

void srv_opts_default(srv_opts *o);

typedef struct srv srv;

/* Loads the model and tokenizer, binds, and starts serving in background threads. */
int srv_start(srv **out, const srv_opts *o, df_error *err);
int srv_port(const srv *s);
const char *srv_model_id(const srv *s);
int srv_parallel(const srv *s);
/* Stops accepting, cancels running and queued work, joins every thread and frees. */
void srv_stop(srv *s);

#endif
