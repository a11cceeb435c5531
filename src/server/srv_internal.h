/* srv_internal.h — what the server's files share: the server context, jobs (one accepted generation
 * request, shared by its connection thread and the worker), conversation slots, metrics, and the JSON/SSE
 * writers. */
#ifndef DF_SRV_INTERNAL_H
#define DF_SRV_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "sample/generate.h"
#include "sample/grammar.h"
#include "sample/spec.h"
#include "server/request.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

/* ---- metrics ---- */
#define SRV_N_STATUS 16
typedef struct srv_metrics {
    pthread_mutex_t mu;
    int status_code[SRV_N_STATUS];
    uint64_t status_count[SRV_N_STATUS];
    uint64_t prompt_tokens, prompt_tokens_reused, generated_tokens, requests_cancelled;
    uint64_t connections_timed_out, requests_waited_for_memory;
    uint64_t connections_evicted, connections_refused;   /* over a connection limit (http.c) */
    uint64_t prompt_cache_restored, prompt_cache_saved;
    double prefill_s, decode_s, last_s_per_token, last_ttft_s;
    uint64_t decode_passes, drafted, accepted;   /* summed over the answers: verifier passes, drafts */
    uint64_t prefill_passes;                     /* passes with prompt rows in them */
    df_stats engine;   /* snapshot taken by the worker between evaluations */
} srv_metrics;

void metrics_init(srv_metrics *m);
void metrics_free(srv_metrics *m);
void metrics_count_status(srv_metrics *m, int status);

/* ---- jobs ---- */

/* One of a request's n answers. */
typedef struct srv_choice {
    text_buf content, reasoning;  /* non-streaming: the whole answer */
    void *logprobs;               /* json_t*: chat "content" array or completions arrays object */
    size_t text_offset;
    int n_gen;
    gen_finish finish;
} srv_choice;

struct srv_wire;

typedef struct srv_job {
    struct srv_job *next;        /* queue link (srv.mu) */
    int refs;                    /* srv.mu: the connection's and the queue/worker's */
    srv_request req;
    tok_ids prompt;
    int max_tokens;
    int chat, in_reasoning;
    int n_choices;
    atomic_int cancel;           /* set by the connection when its client is gone */
    int done;                    /* srv.mu */
    int failed;                  /* srv.mu; err holds why */
    srv_err err;
    int wake_fd;                 /* eventfd: written on new output and when done (the connection polls it) */
    text_buf sse;                /* streaming: bytes for the client (srv.mu) */
    /* filled by the worker, read by the connection after done */
    srv_choice *choices;
    int n_prompt, n_reused, n_open;
    int context_capped;          /* max_tokens was cut to what the context has room for */
    int drafted, accepted;       /* speculation, over all answers (final once done) */
    uint64_t state_need;         /* bytes of one slot's state for this request */
    double t_queued, t_first;    /* when it was queued; when its first token was ready (0 = not yet) */
    int cache_restored;          /* tokens restored from the prompt cache */
    int waited_for_memory;       /* srv.mu: was held back because slot memory was full */
    int64_t cache_at;            /* the prompt prefix the prompt cache keeps (its state is saved there) */
    const char *model_name;      /* the name answered with (owned by srv) */
    char id[48];
    long long created;
    void *tools;                 /* tools.c: constraint, tool-call parser, streaming progress */
    const struct srv_wire *wire; /* the answer's shape when not OpenAI's (NULL: OpenAI) */
    void *wire_ctx;              /* the wire's per-request state (srv.mu once queued; wire->free_ctx frees it) */
    int wire_ended;              /* srv.mu: the wire's end or fail was written */
    int count_only;              /* answer the prompt's token count (wire->count_json), generate nothing */
    atomic_llong prefilled;      /* prompt tokens in the slot's state so far; -1 while queued */
    double t_done;               /* srv.mu: when the last answer ended */
} srv_job;

/* An answer shape other than OpenAI's chat/completions (api_ollama.c, api_llama.c, api_messages.c,
 * api_responses.c): the worker and the stream call these instead of respond.c's. The job's hooks run with
 * srv.mu held (the worker and the stream's keepalives both write to the stream and its state) and append
 * whole lines/events to out. A stream gets start, events, then exactly one of end or fail (j->wire_ended). */
typedef struct srv_wire {
    const char *stream_type;     /* Content-Type of a streamed answer: text/event-stream or application/x-ndjson */
    /* before the job is queued: what a stream starts with at once */
    void (*start)(const struct srv *s, srv_job *j, text_buf *out);
    /* worker: one generated token's output (choice 0; these wires take n = 1); out is NULL when the answer is
     * not streamed, and the hook only keeps what the final answer needs */
    void (*event)(const struct srv *s, srv_job *j, const gen_event *ev, text_buf *out);
    /* streaming: the end of a successful answer */
    void (*end)(const struct srv *s, srv_job *j, text_buf *out);
    /* streaming: the stream must end now (failure, cancellation, shutdown) with this error */
    void (*fail)(const struct srv *s, srv_job *j, const srv_err *e, text_buf *out);
    /* streaming, while nothing else is sent: the protocol's own keepalive; when NULL or it writes nothing, an
     * SSE stream gets the comment telling where the request is (queued, prefill N/M) */
    void (*keepalive)(const struct srv *s, srv_job *j, text_buf *out);
    /* an error answered as a whole body */
    void (*error)(const srv_err *e, text_buf *out);
    /* not streaming: the whole answer (malloc'd) */
    char *(*final_json)(const struct srv *s, srv_job *j);
    /* a token-count request (j->count_only): the answer once the prompt is tokenised; NULL: none */
    char *(*count_json)(const struct srv *s, srv_job *j);
    void (*free_ctx)(void *ctx);
} srv_wire;

