/* http.c — the HTTP layer on libmicrohttpd (one thread per connection): routing, API key, Origin and CORS,
 * body limits, plain responses, an access-log line per request, and listening. A watch thread closes
 * connections whose request (headers and body) does not arrive within the read timeout, however steadily it
 * trickles. The connection limits, in all and per client address, are kept here rather than by MHD: a new
 * connection over a limit evicts the one of that address (or any) that has waited longest for its request,
 * and is refused only when every counted connection is being answered, so slow or idle connections cannot
 * lock out a quick request such as a health probe. The POST routes' handlers (generation jobs, streaming,
 * /tokenize) are http_post.c. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/guard.h"
#include "server/http_internal.h"

struct srv_conn_watch {
    srv_conn_watch *prev, *next;
    int fd;
    double deadline;   /* the request must have arrived by then; 0 = none (being answered) */
    int closed;        /* shut down by the watch or evicted: no longer counted */
    char addr[64];
};

/* MHD's own limit on connections, above ours so that it accepts what we would rather decide on. */
#define MHD_CONN_MARGIN 64


/* The most JSON values a body may hold: a prompt of the whole context as token ids, or as messages of a
 * few values each, and then some. Bodies past it are refused before the parser allocates for them. */
static long long max_json_values(const srv *s) { return 4 * (long long)s->info->max_context + 4096; }

static void conn_log_and_free(conn_ctx *cc) {
    srv *s = cc->s;
    if (s->o.access_log) {
        char extra[700] = "";
        if (cc->r == R_CHAT || cc->r == R_COMPLETIONS || (s->o.api && s->o.api->generates(cc->r)))
            snprintf(extra, sizeof extra, " prompt=%d cached=%d restored=%d completion=%d ttft_ms=%.0f%s%s%s",
                     cc->n_prompt, cc->n_reused, cc->restored, cc->n_gen, cc->ttft * 1e3,
                     cc->ignored ? " ignored=" : "", cc->ignored ? cc->ignored : "",
                     cc->context_capped ? " context_full" : "");
        fprintf(stderr, "deltafin serve: %s \"%s %s\" %d%s ms=%.0f\n", cc->addr, cc->method, cc->path, cc->status,
                extra, (df_now() - cc->t0) * 1e3);
    }
    text_buf_free(&cc->body);
    free(cc->ignored);
    free(cc);
}

void http_conn_unref(conn_ctx *cc) {
    srv *s = cc->s;
    pthread_mutex_lock(&s->mu);
    int last = --cc->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) conn_log_and_free(cc);
}


/* ---- plain responses ---- */

static void add_cors(srv *s, struct MHD_Connection *c, struct MHD_Response *rsp) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin || !s->o.n_cors || !guard_origin_allowed(origin, NULL, s->o.cors, s->o.n_cors)) return;
    MHD_add_response_header(rsp, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(rsp, "Vary", "Origin");
    MHD_add_response_header(rsp, "Access-Control-Expose-Headers", "X-Deltafin-Ignored-Fields, Retry-After");
}

enum MHD_Result http_queue_response(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status,
                                    struct MHD_Response *rsp) {
    add_cors(s, c, rsp);
    if (cc && cc->ignored) MHD_add_response_header(rsp, "X-Deltafin-Ignored-Fields", cc->ignored);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, rsp);
    MHD_destroy_response(rsp);
    metrics_count_status(&s->m, status);
    if (cc) cc->status = status;
    return ret;
}

