/* http_post.c — the POST routes once their body is in: a generation request is parsed, tokenised into a
 * job for the worker and answered as JSON or streamed (SSE, or NDJSON for ollama), in OpenAI's shapes or its
 * wire API's (srv_wire); /tokenize and /detokenize answer at once.
 * A connection waiting for its job polls its socket together with the job's eventfd, so a client that resets
 * is noticed at once; one that only closed its sending side (legal: it may be waiting for the answer) is
 * probed with a write, and only a reset or a failed write cancels. */
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/http_internal.h"
#include "server/tools.h"

/* Requests whose JSON is parsed at once; others wait, so parsing memory stays bounded (see README). */
#define PARSE_SLOTS 2

/* What the access log tells of a generation (read once the worker is done with it, or gone). */
static void conn_note_job(conn_ctx *cc, const srv_job *j) {
    cc->n_gen = 0;
    for (int i = 0; i < j->n_choices; i++) cc->n_gen += j->choices[i].n_gen;
    cc->n_reused = j->n_reused;
    cc->restored = j->cache_restored;
    cc->ttft = j->t_first > 0 ? j->t_first - j->t_queued : 0;
    cc->context_capped = j->context_capped;
}

/* ---- waiting for a job, watching the client ---- */

typedef struct client {
    int fd;
    int http11, streaming;
    int probed;          /* it closed its sending side; a write was sent to learn whether it is still there */
    int probe_pending;   /* streaming: the reader should send a comment */
} client;

static void client_init(client *cl, struct MHD_Connection *c, const conn_ctx *cc, int streaming) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *cl = (client){.fd = ci ? ci->connect_fd : -1, .streaming = streaming, .http11 = cc->http11};
}

