/* server.c — the server's life cycle: load the model and tokenizer, size the conversation slots and the
 * forward pass from the memory budget, start the worker and the HTTP daemon, and tear everything down in
 * the reverse order. */
#include <microhttpd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/prompt_cache.h"
#include "server/srv_internal.h"
#include "residency/budget.h"

/* Slots the default --parallel allows at most: past four streams the shared pass reads little less per
 * generated token, while each slot's state costs memory. */
#define SRV_DEFAULT_PARALLEL 4
/* A conversation length the default --parallel must leave room for in every slot. */
#define SRV_TYPICAL_TOKENS 4096

void srv_opts_default(srv_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->queue = 16;
    o->max_tokens = 4096;
    o->keepalive_s = 5.0;
    o->max_body = 16u << 20;
    o->read_timeout_s = 20.0;
    o->max_conns_per_client = 16;
    o->access_log = 1;
    o->prompt_cache = 1;
    o->prompt_cache_max = 4ull << 30;
    o->prompt_cache_min = 64;
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
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        df_session_free(s->slots[i].sess);
        free(s->slots[i].logits);
        spec_free(s->slots[i].spec);
        free(s->slots[i].rows);
    }
    free(s->slots);
    spec_free(s->spec);
    df_batch_free(s->batch);
    if (s->pcache) pcache_free(s->pcache);
    df_session_free(s->snap);
    if (s->eng) df_engine_free(s->eng);
    free(s->ranks);
    if (s->tok) tokenizer_free(s->tok);
    grammar_vocab_free(s->gvocab);
    free(s->model_id);
    metrics_free(&s->m);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cw_cv);
    pthread_cond_destroy(&s->cv_parse);
    pthread_mutex_destroy(&s->cw_mu);
    free(s);
}

/* The conversation slots, as many as --parallel asks or as the slot memory holds at a typical length, each
 * with its session, speculation and buffers; the engine's pass rows. */
static int slots_init(srv *s, df_error *err) {
    if (s->o.spec && s->o.spec->mode != SPEC_OFF) {
        spec_opts so = *s->o.spec;
        so.n_threads = s->o.n_threads;
        int rc = spec_init(&s->spec, &so, s->eng, err);
        if (rc) return rc;
    }
    uint64_t fixed = slot_bytes(s, 0);
    uint64_t typical = slot_bytes(s, DF_MIN(s->info->max_context, (int64_t)SRV_TYPICAL_TOKENS));
    int n = s->o.parallel;
    if (!n) n = (int)DF_MAX(1ull, DF_MIN((uint64_t)SRV_DEFAULT_PARALLEL, s->slot_mem / typical));
    if ((uint64_t)n * fixed > s->slot_mem) {
        df_error_set(err, DF_ENOMEM,
                     "serve: --parallel %d needs %llu MiB of conversation state before any token; the slot memory "
                     "is %llu MiB (raise --slot-mem or --mem, or lower --parallel)",
                     n, (unsigned long long)((n * fixed) >> 20), (unsigned long long)(s->slot_mem >> 20));
        return DF_ENOMEM;
    }
    s->n_slots = n;
    s->slots = xcalloc((size_t)n, sizeof *s->slots);
    for (int i = 0; i < n; i++) {
        srv_slot *sl = &s->slots[i];
        int rc = df_session_init(&sl->sess, s->eng, err);
        if (!rc && s->spec) rc = spec_init_like(&sl->spec, s->spec, err);
        if (rc) return rc;
        /* a slot goes back within a pass only to drop rejected drafts, so it keeps no more record than that */
        df_session_set_rollback_rows(sl->sess, sl->spec ? spec_draft_max(sl->spec) + 1 : 0);
        sl->logits = xmalloc((size_t)s->info->vocab_size * sizeof(float));
        if (sl->spec) sl->rows = xmalloc((size_t)(spec_draft_max(sl->spec) + 1) * s->info->vocab_size * sizeof(float));
        sl->reserved = fixed;
    }
    s->pass_rows = df_engine_pass_rows(s->eng);
    return df_batch_init(&s->batch, s->eng, err);
}

