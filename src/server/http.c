/* http.c — the HTTP layer on libmicrohttpd (one thread per connection): routing, API key, body limits,
 * turning a validated request into a job, and sending its answer as JSON or as Server-Sent Events. A
 * connection thread waiting for its job polls its socket, so a client that hangs up — queued or mid-stream —
 * is noticed within a fraction of a second and its job cancelled. */
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/srv_internal.h"
#include "server/tools.h"

#define POLL_MS 100

typedef enum { R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_PAGE } route;

typedef struct conn_ctx {
    route r;
    const char *model_arg;   /* /v1/models/{id} */
    text_buf body;
    int too_big;
} conn_ctx;

/* ---- plain responses ---- */

static enum MHD_Result send_text(srv *s, struct MHD_Connection *c, int status, const char *ctype, const char *body,
                                 size_t len, const char *allow) {
    struct MHD_Response *rsp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(rsp, "Content-Type", ctype);
    MHD_add_response_header(rsp, "Cache-Control", "no-store");
    if (allow) MHD_add_response_header(rsp, "Allow", allow);
    if (status == 429) MHD_add_response_header(rsp, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(rsp, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, rsp);
    MHD_destroy_response(rsp);
    metrics_count_status(&s->m, status);
    return ret;
}

static enum MHD_Result send_json(srv *s, struct MHD_Connection *c, int status, const char *json) {
    return send_text(s, c, status, "application/json", json, strlen(json), NULL);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, const srv_err *e, const char *allow) {
    text_buf b = {0};
    srv_err_json(e, &b);
    enum MHD_Result r = send_text(s, c, e->status, "application/json", b.p, b.len, allow);
    text_buf_free(&b);
    return r;
}

/* ---- routing ---- */

static route route_of(const char *url, const char **arg) {
    *arg = NULL;
    if (!strncmp(url, "/v1/", 4)) url += 3;
    if (!strcmp(url, "/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/models")) return R_MODELS;
    if (!strncmp(url, "/models/", 8) && url[8]) {
        *arg = url + 8;
        return R_MODEL;
    }
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return R_PAGE;
    return R_NONE;
}

static int route_is_post(route r) { return r == R_CHAT || r == R_COMPLETIONS; }

static int route_needs_key(route r) { return r != R_HEALTH && r != R_PAGE; }

/* Constant-time comparison, so the key cannot be guessed byte by byte from timings. */
static int key_matches(const char *want, const char *auth) {
    if (!auth || strncmp(auth, "Bearer ", 7)) return 0;
    const char *got = auth + 7;
    size_t lw = strlen(want), lg = strlen(got);
    unsigned char diff = lw != lg;
    for (size_t i = 0; i < lw; i++) diff |= (unsigned char)want[i] ^ (unsigned char)got[i < lg ? i : 0];
    return diff == 0;
}

/* ---- client liveness ---- */

static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) < 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- streaming ---- */