/* Waits up to ms for news from the job. Returns 1 when the client is certainly gone. */
static int wait_news(srv_job *j, client *cl, int ms) {
    struct pollfd p[2] = {{.fd = j->wake_fd, .events = POLLIN}, {.fd = cl->fd, .events = cl->probed ? 0 : POLLRDHUP}};
    if (poll(p, cl->fd >= 0 ? 2 : 1, ms) <= 0) return 0;
    if (p[0].revents & POLLIN) {
        uint64_t v;
        ssize_t r = read(j->wake_fd, &v, sizeof v);
        (void)r;
    }
    if (p[1].revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p[1].revents & POLLRDHUP) {
        cl->probed = 1;
        if (cl->streaming) {
            cl->probe_pending = 1;
        } else if (cl->http11) {   /* an interim response clients skip; a closed peer answers it with a reset */
            static const char interim[] = "HTTP/1.1 102 Processing\r\n\r\n";
            if (send(cl->fd, interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) return 1;
        }
    }
    return 0;
}

/* ---- streaming ---- */

typedef struct stream_ctx {
    srv *s;
    srv_job *j;
    conn_ctx *cc;
    client cl;
    size_t sent;
    double last_write;
} stream_ctx;

/* What a stream sends while nothing else is, queued behind what the worker wrote (so that a keepalive
 * longer than MHD's buffer is still sent whole): the wire's own keepalive event or line when it has one, else
 * (SSE) a comment telling where the request is: queued, or how much of its prompt is in. */
static void stream_keepalive(stream_ctx *st) {
    srv_job *j = st->j;
    pthread_mutex_lock(&st->s->mu);
    size_t had = j->sse.len;
    if (j->wire && j->wire->keepalive) j->wire->keepalive(st->s, j, &j->sse);
    if (j->sse.len == had) {
        long long at = atomic_load(&j->prefilled);
        if (at < 0) text_buf_puts(&j->sse, ": keep-alive queued\n\n");
        else if (at < (long long)j->prompt.n) text_buf_printf(&j->sse, ": keep-alive prefill %lld/%zu\n\n", at, j->prompt.n);
        else text_buf_puts(&j->sse, ": keep-alive\n\n");
    }
    pthread_mutex_unlock(&st->s->mu);
    st->last_write = df_now();
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *st = cls;
    srv *s = st->s;
    srv_job *j = st->j;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (st->sent < j->sse.len) {
            size_t n = DF_MIN(max, j->sse.len - st->sent);
            memcpy(buf, j->sse.p + st->sent, n);
            st->sent += n;
            pthread_mutex_unlock(&s->mu);
            st->last_write = df_now();
            return (ssize_t)n;
        }
        int over = j->done || s->stopping;
        if (over && j->wire && !j->wire_ended) {   /* its stream ends with its own last event, whatever ended the job */
            srv_err e = j->err;
            if (!e.status)
                srv_err_set(&e, s->stopping ? 503 : 500, "server_error", s->stopping ? "shutting_down" : "cancelled",
                            NULL, s->stopping ? "The server is shutting down." : "The generation was cancelled.");
            j->wire->fail(s, j, &e, &j->sse);
            j->wire_ended = 1;
            over = 0;
        }
        pthread_mutex_unlock(&s->mu);
        if (over) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->cl.probe_pending) {
            st->cl.probe_pending = 0;
            stream_keepalive(st);
            continue;
        }
        double left = s->o.keepalive_s - (df_now() - st->last_write);
        if (left <= 0) {
            stream_keepalive(st);
            continue;
        }
        if (wait_news(j, &st->cl, (int)(left * 1000) + 1)) {
            job_cancel(s, j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream_ctx *st = cls;
    srv *s = st->s;
    srv_job *j = st->j;
    pthread_mutex_lock(&s->mu);
    int done = j->done;
    pthread_mutex_unlock(&s->mu);
    if (!done) job_cancel(s, j);   /* the connection ended before the generation did */
    conn_ctx *cc = st->cc;
    if (done) conn_note_job(cc, j);   /* else the worker may still be writing them */
    else cc->status = 499;
    job_release(s, j);
    http_conn_unref(cc);
    free(st);
}

static enum MHD_Result send_stream(srv *s, struct MHD_Connection *c, conn_ctx *cc, srv_job *j) {
    stream_ctx *st = xcalloc(1, sizeof *st);
    *st = (stream_ctx){s, j, cc, {0}, 0, df_now()};
    client_init(&st->cl, c, cc, 1);
    pthread_mutex_lock(&s->mu);
    cc->refs++;
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                 stream_free);
    MHD_add_response_header(rsp, "Content-Type", j->wire ? j->wire->stream_type : "text/event-stream");
    MHD_add_response_header(rsp, "Cache-Control", "no-cache");
    MHD_add_response_header(rsp, "X-Accel-Buffering", "no");
    return http_queue_response(s, c, cc, 200, rsp);   /* stream_free runs when MHD is done with it */
}

/* ---- generation requests ---- */

/* A chat request's messages rendered into j->prompt with the model's chat format (and where the prompt cache
 * should keep its prefix). */
static int render_chat(srv *s, srv_job *j, srv_err *err) {
    df_error de = {0};
    srv_request *r = &j->req;
    if (!s->has_chat) {
        srv_err_set(err, 400, "invalid_request_error", "no_chat_format", "messages",
                    "This model's tokenizer has no chat format; use /v1/completions.");
        return -1;
    }
    chat_message *m = xcalloc((size_t)r->n_msgs, sizeof *m);
    for (int i = 0; i < r->n_msgs; i++)   /* a developer message is the system prompt the templates know */
        m[i] = (chat_message){strcmp(r->msgs[i].role, "developer") ? r->msgs[i].role : "system",
                              r->msgs[i].content, r->msgs[i].reasoning ? r->msgs[i].reasoning : ""};
    chat_opts co;
    chat_opts_default(&co);
    if (r->reasoning_effort && !strcmp(r->reasoning_effort, "none")) co.thinking = 0;
    else if (r->reasoning_effort) co.effort = r->reasoning_effort;
    if (s->fmt == CHAT_K2 && tokenizer_special_id(s->tok, "<think>") < 0) co.thinking = 0;
    if (tools_constrained(r)) co.thinking = 0;   /* the constraint starts at the answer's first token */
    void *keep;
    tools_chat_opts(r, &co, &keep);
    int rc = chat_render(s->tok, s->fmt, m, r->n_msgs, &co, &j->prompt, &de);
    /* the prompt cache keeps the conversation before the last user message: what the next turn, or
     * another chat with the same system prompt, starts with */
    int last_user = -1;
    for (int i = 0; i < r->n_msgs; i++)
        if (!strcmp(r->msgs[i].role, "user")) last_user = i;
    if (!rc && s->pcache && last_user > 0) {
        tok_ids head = {0};
        df_error he = {0};
        if (!chat_render(s->tok, s->fmt, m, last_user, &co, &head, &he)) {
            size_t k = 0;
            while (k < head.n && k < j->prompt.n && head.v[k] == j->prompt.v[k]) k++;
            j->cache_at = (int64_t)k;
        }
        tok_ids_free(&head);
    }
    tools_chat_free(keep);
    free(m);
    if (rc) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_value", "messages", "%s", de.msg);
        return -1;
    }
    j->chat = 1;
    j->in_reasoning = co.thinking;
    return 0;
}