enum MHD_Result http_send_text(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status, const char *ctype,
                               const char *body, size_t len, const char *allow) {
    struct MHD_Response *rsp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(rsp, "Content-Type", ctype);
    MHD_add_response_header(rsp, "Cache-Control", "no-store");
    if (allow) MHD_add_response_header(rsp, "Allow", allow);
    if (status == 429) MHD_add_response_header(rsp, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(rsp, "WWW-Authenticate", "Bearer");
    return http_queue_response(s, c, cc, status, rsp);
}

enum MHD_Result http_send_json(srv *s, struct MHD_Connection *c, conn_ctx *cc, int status, const char *json) {
    return http_send_text(s, c, cc, status, "application/json", json, strlen(json), NULL);
}

enum MHD_Result http_send_error(srv *s, struct MHD_Connection *c, conn_ctx *cc, const srv_err *e,
                                const char *allow) {
    text_buf b = {0};
    srv_err_json(e, &b);
    enum MHD_Result r = http_send_text(s, c, cc, e->status, "application/json", b.p, b.len, allow);
    text_buf_free(&b);
    return r;
}

/* ---- routing ---- */

static route route_of(const srv *s, const char *url, const char **arg) {
    *arg = NULL;
    route api = s->o.api ? s->o.api->route_of(url) : R_NONE;
    if (api != R_NONE) return api;
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
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/props")) return R_PROPS;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return R_PAGE;
    return R_NONE;
}

static int route_is_post(const srv *s, route r) {
    return r == R_CHAT || r == R_COMPLETIONS || r == R_TOKENIZE || r == R_DETOKENIZE ||
           (s->o.api && s->o.api->is_post(r));
}

static int route_needs_key(const srv *s, route r) {
    return r != R_HEALTH && r != R_PAGE && !(s->o.api && s->o.api->is_public(r));
}

/* ---- the connection watch ---- */

static srv_conn_watch *watch_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (srv_conn_watch *)ci->socket_context : NULL;
}

static void watch_set(srv *s, struct MHD_Connection *c, double deadline) {
    srv_conn_watch *w = watch_of(c);
    if (!w) return;
    pthread_mutex_lock(&s->cw_mu);
    if (!w->closed) w->deadline = deadline;
    pthread_mutex_unlock(&s->cw_mu);
}

static void client_address(struct MHD_Connection *c, char *out, size_t cap) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, cap, "-");
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)cap);
}

static unsigned conn_limit(const srv *s) {
    return s->o.max_conns ? (unsigned)s->o.max_conns : (unsigned)(s->n_slots + s->o.queue + 64);
}

static void conn_close_locked(srv *s, srv_conn_watch *w) {
    if (w->fd >= 0) shutdown(w->fd, SHUT_RDWR);
    w->closed = 1;
    w->deadline = 0;
    (void)s;
}

/* A new connection w over a limit (per address when addr is set, else in all): the counted connection
 * that has waited longest for its request goes; w itself when all of them are being answered. */
static void conn_make_room_locked(srv *s, srv_conn_watch *w, const char *addr, unsigned limit) {
    unsigned n = 0;
    for (srv_conn_watch *o = s->cw_head; o; o = o->next) n += !o->closed && (!addr || !strcmp(o->addr, addr));
    if (n <= limit) return;
    srv_conn_watch *victim = NULL;
    for (srv_conn_watch *o = s->cw_head; o; o = o->next)
        if (o != w && !o->closed && o->deadline > 0 && (!addr || !strcmp(o->addr, addr)) &&
            (!victim || o->deadline < victim->deadline))
            victim = o;
    conn_close_locked(s, victim ? victim : w);
    pthread_mutex_lock(&s->m.mu);
    if (victim) s->m.connections_evicted++;
    else s->m.connections_refused++;
    pthread_mutex_unlock(&s->m.mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    srv *s = cls;
    pthread_mutex_lock(&s->cw_mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_conn_watch *w = xcalloc(1, sizeof *w);
        w->fd = ci ? ci->connect_fd : -1;
        w->deadline = df_now() + s->o.read_timeout_s;
        client_address(c, w->addr, sizeof w->addr);
        w->next = s->cw_head;
        if (s->cw_head) s->cw_head->prev = w;
        s->cw_head = w;
        *socket_context = w;
        if (s->o.max_conns_per_client > 0) conn_make_room_locked(s, w, w->addr, (unsigned)s->o.max_conns_per_client);
        if (!w->closed) conn_make_room_locked(s, w, NULL, conn_limit(s));
    } else if (*socket_context) {
        srv_conn_watch *w = *socket_context;
        if (w->prev) w->prev->next = w->next;
        else s->cw_head = w->next;
        if (w->next) w->next->prev = w->prev;
        free(w);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&s->cw_mu);
}

/* Closes (shuts down; MHD then drops it) every connection whose request is late. */
static void *watch_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->cw_mu);
    while (!s->cw_stop) {
        struct timespec ts = df_deadline(CLOCK_REALTIME, 0.25);
        pthread_cond_timedwait(&s->cw_cv, &s->cw_mu, &ts);
        double now = df_now();
        for (srv_conn_watch *w = s->cw_head; w; w = w->next)
            if (w->deadline > 0 && now > w->deadline && w->fd >= 0) {
                conn_close_locked(s, w);
                pthread_mutex_lock(&s->m.mu);
                s->m.connections_timed_out++;
                pthread_mutex_unlock(&s->m.mu);
            }
    }
    pthread_mutex_unlock(&s->cw_mu);
    return NULL;
}

