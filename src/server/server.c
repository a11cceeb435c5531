/* server.c — the server's life cycle: load the model and tokenizer, start the worker and the HTTP daemon,
 * and tear everything down in the reverse order. */
#include <microhttpd.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/srv_internal.h"

void srv_opts_default(srv_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->queue = 16;
    o->max_tokens = 4096;
    o->keepalive_s = 5.0;
    o->max_body = 16u << 20;
}

/* The model's name: its folder's base name ("default" for models/default). */
static char *model_id_of(const char *dir) {
    char *real = realpath(dir, NULL);
    const char *p = real ? real : dir;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/') b--;
    char *id = xmalloc(n - b + 1);
    memcpy(id, p + b, n - b);
    id[n - b] = 0;
    free(real);
    return id;
}

static void srv_free(srv *s) {
    if (s->sess) df_session_free(s->sess);
    if (s->eng) df_engine_free(s->eng);
    if (s->tok) tokenizer_free(s->tok);
    tok_ids_free(&s->hist);
    grammar_vocab_free(s->gvocab);
    free(s->logits);
    free(s->model_id);
    metrics_free(&s->m);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int srv_start(srv **out, const srv_opts *o, df_error *err) {
    *out = NULL;
    if (o->queue < 0 || o->queue > 4096 || o->max_tokens < 1 || o->keepalive_s <= 0 || o->max_body < 1024) {
        df_error_set(err, DF_EINVAL, "serve: --queue must be 0..4096, --max-tokens at least 1");
        return DF_EINVAL;
    }
    srv *s = xcalloc(1, sizeof *s);
    s->o = *o;
    s->listen_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    metrics_init(&s->m);
    s->started = (long long)time(NULL);
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    if (o->engine) eo = *o->engine;
    eo.model_dir = o->model_dir;
    eo.n_threads = o->n_threads;
    int rc = df_engine_open(&s->eng, &eo, err);
    if (!rc) rc = df_session_init(&s->sess, s->eng, err);
    if (!rc) rc = tokenizer_load_dir(&s->tok, o->model_dir, err);
    if (rc) {
        srv_free(s);
        return rc;
    }
    df_error ce = {0};
    s->has_chat = chat_detect_format(s->tok, &s->fmt, &ce) == DF_OK;
    s->info = df_engine_info(s->eng);
    s->model_id = model_id_of(o->model_dir);
    s->logits = xmalloc((size_t)s->info->vocab_size * sizeof *s->logits);
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        df_error_set(err, DF_EIO, "serve: cannot start the generation thread");
        srv_free(s);
        return DF_EIO;
    }
    s->worker_started = 1;
    rc = http_start(s, err);
    if (rc) {
        srv_stop(s);
        return rc;
    }
    *out = s;
    return DF_OK;
}

int srv_port(const srv *s) { return s->port; }
const char *srv_model_id(const srv *s) { return s->model_id; }

void srv_stop(srv *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    if (s->running) atomic_store(&s->running->cancel, 1);
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    if (s->mhd) MHD_stop_daemon(s->mhd);   /* also closes the listening socket it was given */
    else if (s->listen_fd >= 0) close(s->listen_fd);
    srv_free(s);
}