/* Tokenises the request into j->prompt and resolves max_tokens; fills err on a bad request. */
static int build_prompt(srv *s, srv_job *j, srv_err *err) {
    if (j->count_only && j->req.ep == SRV_EP_CHAT) return render_chat(s, j, err);
    df_error de = {0};
    srv_request *r = &j->req;
    const char *what = r->ep == SRV_EP_CHAT ? "messages" : "prompt";
    /* text that must make more tokens than the context holds (no token is longer than max_token_bytes) is
     * refused before it is tokenised */
    size_t text = r->prompt ? r->prompt_len : 0;
    for (int i = 0; i < r->n_msgs; i++)
        text += strlen(r->msgs[i].content) + (r->msgs[i].reasoning ? strlen(r->msgs[i].reasoning) : 0);
    if (text / DF_MAX(s->max_token_bytes, (size_t)1) > (size_t)s->info->max_context) {
        srv_err_set(err, 400, "invalid_request_error", "context_length_exceeded", what,
                    "The prompt's %zu bytes of text make more tokens than this model's context (%lld tokens).", text,
                    (long long)s->info->max_context);
        return -1;
    }
    if (r->ep == SRV_EP_CHAT) {
        if (render_chat(s, j, err)) return -1;
    } else if (r->prompt) {
        if (tokenizer_encode(s->tok, r->prompt, r->prompt_len, 0, &j->prompt, &de)) {
            srv_err_set(err, 400, "invalid_request_error", "invalid_value", "prompt", "%s", de.msg);
            return -1;
        }
        if (!j->prompt.n && s->info->bos_id >= 0) tok_ids_push(&j->prompt, s->info->bos_id);
    } else {
        for (int i = 0; i < r->n_prompt_ids; i++) tok_ids_push(&j->prompt, r->prompt_ids[i]);
    }
    for (size_t i = 0; i < j->prompt.n; i++)
        if (j->prompt.v[i] < 0 || j->prompt.v[i] >= s->info->vocab_size) {
            srv_err_set(err, 400, "invalid_request_error", "invalid_value", what,
                        "The prompt uses token %d, outside the model's vocabulary (%d).", j->prompt.v[i],
                        s->info->vocab_size);
            return -1;
        }
    if (!j->prompt.n) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_value", "prompt", "The prompt is empty.");
        return -1;
    }
    if (!j->cache_at || j->cache_at >= (int64_t)j->prompt.n) j->cache_at = (int64_t)j->prompt.n - 1;
    int64_t room = s->info->max_context - (int64_t)j->prompt.n;
    if (room < 1) {
        srv_err_set(err, 400, "invalid_request_error", "context_length_exceeded", what,
                    "The prompt has %zu tokens; this model's context is %lld tokens.", j->prompt.n,
                    (long long)s->info->max_context);
        return -1;
    }
    if (r->n > s->n_slots) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_value", "n",
                    "n = %d needs as many conversation slots; this server has %d (--parallel).", r->n, s->n_slots);
        return -1;
    }
    j->n_choices = r->n;
    /* its answers' states must fit the slot memory beside the other slots at their smallest */
    uint64_t rest = (uint64_t)(s->n_slots - r->n) * slot_bytes(s, 0);
    int64_t fit = room;
    while (fit > 0 && rest + (uint64_t)r->n * slot_bytes(s, (int64_t)j->prompt.n + fit) > s->slot_mem)
        fit /= 2;
    if (fit < 1) {
        srv_err_set(err, 400, "invalid_request_error", "context_length_exceeded", what,
                    "The prompt's state (%zu tokens) does not fit the server's conversation memory (%llu MiB, --slot-mem).",
                    j->prompt.n, (unsigned long long)(s->slot_mem >> 20));
        return -1;
    }
    int want = r->max_tokens ? r->max_tokens : s->o.max_tokens;
    j->max_tokens = (int)DF_MIN((int64_t)DF_MIN(want, s->o.max_tokens), fit);
    j->context_capped = j->max_tokens == room && room < DF_MIN(want, s->o.max_tokens);
    if (!r->has_seed) {   /* unseeded requests still differ from each other */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sp.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)j;
    }
    j->choices = xcalloc((size_t)j->n_choices, sizeof *j->choices);
    if (j->n_choices > 1 && (j->req.n_tools || j->req.response_format != SRV_FORMAT_TEXT)) {
        srv_err_set(err, 400, "invalid_request_error", "unsupported_value", "n",
                    "'n' > 1 cannot be combined with tools or response_format.");
        return -1;
    }
    return tools_prepare(s, j, err);
}