int srv_start(srv **out, const srv_opts *o, df_error *err) {
    *out = NULL;
    if (o->queue < 0 || o->queue > 4096 || o->max_tokens < 1 || o->keepalive_s <= 0 || o->max_body < 1024 ||
        o->parallel < 0 || o->parallel > 256 || o->read_timeout_s <= 0 || o->max_conns_per_client < 0) {
        df_error_set(err, DF_EINVAL, "serve: --queue must be 0..4096, --parallel 0..256, --max-tokens at least 1");
        return DF_EINVAL;
    }
    srv *s = xcalloc(1, sizeof *s);
    s->o = *o;
    s->listen_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_mutex_init(&s->cw_mu, NULL);
    pthread_cond_init(&s->cw_cv, NULL);
    pthread_cond_init(&s->cv_parse, NULL);
    metrics_init(&s->m);
    s->started = (long long)time(NULL);
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    if (o->engine) eo = *o->engine;
    eo.model_dir = o->model_dir;
    eo.n_threads = o->n_threads;
    /* conversation state comes out of the one memory budget: the engine gets the rest */
    uint64_t budget = eo.mem_budget ? eo.mem_budget : budget_default_bytes();
    s->slot_mem = o->slot_mem ? o->slot_mem : budget / 8;
    if (s->slot_mem >= budget) {
        df_error_set(err, DF_EINVAL, "serve: --slot-mem (%llu MiB) must be below the memory budget (%llu MiB)",
                     (unsigned long long)(s->slot_mem >> 20), (unsigned long long)(budget >> 20));
        srv_free(s);
        return DF_EINVAL;
    }
    eo.mem_budget = budget - s->slot_mem;
    int rc = df_engine_open(&s->eng, &eo, err);
    if (!rc) rc = tokenizer_load_dir(&s->tok, o->model_dir, err);
    if (!rc) {   /* read before the worker thread starts: asking the ranks is an evaluation call */
        s->n_ranks = df_engine_ranks(s->eng);
        s->ranks = xcalloc((size_t)s->n_ranks, sizeof *s->ranks);
        for (int r = 0; !rc && r < s->n_ranks; r++) rc = df_engine_rank_info(s->eng, r, &s->ranks[r], err);
    }
    if (!rc) {
        s->info = df_engine_info(s->eng);
        rc = slots_init(s, err);
    }
    if (!rc && o->prompt_cache) {
        char dir[4096];
        if (o->prompt_cache_dir) snprintf(dir, sizeof dir, "%s", o->prompt_cache_dir);
        else snprintf(dir, sizeof dir, "%s/.deltafin/kv", o->model_dir);
        df_error pe = {0};
        if (pcache_open(&s->pcache, dir, df_engine_fingerprint(s->eng), o->prompt_cache_max, o->prompt_cache_min,
                        &pe))
            fprintf(stderr, "deltafin serve: prompt cache off: %s\n", pe.msg);
        else rc = df_session_init(&s->snap, s->eng, err);
    }
    if (rc) {
        srv_free(s);
        return rc;
    }
    df_error ce = {0};
    s->has_chat = chat_detect_format(s->tok, &s->fmt, &ce) == DF_OK;
    for (int32_t id = 0; id < tokenizer_n_vocab(s->tok); id++) {
        size_t n = 0;
        if (tokenizer_token_bytes(s->tok, id, &n) && !tokenizer_is_special(s->tok, id))
            s->max_token_bytes = DF_MAX(s->max_token_bytes, n);
    }
    s->model_id = model_id_of(o->model_dir);
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
const char *srv_model_id(const srv *s) { return s->o.n_aliases ? s->o.aliases[0] : s->model_id; }
int srv_parallel(const srv *s) { return s->n_slots; }

void srv_stop(srv *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    http_stop(s);
    srv_free(s);
}
