/* worker.c — the FIFO queue and the one generation worker. Only this thread touches the session, so the
 * engine sees one evaluation at a time. The session is kept between requests with `hist`, the exact tokens
 * it has consumed: a prompt that strictly extends hist only evaluates the new suffix (KDA state is
 * recurrent, so anything else starts from scratch). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/util.h"
#include "server/srv_internal.h"
#include "server/tools.h"

#define PREFILL_CHUNK 256   /* bounds activation memory of one prefill batch */

srv_job *job_new(srv *s) {
    srv_job *j = xcalloc(1, sizeof *j);
    j->refs = 1;
    atomic_init(&j->cancel, 0);
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(j->id, sizeof j->id, "%llx%06llx", (unsigned long long)s->started, (unsigned long long)n);
    j->created = (long long)time(NULL);
    return j;
}

static void job_free(srv_job *j) {
    tools_job_free(j);
    srv_request_free(&j->req);
    tok_ids_free(&j->prompt);
    pthread_cond_destroy(&j->cv);
    text_buf_free(&j->sse);
    text_buf_free(&j->content);
    text_buf_free(&j->reasoning);
    json_decref((json_t *)j->logprobs);
    free(j);
}

static void job_unref_locked(srv_job *j) {
    if (--j->refs == 0) job_free(j);
}

void job_release(srv *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

int job_enqueue(srv *s, srv_job *j, srv_err *err) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_err_set(err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        return -1;
    }
    if (s->n_queued >= s->o.queue) {
        pthread_mutex_unlock(&s->mu);
        srv_err_set(err, 429, "rate_limit_error", "server_busy", NULL,
                    "The server is busy: %d requests are already waiting. Retry later.", s->o.queue);
        return -1;
    }
    j->refs++;
    j->next = NULL;
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void job_cancel(srv *s, srv_job *j) {
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&s->mu);
    srv_job **pp = &s->q_head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {   /* still queued: drop it now */
        *pp = j->next;
        if (s->q_tail == j) s->q_tail = prev;
        s->n_queued--;
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        job_unref_locked(j);
    }
    pthread_mutex_unlock(&s->mu);
}

static int worker_step(void *ctx, int layer, int n_layers) {
    srv_job *j = ctx;
    return atomic_load(&j->cancel);
}

static void worker_snapshot_stats(srv *s) {
    df_stats st;
    df_engine_stats(s->eng, &st);
    pthread_mutex_lock(&s->m.mu);
    s->m.engine = st;
    pthread_mutex_unlock(&s->m.mu);
}

typedef struct worker_ctx {
    srv *s;
    srv_job *j;
} worker_ctx;

static int worker_on_event(void *ctx, const gen_event *ev) {
    worker_ctx *w = ctx;
    srv_job *j = w->j;
    j->n_gen++;
    if (j->req.stream) {
        text_buf chunk = {0};
        tools_sse_deltas(w->s, j, ev->final, &chunk);
        respond_sse_event(w->s, j, ev, &chunk);
        if (ev->final) respond_sse_end(w->s, j, &chunk);
        pthread_mutex_lock(&w->s->mu);
        text_buf_append(&j->sse, chunk.p, chunk.len);
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&w->s->mu);
        text_buf_free(&chunk);
    } else {
        respond_accumulate(w->s, j, ev);
    }
    return atomic_load(&j->cancel);
}

/* Brings the session to the end of j's prompt, reusing what it already holds. Leaves logits filled. */
static int worker_prefill(srv *s, srv_job *j, df_error *err) {
    const tok_ids *p = &j->prompt;
    size_t start = 0;
    if (s->hist.n && s->hist.n < p->n && !memcmp(s->hist.v, p->v, s->hist.n * sizeof(int32_t))) {
        start = s->hist.n;
    } else {
        df_session_reset(s->sess);
        s->hist.n = 0;
    }
    j->n_reused = (int)start;
    int rc = DF_OK;
    for (size_t at = start; at < p->n && !rc; at += PREFILL_CHUNK) {
        int n = (int)DF_MIN((size_t)PREFILL_CHUNK, p->n - at);
        rc = df_session_eval(s->sess, p->v + at, n, s->logits, 0, err);
        if (!rc)
            for (int i = 0; i < n; i++) tok_ids_push(&s->hist, p->v[at + i]);
    }
    if (rc) s->hist.n = 0;   /* a failed evaluation resets the session */
    return rc;
}