/* ---- conversation slots (worker-only) ---- */
typedef enum { SLOT_IDLE = 0, SLOT_SYNC, SLOT_PREFILL, SLOT_WAIT_COPY, SLOT_DECODE } slot_phase;

typedef struct srv_slot {
    df_session *sess;
    srv_job *job;                /* NULL when idle */
    int choice;                  /* which of job's answers */
    slot_phase phase;
    int64_t at;                  /* prefill: next prompt index to evaluate */
    int64_t save_at;             /* prefill: save the state for the prompt cache at this index (0 = no) */
    int32_t in[SPEC_DRAFT_MAX_LIMIT + 1];   /* decode: the token to evaluate, then this pass's drafts */
    int n_draft;                 /* drafts in this pass */
    int64_t pass_pos;            /* the session's position before this pass */
    struct spec *spec;           /* this slot's speculation (NULL: off) */
    int drafting;                /* the answer may draft (no constraint on its tokens) */
    float *rows;                 /* [draft_max + 1][vocab]: a drafting pass's logits */
    gen_state *gen;
    gen_result res;
    float *logits;               /* [vocab] */
    int64_t cap_tokens;          /* most tokens this session has been sized for */
    uint64_t reserved;           /* bytes counted against the slot memory */
    uint64_t seq;                /* admission order */
    double last_used;
    int last_rows;               /* rows of this slot in the current pass */
} srv_slot;

typedef struct srv_conn_watch srv_conn_watch;

/* ---- the server ---- */
struct srv {
    srv_opts o;
    char *model_id;
    df_engine *eng;
    const df_model_info *info;
    int n_ranks;                 /* expert parallelism: the ranks serving the model, as they reported at start */
    df_rank_info *ranks;
    tokenizer *tok;
    chat_format fmt;
    int has_chat;
    size_t max_token_bytes;      /* the longest token's text */
    struct MHD_Daemon *mhd;
    int listen_fd, port;
    long long started;
    pthread_t worker, reaper;
    int worker_started, reaper_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    srv_job *q_head, *q_tail;
    int n_queued, q_slots, n_running;   /* q_slots: slots the queued requests need */
    int stopping;
    uint64_t next_id, next_seq;
    srv_metrics m;
    /* slots: the worker's; n_slots and memory fixed at start */
    srv_slot *slots;
    int n_slots;
    uint64_t slot_mem;           /* bytes all slots' states may use together */
    int pass_rows;               /* most rows one forward pass takes */
    df_batch *batch;
    struct prompt_cache *pcache; /* prompt states kept on disk; NULL when off */
    df_session *snap;            /* the prompt-cache prefix of a prompt prefilled past it, taken in the same pass */
    struct spec *spec;           /* the slots' speculation is made like this one (it owns the draft model) */
    int n_parsing;               /* srv.mu: request bodies being parsed (bounded) */
    pthread_cond_t cv_parse;
    /* connection watch (http.c) */
    pthread_mutex_t cw_mu;
    pthread_cond_t cw_cv;
    srv_conn_watch *cw_head;
    int cw_stop;
    grammar_vocab *gvocab;       /* worker: the vocabulary prepared for constrained output, made on first use */
};

/* worker.c */
void *worker_main(void *arg);
srv_job *job_new(srv *s);
void job_release(srv *s, srv_job *j);      /* takes srv.mu */
void job_wake(srv_job *j);                 /* tells the connection there is news */
/* Slot memory one conversation of tokens takes: its session (with the rollback record speculation keeps),
 * and with speculation its verify rows' logits and the draft model's sessions. */
uint64_t slot_bytes(const srv *s, int64_t tokens);
/* Queues j (the queue takes a reference) or refuses with 429 when the queue is full; 503 while stopping.
 * With --queue 0 a request is taken only when a slot is free at once. */
int job_enqueue(srv *s, srv_job *j, srv_err *err);
/* The client is gone: a queued job leaves the queue now, a running one stops before the next pass. */
void job_cancel(srv *s, srv_job *j);

/* respond.c */
struct json_t;
/* bytes as a JSON string, invalid UTF-8 replaced by U+FFFD */
struct json_t *respond_lossy_string(const uint8_t *p, size_t n);
void respond_sse_role_chunk(const srv *s, srv_job *j, text_buf *out);
void respond_sse_event(const srv *s, srv_job *j, int choice, const gen_event *ev, text_buf *out);
void respond_sse_end(const srv *s, srv_job *j, text_buf *out);
void respond_accumulate(const srv *s, srv_job *j, int choice, const gen_event *ev);
char *respond_final_json(const srv *s, srv_job *j);
char *respond_models_json(const srv *s, const char *only_id);
char *respond_props_json(srv *s);
void metrics_text(srv *s, text_buf *out);

/* http.c: binds and starts libmicrohttpd and the connection watch */
int http_start(srv *s, df_error *err);
void http_stop(srv *s);

/* page.c */
extern const char srv_page_html[];

#endif