typedef struct stream_ctx {
    srv *s;
    srv_job *j;
    struct MHD_Connection *c;
    size_t sent;
    double last_write;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *st = cls;
    srv *s = st->s;
    srv_job *j = st->j;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (st->sent < j->sse.len) {
            size_t n = DF_MIN(max, j->sse.len - st->sent);
            memcpy(buf, j->sse.p + st->sent, n);
            st->sent += n;
            pthread_mutex_unlock(&s->mu);
            st->last_write = df_now();
            return (ssize_t)n;
        }
        if (j->done || s->stopping) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (df_now() - st->last_write >= s->o.keepalive_s) {
            pthread_mutex_unlock(&s->mu);
            static const char ka[] = ": keep-alive\n\n";
            size_t n = DF_MIN(max, sizeof ka - 1);
            memcpy(buf, ka, n);
            st->last_write = df_now();
            return (ssize_t)n;
        }
        timed_wait(&j->cv, &s->mu, POLL_MS);
        if (st->sent >= j->sse.len && !j->done && client_gone(st->c)) {
            pthread_mutex_unlock(&s->mu);
            job_cancel(s, j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream_ctx *st = cls;
    pthread_mutex_lock(&st->s->mu);
    int done = st->j->done;
    pthread_mutex_unlock(&st->s->mu);
    if (!done) job_cancel(st->s, st->j);   /* the connection ended before the generation did */
    job_release(st->s, st->j);
    free(st);
}

static enum MHD_Result send_stream(srv *s, struct MHD_Connection *c, srv_job *j) {
    stream_ctx *st = xcalloc(1, sizeof *st);
    *st = (stream_ctx){s, j, c, 0, df_now()};
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                 stream_free);
    MHD_add_response_header(rsp, "Content-Type", "text/event-stream");
    MHD_add_response_header(rsp, "Cache-Control", "no-cache");
    MHD_add_response_header(rsp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, rsp);
    MHD_destroy_response(rsp);   /* stream_free runs when MHD is done with it, or now if queueing failed */
    metrics_count_status(&s->m, 200);
    return ret;
}

/* ---- generation requests ---- */

/* Tokenises the request into j->prompt and resolves max_tokens; fills err on a bad request. */
static int build_prompt(srv *s, srv_job *j, srv_err *err) {
    df_error de = {0};
    srv_request *r = &j->req;
    if (r->ep == SRV_EP_CHAT) {
        if (!s->has_chat) {
            srv_err_set(err, 400, "invalid_request_error", "no_chat_format", "messages",
                        "This model's tokenizer has no chat format; use /v1/completions.");
            return -1;
        }
        chat_message *m = xcalloc((size_t)r->n_msgs, sizeof *m);
        for (int i = 0; i < r->n_msgs; i++)
            m[i] = (chat_message){r->msgs[i].role, r->msgs[i].content, r->msgs[i].reasoning ? r->msgs[i].reasoning : ""};
        chat_opts co;
        chat_opts_default(&co);
        if (r->reasoning_effort && !strcmp(r->reasoning_effort, "none")) co.thinking = 0;
        else if (r->reasoning_effort) co.effort = r->reasoning_effort;
        if (s->fmt == CHAT_K2 && tokenizer_special_id(s->tok, "<think>") < 0) co.thinking = 0;
        if (tools_constrained(r)) co.thinking = 0;   /* the constraint starts at the answer's first token */
        void *keep;
        tools_chat_opts(r, &co, &keep);
        int rc = chat_render(s->tok, s->fmt, m, r->n_msgs, &co, &j->prompt, &de);
        tools_chat_free(keep);
        free(m);
        if (rc) {
            srv_err_set(err, 400, "invalid_request_error", "invalid_value", "messages", "%s", de.msg);
            return -1;
        }
        j->chat = 1;
        j->in_reasoning = co.thinking;
    } else if (r->prompt) {
        if (tokenizer_encode(s->tok, r->prompt, r->prompt_len, 0, &j->prompt, &de)) {
            srv_err_set(err, 400, "invalid_request_error", "invalid_value", "prompt", "%s", de.msg);
            return -1;
        }
        if (!j->prompt.n && s->info->bos_id >= 0) tok_ids_push(&j->prompt, s->info->bos_id);
    } else {
        for (int i = 0; i < r->n_prompt_ids; i++) {
            if (r->prompt_ids[i] >= s->info->vocab_size) {
                srv_err_set(err, 400, "invalid_request_error", "invalid_value", "prompt",
                            "Token id %d is outside the model's vocabulary (%d).", r->prompt_ids[i],
                            s->info->vocab_size);
                return -1;
            }
            tok_ids_push(&j->prompt, r->prompt_ids[i]);
        }
    }
    for (size_t i = 0; i < j->prompt.n; i++)
        if (j->prompt.v[i] < 0 || j->prompt.v[i] >= s->info->vocab_size) {
            srv_err_set(err, 400, "invalid_request_error", "invalid_value", r->ep == SRV_EP_CHAT ? "messages" : "prompt",
                        "The prompt uses token %d, outside the model's vocabulary (%d).", j->prompt.v[i],
                        s->info->vocab_size);
            return -1;
        }
    if (!j->prompt.n) {
        srv_err_set(err, 400, "invalid_request_error", "invalid_value", "prompt", "The prompt is empty.");
        return -1;
    }
    int64_t room = s->info->max_context - (int64_t)j->prompt.n;
    if (room < 1) {
        srv_err_set(err, 400, "invalid_request_error", "context_length_exceeded",
                    r->ep == SRV_EP_CHAT ? "messages" : "prompt",
                    "The prompt has %zu tokens; this model's context is %lld tokens.", j->prompt.n,
                    (long long)s->info->max_context);
        return -1;
    }
    int want = r->max_tokens ? r->max_tokens : s->o.max_tokens;
    j->max_tokens = (int)DF_MIN((int64_t)DF_MIN(want, s->o.max_tokens), room);
    if (!r->has_seed) {   /* unseeded requests still differ from each other */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sp.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)j;
    }
    return tools_prepare(s, j, err);
}