/* ---- the MHD callbacks ---- */

static enum MHD_Result on_first_call(srv *s, struct MHD_Connection *c, conn_ctx *cc, const char *method) {
    srv_err err = {0};
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!guard_origin_allowed(origin, host, s->o.cors, s->o.n_cors)) {
        srv_err_set(&err, 403, "invalid_request_error", "origin_not_allowed", NULL,
                    "Requests from the web page at %.200s are not allowed (start the server with --cors ORIGIN).",
                    origin);
        return http_send_error(s, c, cc, &err, NULL);
    }
    /* without a key, a name rebound to this machine must not reach it (with one, the key is the guard) */
    if (!s->o.api_key && !guard_host_allowed(host, s->o.host, s->o.hosts, s->o.n_hosts)) {
        srv_err_set(&err, 403, "invalid_request_error", "host_not_allowed", NULL,
                    "Requests for the host %.200s are not answered (start the server with --allowed-host NAME, or "
                    "with an API key).", host);
        return http_send_error(s, c, cc, &err, NULL);
    }
    if (!strcmp(method, "OPTIONS") && origin) {   /* CORS preflight */
        struct MHD_Response *rsp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(rsp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(rsp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
        MHD_add_response_header(rsp, "Access-Control-Max-Age", "600");
        return http_queue_response(s, c, cc, 204, rsp);
    }
    if (cc->r == R_NONE) {
        srv_err_set(&err, 404, "invalid_request_error", "not_found", NULL, "Unknown route.");
        return http_send_error(s, c, cc, &err, NULL);
    }
    int post = route_is_post(s, cc->r);
    int ok_method = post ? !strcmp(method, "POST") : (!strcmp(method, "GET") || !strcmp(method, "HEAD"));
    if (!ok_method) {
        srv_err_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL, "Method %s is not allowed here.",
                    method);
        return http_send_error(s, c, cc, &err, post ? "POST" : "GET, HEAD");
    }
    /* Anthropic clients send the key as x-api-key */
    const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (s->o.api_key && route_needs_key(s, cc->r) &&
        !guard_key_matches(s->o.api_key, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")) &&
        !(xkey && guard_key_equals(s->o.api_key, xkey))) {
        srv_err_set(&err, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "Incorrect or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY').");
        return http_send_error(s, c, cc, &err, NULL);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (post && cl && strtoull(cl, NULL, 10) > s->o.max_body) {
        srv_err_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body is larger than %zu bytes.", s->o.max_body);
        return http_send_error(s, c, cc, &err, NULL);
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
        cc->s = s;
        cc->refs = 1;
        cc->t0 = df_now();
        snprintf(cc->method, sizeof cc->method, "%s", method);
        snprintf(cc->path, sizeof cc->path, "%s", url);
        cc->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        client_address(c, cc->addr, sizeof cc->addr);
        cc->r = route_of(s, url, &cc->model_arg);
        watch_set(s, c, df_now() + s->o.read_timeout_s);   /* the body has the same time as the headers */
        return on_first_call(s, c, cc, method);
    }
    if (*upload_size) {
        if (cc->body.len + *upload_size > s->o.max_body) cc->too_big = 1;   /* keep reading, drop the bytes */
        else text_buf_append(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    watch_set(s, c, 0);   /* the request is in: answering may take as long as it takes */
    srv_err err = {0};
    if (cc->too_big) {
        srv_err_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body is larger than %zu bytes.", s->o.max_body);
        return http_send_error(s, c, cc, &err, NULL);
    }
    if (route_is_post(s, cc->r) && guard_json_values(cc->body.p, cc->body.len, max_json_values(s)) > max_json_values(s)) {
        srv_err_set(&err, 400, "invalid_request_error", "context_length_exceeded", NULL,
                    "The request holds more than %lld JSON values; this model's context is %lld tokens.",
                    max_json_values(s), (long long)s->info->max_context);
        return http_send_error(s, c, cc, &err, NULL);
    }
    switch (cc->r) {
    case R_CHAT:
    case R_COMPLETIONS: return http_handle_generate(s, c, cc);
    case R_TOKENIZE:
    case R_DETOKENIZE: return http_handle_tokens(s, c, cc);
    case R_HEALTH: {   /* a lost rank (expert parallelism) makes the server unable to answer */
        char why[1024];
        if (!df_engine_health(s->eng, why, sizeof why)) return http_send_json(s, c, cc, 200, "{\"status\":\"ok\"}");
        json_t *o = json_pack("{s:s,s:s}", "status", "error", "error", why);
        char *t = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        enum MHD_Result r = http_send_json(s, c, cc, 503, t);
        free(t);
        return r;
    }
    case R_PAGE:
        if (s->o.api) return s->o.api->send_root(s, c, cc);
        return http_send_text(s, c, cc, 200, "text/html; charset=utf-8", srv_page_html, strlen(srv_page_html), NULL);
    case R_METRICS: {
        text_buf b = {0};
        metrics_text(s, &b);
        enum MHD_Result r = http_send_text(s, c, cc, 200, "text/plain; version=0.0.4", b.p, b.len, NULL);
        text_buf_free(&b);
        return r;
    }
    case R_PROPS: {
        char *b = respond_props_json(s);
        enum MHD_Result r = http_send_json(s, c, cc, 200, b);
        free(b);
        return r;
    }
    case R_MODEL: {
        int known = !strcmp(cc->model_arg, s->model_id);
        for (int i = 0; i < s->o.n_aliases; i++) known |= !strcmp(cc->model_arg, s->o.aliases[i]);
        if (!known) {
            srv_err_set(&err, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.200s' does not exist.", cc->model_arg);
            return http_send_error(s, c, cc, &err, NULL);
        }
    }
        /* fallthrough */
    case R_MODELS: {
        char *b = respond_models_json(s, cc->r == R_MODEL ? cc->model_arg : NULL);
        enum MHD_Result r = http_send_json(s, c, cc, 200, b);
        free(b);
        return r;
    }
    case R_NONE: break;
    default: return s->o.api->handle(s, c, cc);   /* only the API table gives these routes */
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    watch_set(s, c, df_now() + s->o.read_timeout_s);   /* the next request on this connection */
    if (!cc) return;
    *con_cls = NULL;
    if (t != MHD_REQUEST_TERMINATED_COMPLETED_OK && cc->status < 400) cc->status = 499;
    http_conn_unref(cc);
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
    if (pthread_create(&s->reaper, NULL, watch_main, s)) {
        df_error_set(err, DF_EIO, "serve: cannot start the connection watch thread");
        return DF_EIO;
    }
    s->reaper_started = 1;
    unsigned timeout = (unsigned)(s->o.read_timeout_s + 0.999);
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD,
                              0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                              on_connection, s, MHD_OPTION_CONNECTION_LIMIT, conn_limit(s) + MHD_CONN_MARGIN,
                              MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_END);
    if (!s->mhd) {
        df_error_set(err, DF_EIO, "cannot start the HTTP server on %s:%d", s->o.host, s->port);
        return DF_EIO;
    }
    return DF_OK;
}

void http_stop(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv_parse);
    pthread_mutex_unlock(&s->mu);
    if (s->mhd) MHD_stop_daemon(s->mhd);   /* also closes the listening socket it was given */
    else if (s->listen_fd >= 0) close(s->listen_fd);
    s->mhd = NULL;
    s->listen_fd = -1;
    pthread_mutex_lock(&s->cw_mu);
    s->cw_stop = 1;
    pthread_cond_broadcast(&s->cw_cv);
    pthread_mutex_unlock(&s->cw_mu);
    if (s->reaper_started) pthread_join(s->reaper, NULL);
    s->reaper_started = 0;
}