int http_parse_enter(srv *s) {
    pthread_mutex_lock(&s->mu);
    while (s->n_parsing >= PARSE_SLOTS && !s->stopping) pthread_cond_wait(&s->cv_parse, &s->mu);
    int ok = !s->stopping;
    if (ok) s->n_parsing++;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void http_parse_leave(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->n_parsing--;
    pthread_cond_signal(&s->cv_parse);
    pthread_mutex_unlock(&s->mu);
}

enum MHD_Result http_send_wire_error(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_wire *wire,
                                     const srv_err *e) {
    if (!wire) return http_send_error(s, c, cc, e, NULL);
    text_buf b = {0};
    wire->error(e, &b);
    enum MHD_Result r = http_send_text(s, c, cc, e->status, "application/json", b.p, b.len, NULL);
    text_buf_free(&b);
    return r;
}

static int parse_openai(srv *s, conn_ctx *cc, void *arg, srv_job *j, const srv_limits *lim, srv_err *err) {
    (void)s;
    (void)arg;
    srv_endpoint ep = cc->r == R_CHAT ? SRV_EP_CHAT : SRV_EP_COMPLETIONS;
    return srv_request_parse(cc->body.p ? cc->body.p : "", cc->body.len, ep, lim, &j->req, err);
}

enum MHD_Result http_handle_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    return http_generate(s, c, cc, NULL, parse_openai, NULL, 0);
}

enum MHD_Result http_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_wire *wire,
                              http_parse_fn parse, void *arg, int count_only) {
    srv_err err = {0};
    srv_job *j = job_new(s);
    j->wire = wire;
    j->count_only = count_only;
    const char *names[SRV_MAX_NAMES + 1];
    int n_names = 0;
    names[n_names++] = s->model_id;
    for (int i = 0; i < s->o.n_aliases; i++) names[n_names++] = s->o.aliases[i];
    srv_limits lim = {names, n_names, s->info->vocab_size, s->o.strict, DF_MIN(SRV_MAX_CHOICES, s->n_slots)};
    if (!http_parse_enter(s)) {
        srv_err_set(&err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        job_release(s, j);
        return http_send_wire_error(s, c, cc, wire, &err);
    }
    int bad = parse(s, cc, arg, j, &lim, &err) || build_prompt(s, j, &err);
    http_parse_leave(s);
    if (!bad && j->req.ignored) {
        cc->ignored = xstrdup(j->req.ignored);
    }
    if (bad) {
        job_release(s, j);
        return http_send_wire_error(s, c, cc, wire, &err);
    }
    j->model_name = srv_model_id(s);
    for (int i = 0; j->req.model && i < n_names; i++)
        if (!strcmp(j->req.model, names[i])) j->model_name = names[i];
    j->n_prompt = (int)j->prompt.n;
    cc->n_prompt = j->n_prompt;
    if (count_only) {
        char *body = wire->count_json(s, j);
        enum MHD_Result ret = http_send_json(s, c, cc, 200, body);
        free(body);
        job_release(s, j);
        return ret;
    }
    if (j->req.stream && wire) wire->start(s, j, &j->sse);
    else if (j->req.stream && j->req.ep == SRV_EP_CHAT) respond_sse_role_chunk(s, j, &j->sse);
    if (job_enqueue(s, j, &err)) {
        job_release(s, j);
        return http_send_wire_error(s, c, cc, wire, &err);
    }
    if (j->req.stream) return send_stream(s, c, cc, j);   /* the stream now owns our reference */
    client cl;
    client_init(&cl, c, cc, 0);
    int gone = 0, done = 0, failed = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        done = j->done;
        failed = j->failed;
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (done || stop || gone) break;
        gone = wait_news(j, &cl, 1000);
    }
    if (done) conn_note_job(cc, j);
    if (gone || !done) {
        job_cancel(s, j);
        job_release(s, j);
        metrics_count_status(&s->m, 499);
        cc->status = 499;
        return MHD_NO;   /* nobody to answer: close the connection */
    }
    enum MHD_Result ret;
    if (failed) {
        if (!j->err.status) srv_err_set(&j->err, 500, "server_error", "cancelled", NULL, "The generation was cancelled.");
        ret = http_send_wire_error(s, c, cc, wire, &j->err);
    } else {
        char *body = wire ? wire->final_json(s, j) : respond_final_json(s, j);
        ret = http_send_json(s, c, cc, 200, body);
        free(body);
    }
    job_release(s, j);
    return ret;
}