static enum MHD_Result handle_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    srv_err err = {0};
    srv_job *j = job_new(s);
    srv_limits lim = {s->model_id, s->info->vocab_size};
    srv_endpoint ep = cc->r == R_CHAT ? SRV_EP_CHAT : SRV_EP_COMPLETIONS;
    if (srv_request_parse(cc->body.p ? cc->body.p : "", cc->body.len, ep, &lim, &j->req, &err) ||
        build_prompt(s, j, &err)) {
        job_release(s, j);
        return send_error(s, c, &err, NULL);
    }
    j->n_prompt = (int)j->prompt.n;
    if (j->req.stream && ep == SRV_EP_CHAT) respond_sse_role_chunk(s, j, &j->sse);
    if (job_enqueue(s, j, &err)) {
        job_release(s, j);
        return send_error(s, c, &err, NULL);
    }
    if (j->req.stream) return send_stream(s, c, j);   /* the stream now owns our reference */
    pthread_mutex_lock(&s->mu);
    int gone = 0;
    while (!j->done && !s->stopping) {
        timed_wait(&j->cv, &s->mu, POLL_MS);
        if (!j->done && client_gone(c)) {
            gone = 1;
            break;
        }
    }
    int done = j->done, failed = j->failed;
    pthread_mutex_unlock(&s->mu);
    if (gone || !done) {
        job_cancel(s, j);
        job_release(s, j);
        metrics_count_status(&s->m, 499);
        return MHD_NO;   /* nobody to answer: close the connection */
    }
    enum MHD_Result ret;
    if (failed) {
        if (!j->err.status) srv_err_set(&j->err, 500, "server_error", "cancelled", NULL, "The generation was cancelled.");
        ret = send_error(s, c, &j->err, NULL);
    } else {
        char *body = respond_final_json(s, j);
        ret = send_json(s, c, 200, body);
        free(body);
    }
    job_release(s, j);
    return ret;
}

/* ---- the MHD callbacks ---- */

static enum MHD_Result on_first_call(srv *s, struct MHD_Connection *c, conn_ctx *cc, const char *method) {
    srv_err err = {0};
    if (cc->r == R_NONE) {
        srv_err_set(&err, 404, "invalid_request_error", "not_found", NULL, "Unknown route.");
        return send_error(s, c, &err, NULL);
    }
    int post = route_is_post(cc->r);
    int ok_method = post ? !strcmp(method, "POST") : (!strcmp(method, "GET") || !strcmp(method, "HEAD"));
    if (!ok_method) {
        srv_err_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL, "Method %s is not allowed here.",
                    method);
        return send_error(s, c, &err, post ? "POST" : "GET, HEAD");
    }
    if (s->o.api_key && route_needs_key(cc->r) &&
        !key_matches(s->o.api_key, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        srv_err_set(&err, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "Incorrect or missing API key (send 'Authorization: Bearer KEY').");
        return send_error(s, c, &err, NULL);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (post && cl && strtoull(cl, NULL, 10) > s->o.max_body) {
        srv_err_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body is larger than %zu bytes.", s->o.max_body);
        return send_error(s, c, &err, NULL);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = xcalloc(1, sizeof *cc);
        *con_cls = cc;
        cc->r = route_of(url, &cc->model_arg);
        return on_first_call(s, c, cc, method);
    }
    if (*upload_size) {
        if (cc->body.len + *upload_size > s->o.max_body) cc->too_big = 1;   /* keep reading, drop the bytes */
        else text_buf_append(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    srv_err err = {0};
    if (cc->too_big) {
        srv_err_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body is larger than %zu bytes.", s->o.max_body);
        return send_error(s, c, &err, NULL);
    }
    switch (cc->r) {
    case R_CHAT:
    case R_COMPLETIONS: return handle_generate(s, c, cc);
    case R_HEALTH: return send_json(s, c, 200, "{\"status\":\"ok\"}");
    case R_PAGE: return send_text(s, c, 200, "text/html; charset=utf-8", srv_page_html, strlen(srv_page_html), NULL);
    case R_METRICS: {
        text_buf b = {0};
        metrics_text(s, &b);
        enum MHD_Result r = send_text(s, c, 200, "text/plain; version=0.0.4", b.p, b.len, NULL);
        text_buf_free(&b);
        return r;
    }
    case R_MODEL:
        if (strcmp(cc->model_arg, s->model_id)) {
            srv_err_set(&err, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.200s' does not exist.", cc->model_arg);
            return send_error(s, c, &err, NULL);
        }
        /* fallthrough */
    case R_MODELS: {
        char *b = respond_models_json(s, cc->r == R_MODEL ? cc->model_arg : NULL);
        enum MHD_Result r = send_json(s, c, 200, b);
        free(b);
        return r;
    }
    case R_NONE: break;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    text_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static int listen_on(const char *host, int port, df_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) {
        df_error_set(err, DF_EINVAL, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) df_error_set(err, DF_EIO, "cannot listen on %s:%d (address in use or not allowed?)", host, port);
    return fd;
}

int http_start(srv *s, df_error *err) {
    s->listen_fd = listen_on(s->o.host, s->o.port, err);
    if (s->listen_fd < 0) return DF_EIO;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(s->listen_fd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD,
                              0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)(s->o.queue + 64), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                              MHD_OPTION_END);
    if (!s->mhd) {
        close(s->listen_fd);
        s->listen_fd = -1;
        df_error_set(err, DF_EIO, "cannot start the HTTP server on %s:%d", s->o.host, s->port);
        return DF_EIO;
    }
    return DF_OK;
}