static void worker_run(srv *s, srv_job *j) {
    df_error err = {0};
    double t0 = df_now();
    df_session_set_step_callback(s->sess, worker_step, j);
    int rc = worker_prefill(s, j, &err);
    double t1 = df_now();
    gen_result res = {0};
    if (!rc) {
        gen_config cfg = {.tok = s->tok, .chat = j->chat, .fmt = s->fmt, .in_reasoning = j->in_reasoning,
                          .max_tokens = j->max_tokens, .eos_id = s->info->eos_id,
                          .stop = (const char *const *)j->req.stop, .n_stop = j->req.n_stop, .sp = j->req.sp};
        tools_gen_config(s, j, &cfg);
        worker_ctx w = {s, j};
        rc = gen_run(s->sess, &cfg, s->logits, s->info->vocab_size, worker_on_event, &w, &res, &err);
        j->finish = res.finish;
        if (res.finish == GEN_FINISH_CANCELLED && rc != DF_ECANCELLED) rc = DF_ECANCELLED;
        /* an engine error or cancel reset the session; the position check below catches that */
        for (int i = 0; i < res.n_evaluated; i++) tok_ids_push(&s->hist, res.ids.v[i]);
    }
    df_session_set_step_callback(s->sess, NULL, NULL);
    if (df_session_pos(s->sess) != (int64_t)s->hist.n) {   /* never reuse state we cannot account for */
        df_session_reset(s->sess);
        s->hist.n = 0;
    }
    double t2 = df_now();
    worker_snapshot_stats(s);
    pthread_mutex_lock(&s->m.mu);
    s->m.prompt_tokens += (uint64_t)(j->prompt.n - (size_t)j->n_reused);
    s->m.prompt_tokens_reused += (uint64_t)j->n_reused;
    s->m.generated_tokens += res.ids.n;
    s->m.prefill_s += t1 - t0;
    s->m.decode_s += t2 - t1;
    if (res.ids.n) s->m.last_s_per_token = (t2 - t1) / (double)res.ids.n;
    if (rc == DF_ECANCELLED) s->m.cancelled++;
    pthread_mutex_unlock(&s->m.mu);
    tok_ids_free(&res.ids);

    pthread_mutex_lock(&s->mu);
    if (rc && rc != DF_ECANCELLED) {
        j->failed = 1;
        srv_err_set(&j->err, 500, "server_error", "generation_failed", NULL, "Generation failed: %s", err.msg);
        if (j->req.stream) {
            text_buf b = {0};
            srv_err_json(&j->err, &b);
            text_buf_printf(&j->sse, "data: %s\n\ndata: [DONE]\n\n", b.p);
            text_buf_free(&b);
        }
    }
    if (rc == DF_ECANCELLED) j->failed = 1;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
}

void *worker_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stopping && !s->q_head) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->stopping) break;
        srv_job *j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        s->running = j;
        pthread_mutex_unlock(&s->mu);
        if (!atomic_load(&j->cancel)) {
            worker_run(s, j);
        } else {
            pthread_mutex_lock(&s->mu);
            j->done = 1;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_lock(&s->mu);
        s->running = NULL;
        job_unref_locked(j);
    }
    /* shutting down: whatever still waits is answered as failed */
    while (s->q_head) {
        srv_job *j = s->q_head;
        s->q_head = j->next;
        s->n_queued--;
        j->failed = 1;
        srv_err_set(&j->err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        job_unref_locked(j);
    }
    s->q_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