/* ---- /tokenize and /detokenize, as llama-server has them ---- */

/* /tokenize's answer is written while it is sent, a few hundred tokens at a time: besides the request it
 * holds only the ids (4 bytes a token), where a JSON tree of the answer took ~130 bytes per byte of text. */
typedef struct tok_stream {
    srv *s;
    conn_ctx *cc;
    tok_ids ids;
    int pieces;
    size_t next;        /* ids written into buf */
    int closed;         /* the closing bracket is in buf */
    text_buf buf;
    size_t off;         /* bytes of buf already sent */
} tok_stream;

/* A piece that is whole UTF-8 as a JSON string, else (part of a character) as its bytes, as llama-server. */
static void tok_piece(text_buf *b, const uint8_t *p, size_t n) {
    int text = 1;
    for (size_t i = 0; i < n && text;) {
        int k = utf8_valid_len(p + i, n - i);
        if (k <= 0) text = 0;
        else i += (size_t)k;
    }
    if (!text) {
        text_buf_puts(b, "[");
        for (size_t i = 0; i < n; i++) text_buf_printf(b, "%s%u", i ? "," : "", p[i]);
        text_buf_puts(b, "]");
        return;
    }
    text_buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') text_buf_printf(b, "\\%c", c);
        else if (c < 0x20) text_buf_printf(b, "\\u%04x", c);
        else text_buf_append(b, (const char *)&c, 1);
    }
    text_buf_puts(b, "\"");
}

static ssize_t tok_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    tok_stream *t = cls;
    if (t->off == t->buf.len) {
        text_buf_clear(&t->buf);
        t->off = 0;
        if (t->closed) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!t->next) text_buf_puts(&t->buf, "{\"tokens\":[");
        for (int k = 0; k < 256 && t->next < t->ids.n; k++, t->next++) {
            int32_t id = t->ids.v[t->next];
            if (t->next) text_buf_puts(&t->buf, ",");
            if (!t->pieces) {
                text_buf_printf(&t->buf, "%d", (int)id);
                continue;
            }
            size_t n = 0;
            const uint8_t *p = tokenizer_token_bytes(t->s->tok, id, &n);
            text_buf_printf(&t->buf, "{\"id\":%d,\"piece\":", (int)id);
            tok_piece(&t->buf, p ? p : (const uint8_t *)"", p ? n : 0);
            text_buf_puts(&t->buf, "}");
        }
        if (t->next == t->ids.n) {
            text_buf_puts(&t->buf, "]}");
            t->closed = 1;
        }
    }
    size_t n = DF_MIN(max, t->buf.len - t->off);
    memcpy(buf, t->buf.p + t->off, n);
    t->off += n;
    return (ssize_t)n;
}

static void tok_stream_free(void *cls) {
    tok_stream *t = cls;
    tok_ids_free(&t->ids);
    text_buf_free(&t->buf);
    http_conn_unref(t->cc);
    free(t);
}

