/* srv_internal.h — what the server's files share: the server context, jobs (one accepted generation
 * request, shared by its connection thread and the worker), metrics, and the JSON/SSE writers. */
#ifndef DF_SRV_INTERNAL_H
#define DF_SRV_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "sample/generate.h"
#include "sample/grammar.h"
#include "server/request.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

/* ---- metrics ---- */
#define SRV_N_STATUS 12
typedef struct srv_metrics {
    pthread_mutex_t mu;
    int status_code[SRV_N_STATUS];
    uint64_t status_count[SRV_N_STATUS];
    uint64_t prompt_tokens, prompt_tokens_reused, generated_tokens, cancelled;
    double prefill_s, decode_s, last_s_per_token;
    df_stats engine;   /* snapshot taken by the worker between evaluations */
} srv_metrics;

void metrics_init(srv_metrics *m);
void metrics_free(srv_metrics *m);
void metrics_count_status(srv_metrics *m, int status);

/* ---- jobs ---- */
typedef struct srv_job {
    struct srv_job *next;        /* queue link (srv.mu) */
    int refs;                    /* srv.mu: the connection's and the queue/worker's */
    srv_request req;
    tok_ids prompt;
    int max_tokens;
    int chat, in_reasoning;
    atomic_int cancel;           /* set by the connection when its client is gone */
    int done;                    /* srv.mu */
    int failed;                  /* srv.mu; err holds why */
    srv_err err;
    pthread_cond_t cv;           /* signalled on new output and on done */
    text_buf sse;                /* streaming: bytes for the client (srv.mu) */
    /* filled by the worker, read by the connection after done */
    text_buf content, reasoning;
    void *logprobs;              /* json_t*: chat "content" array or completions arrays object */
    size_t text_offset;
    int n_prompt, n_gen, n_reused;
    gen_finish finish;
    char id[48];
    long long created;
    void *tools;                 /* tools.c: constraint, tool-call parser, streaming progress */
} srv_job;

/* ---- the server ---- */
struct srv {
    srv_opts o;
    char *model_id;
    df_engine *eng;
    df_session *sess;
    const df_model_info *info;
    tokenizer *tok;
    chat_format fmt;
    int has_chat;
    struct MHD_Daemon *mhd;
    int listen_fd, port;
    long long started;
    pthread_t worker;
    int worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    srv_job *q_head, *q_tail;
    int n_queued;
    srv_job *running;
    int stopping;
    uint64_t next_id;
    srv_metrics m;
    /* worker-only */
    grammar_vocab *gvocab;       /* the vocabulary prepared for constrained output, made on first use */
    tok_ids hist;                /* exactly the tokens the session has consumed */
    float *logits;
};

/* worker.c */
void *worker_main(void *arg);
srv_job *job_new(srv *s);
void job_release(srv *s, srv_job *j);      /* takes srv.mu */
/* Queues j (the queue takes a reference) or refuses with 429 when full; 503 while stopping. */
int job_enqueue(srv *s, srv_job *j, srv_err *err);
/* The client is gone: a queued job leaves the queue now, a running one stops at the next layer. */
void job_cancel(srv *s, srv_job *j);

/* respond.c */
json_t *lossy_string(const uint8_t *p, size_t n);   /* a JSON string of bytes that may not be valid UTF-8 */
void respond_sse_role_chunk(const srv *s, srv_job *j, text_buf *out);
void respond_sse_event(const srv *s, srv_job *j, const gen_event *ev, text_buf *out);
void respond_sse_end(const srv *s, srv_job *j, text_buf *out);
void respond_accumulate(const srv *s, srv_job *j, const gen_event *ev);
char *respond_final_json(const srv *s, srv_job *j);
char *respond_models_json(const srv *s, const char *only_id);
void metrics_text(srv *s, text_buf *out);

/* http.c: binds and starts libmicrohttpd */
int http_start(srv *s, df_error *err);

/* page.c */
extern const char srv_page_html[];

#endif
