/* server.h — `deltafin serve`: an OpenAI-compatible HTTP server (libmicrohttpd) over one engine. Requests
 * are validated and tokenised on their connection's thread, then run one at a time by a single generation
 * worker behind a bounded FIFO queue. */
#ifndef DF_SERVER_H
#define DF_SERVER_H

#include <stddef.h>
#include "deltafin.h"
#include "sample/spec.h"

typedef struct srv_opts {
    const char *model_dir;
    const char *host;         /* default 127.0.0.1 */
    int port;                 /* 0 = any free port (see srv_port) */
    const char *api_key;      /* NULL = no authentication */
    int queue;                /* requests that may wait behind the running one (default 16) */
    int max_tokens;           /* cap and default for a request's max_tokens (default 4096) */
    int n_threads;            /* engine threads; 0 = all cores */
    double keepalive_s;       /* SSE comment while nothing else is sent (default 5 s) */
    size_t max_body;          /* request body limit in bytes (default 16 MiB) */
    const df_engine_opts *engine;   /* storage options etc. (model_dir, n_threads above win); NULL = defaults */
    const spec_opts *spec;    /* speculative decoding; NULL = the defaults (auto, n-gram drafts) */
} srv_opts;

void srv_opts_default(srv_opts *o);

typedef struct srv srv;

/* Loads the model and tokenizer, binds, and starts serving in background threads. */
int srv_start(srv **out, const srv_opts *o, df_error *err);
int srv_port(const srv *s);
const char *srv_model_id(const srv *s);
/* Stops accepting, cancels running and queued work, joins every thread and frees. */
void srv_stop(srv *s);

#endif