/* Answers with the ids (taken over); the request's body and parsed JSON are gone by then. */
static enum MHD_Result send_tokens(srv *s, struct MHD_Connection *c, conn_ctx *cc, tok_ids *ids, int pieces) {
    tok_stream *t = xcalloc(1, sizeof *t);
    t->s = s;
    t->cc = cc;
    t->ids = *ids;
    t->pieces = pieces;
    memset(ids, 0, sizeof *ids);
    pthread_mutex_lock(&s->mu);
    cc->refs++;
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, tok_stream_read, t,
                                                                 tok_stream_free);
    MHD_add_response_header(rsp, "Content-Type", "application/json");
    MHD_add_response_header(rsp, "Cache-Control", "no-store");
    return http_queue_response(s, c, cc, 200, rsp);
}

enum MHD_Result http_handle_tokens(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    srv_err err = {0};
    if (!http_parse_enter(s)) {
        srv_err_set(&err, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        return http_send_error(s, c, cc, &err, NULL);
    }
    json_error_t je;
    json_t *root = json_loadb(cc->body.p ? cc->body.p : "", cc->body.len, JSON_REJECT_DUPLICATES, &je);
    json_t *out = NULL;
    df_error de = {0};
    if (!json_is_object(root)) {
        srv_err_set(&err, 400, "invalid_request_error", "invalid_json", NULL, "The body must be a JSON object.");
    } else if (cc->r == R_TOKENIZE) {
        json_t *content = json_object_get(root, "content");
        json_t *add = json_object_get(root, "add_special"), *parse = json_object_get(root, "parse_special");
        int pieces = json_is_true(json_object_get(root, "with_pieces"));
        tok_ids ids = {0};
        if (!json_is_string(content)) {
            srv_err_set(&err, 400, "invalid_request_error", "invalid_type", "content", "'content' must be a string.");
        } else {
            if (json_is_true(add) && s->info->bos_id >= 0) tok_ids_push(&ids, s->info->bos_id);
            if (tokenizer_encode(s->tok, json_string_value(content), json_string_length(content),
                                 parse ? json_is_true(parse) : 1, &ids, &de))
                srv_err_set(&err, 400, "invalid_request_error", "invalid_value", "content", "%s", de.msg);
        }
        if (!err.status) {   /* what the ids were made from is no longer needed */
            json_decref(root);
            http_parse_leave(s);
            text_buf_free(&cc->body);
            enum MHD_Result r = send_tokens(s, c, cc, &ids, pieces);
            tok_ids_free(&ids);
            return r;
        }
        tok_ids_free(&ids);
    } else {
        json_t *tokens = json_object_get(root, "tokens");
        if (!json_is_array(tokens)) {
            srv_err_set(&err, 400, "invalid_request_error", "invalid_type", "tokens", "'tokens' must be an array of ids.");
        } else {
            size_t i;
            json_t *v;
            tok_ids ids = {0};
            json_array_foreach(tokens, i, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->info->vocab_size) {
                    srv_err_set(&err, 400, "invalid_request_error", "invalid_value", "tokens",
                                "tokens[%zu] is not a token id of this model (0..%d).", i, s->info->vocab_size - 1);
                    break;
                }
                tok_ids_push(&ids, (int32_t)json_integer_value(v));
            }
            char *buf = NULL;
            size_t len = 0, cap = 0;
            if (!err.status && tokenizer_decode(s->tok, ids.v, ids.n, &buf, &len, &cap, &de))
                srv_err_set(&err, 400, "invalid_request_error", "invalid_value", "tokens", "%s", de.msg);
            if (!err.status) out = json_pack("{s:o}", "content", respond_lossy_string((const uint8_t *)buf, len));
            free(buf);
            tok_ids_free(&ids);
        }
    }
    json_decref(root);
    http_parse_leave(s);
    if (!out) {
        if (!err.status)
            srv_err_set(&err, 400, "invalid_request_error", "invalid_json", NULL, "The body is not valid JSON.");
        return http_send_error(s, c, cc, &err, NULL);
    }
    char *t = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    enum MHD_Result r = http_send_json(s, c, cc, 200, t);
    free(t);
    return r;
}
