/* remote.c — range requests over libcurl's multi interface (see remote.h). One background thread owns the
 * multi handle: callers queue transfers and wait; the thread starts at most `jobs` at a time, checks each
 * answer as its first body bytes arrive (so a 200 that would send a whole 16 GB shard is cut off at once),
 * and requeues transient faults with a delay. The multi handle's connection cache is the keep-alive pool. */
#include "remote.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

#define REMOTE_WHOLE_MAX (256u << 20)   /* metadata files (index, tokenizer) are far smaller */
#define REMOTE_BACKOFF_MAX 8.0
#define REMOTE_ERROR_BODY_MAX (1u << 20)

enum { FAULT_NONE, FAULT_TRANSIENT, FAULT_PERMANENT };

typedef struct batch {
    int left;
    int rc;
    df_error err;
    pthread_cond_t cv;
} batch;

typedef struct xfer {
    struct remote *r;
    remote_req *q;
    batch *b;
    int whole;                   /* whole file into buf (no Range) */
    char *buf;                   /* whole mode */
    size_t buf_len;
    CURL *h;
    char *url;                   /* URL this attempt asks */
    int via_cache;               /* url is a remembered redirect target */
    uint64_t got;                /* bytes delivered, all attempts */
    uint64_t a_start;            /* first byte asked this attempt */
    int attempt;
    double not_before;
    /* this attempt's answer */
    int checked;
    long code;
    int has_cr;
    uint64_t cr_a, cr_b, cr_total;
    double retry_after;
    char etag[65];               /* this answer's ETag when it is a SHA-256 (an LFS file) */
    char linked_etag[65];        /* X-Linked-Etag of any answer in the redirect chain (the hub's LFS hash) */
    uint64_t discarded;
    int fault;
    char why[600];
    struct xfer *next;
} xfer;

struct remote {
    char *base;
    remote_opts o;
    struct curl_slist *hdrs;
    CURLM *multi;
    pthread_t th;
    pthread_mutex_t mu;
    int stop;
    xfer *head, *tail;           /* waiting to start */
    int active;
    CURL **idle;
    int n_idle;
    char **redir_file, **redir_url;
    int n_redir;
    atomic_uint_fast64_t requests, bytes, retries, connects;
};

const char *remote_base(const remote *r) { return r->base; }

/* ---------------------------------------------------------------------------------------------------- */
/* Remembered redirect targets (the hub answers every file with a redirect to a signed CDN URL). */

/* Called with r->mu held. */
static char *remote_redir_get(remote *r, const char *file) {
    for (int i = 0; i < r->n_redir; i++)
        if (!strcmp(r->redir_file[i], file)) return xstrdup(r->redir_url[i]);
    return NULL;
}

static void remote_redir_set(remote *r, const char *file, const char *url) {
    pthread_mutex_lock(&r->mu);
    int i = 0;
    while (i < r->n_redir && strcmp(r->redir_file[i], file)) i++;
    if (i == r->n_redir) {
        r->redir_file = xrealloc(r->redir_file, sizeof *r->redir_file * (size_t)(i + 1));
        r->redir_url = xrealloc(r->redir_url, sizeof *r->redir_url * (size_t)(i + 1));
        r->redir_file[i] = xstrdup(file);
        r->n_redir++;
    } else {
        free(r->redir_url[i]);
    }
    r->redir_url[i] = url ? xstrdup(url) : NULL;
    if (!url) {   /* forget: move the last entry here */
        free(r->redir_file[i]);
        r->n_redir--;
        r->redir_file[i] = r->redir_file[r->n_redir];
        r->redir_url[i] = r->redir_url[r->n_redir];
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Callbacks: run on the background thread. */

static void xfer_fault(xfer *x, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void xfer_fault(xfer *x, int kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof x->why, fmt, ap);
    va_end(ap);
    x->fault = kind;
}

/* Digits only (sscanf's %llu would take "-1" as 2^64-1); 0 past 2^62. */
static const char *remote_parse_u64(const char *p, uint64_t *v) {
    *v = 0;
    if (*p < '0' || *p > '9') return NULL;
    for (; *p >= '0' && *p <= '9'; p++) {
        *v = *v * 10 + (uint64_t)(*p - '0');
        if (*v > (1ull << 62)) return NULL;
    }
    return p;
}

/* " bytes a-b/total" with a <= b < total; 0 for anything else (a "*" total included). */
static int remote_parse_range(const char *p, uint64_t *a, uint64_t *b, uint64_t *total) {
    while (*p == ' ' || *p == '\t') p++;
    if (strncasecmp(p, "bytes", 5) || (p[5] != ' ' && p[5] != '\t')) return 0;
    p += 5;
    while (*p == ' ' || *p == '\t') p++;
    if (!(p = remote_parse_u64(p, a)) || *p++ != '-' || !(p = remote_parse_u64(p, b)) || *p++ != '/' ||
        !(p = remote_parse_u64(p, total)))
        return 0;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return !*p && *a <= *b && *b < *total;
}

/* An ETag value that is a SHA-256 ("hex", W/"hex" or bare hex) into out as lowercase hex; else unchanged. */
static void remote_parse_sha(const char *p, char out[65]) {
    while (*p == ' ' || *p == '\t') p++;
    if (!strncmp(p, "W/", 2)) p += 2;
    if (*p == '"') p++;
    char h[65];
    for (int i = 0; i < 64; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return;
        h[i] = (char)(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
    }
    const char *q = p + 64;
    if (*q == '"') q++;
    while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
    if (*q) return;
    h[64] = 0;
    memcpy(out, h, 65);
}

static size_t xfer_header(char *p, size_t size, size_t n, void *ctx) {
    xfer *x = ctx;
    size_t len = size * n;
    char line[256];
    size_t k = DF_MIN(len, sizeof line - 1);
    memcpy(line, p, k);
    line[k] = 0;
    if (!strncmp(line, "HTTP/", 5)) {   /* a new response (after a redirect, or 100 Continue) */
        x->has_cr = 0;
        x->retry_after = -1;
        x->etag[0] = 0;
    } else if (!strncasecmp(line, "ETag:", 5)) {
        remote_parse_sha(line + 5, x->etag);
    } else if (!strncasecmp(line, "X-Linked-Etag:", 14)) {
        remote_parse_sha(line + 14, x->linked_etag);
    } else if (!strncasecmp(line, "Content-Range:", 14)) {
        x->has_cr = remote_parse_range(line + 14, &x->cr_a, &x->cr_b, &x->cr_total) ? 1 : -1;
    } else if (!strncasecmp(line, "Retry-After:", 12)) {
        char *end;
        double v = strtod(line + 12, &end);
        if (end != line + 12 && v >= 0) x->retry_after = v;
    }
    return len;
}

static int xfer_check_first(xfer *x) {
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->code);
    x->checked = 1;
    if (x->whole) {
        if (x->code == 200) return 1;
    } else if (x->code == 206) {
        uint64_t b = x->q->off + x->q->len - 1;
        if (x->has_cr != 1 || x->cr_a != x->a_start || x->cr_b != b) {
            xfer_fault(x, FAULT_PERMANENT, "wrong Content-Range (asked bytes %llu-%llu, got %s)",
                       (unsigned long long)x->a_start, (unsigned long long)b,
                       x->has_cr == 1 ? "another range" : x->has_cr ? "an unparsable one" : "none");
            if (x->has_cr == 1)
                snprintf(x->why + strlen(x->why), sizeof x->why - strlen(x->why), ": bytes %llu-%llu/%llu",
                         (unsigned long long)x->cr_a, (unsigned long long)x->cr_b, (unsigned long long)x->cr_total);
            return 0;
        }
        return 1;
    } else if (x->code == 200) {
        xfer_fault(x, FAULT_PERMANENT, "server answered 200 (whole file) instead of 206 to a range request; it "
                   "does not support ranges");
        return 0;
    }
    return 1;   /* an error status: its small body is discarded and the status judged when done */
}

static size_t xfer_write(char *p, size_t size, size_t n, void *ctx) {
    xfer *x = ctx;
    size_t len = size * n;
    if (!x->checked && !xfer_check_first(x)) return 0;
    if (!(x->whole ? x->code == 200 : x->code == 206)) {
        x->discarded += len;
        return x->discarded > REMOTE_ERROR_BODY_MAX ? 0 : len;
    }
    atomic_fetch_add(&x->r->bytes, len);
    if (x->whole) {
        if (x->buf_len + len > REMOTE_WHOLE_MAX) {
            xfer_fault(x, FAULT_PERMANENT, "file larger than %u MiB", REMOTE_WHOLE_MAX >> 20);
            return 0;
        }
        x->buf = xrealloc(x->buf, x->buf_len + len + 1);
        memcpy(x->buf + x->buf_len, p, len);
        x->buf_len += len;
        return len;
    }
    remote_req *q = x->q;
    if (x->got + len > q->len) {
        xfer_fault(x, FAULT_PERMANENT, "server sent more bytes than the %llu asked", (unsigned long long)q->len);
        return 0;
    }
    if (q->dst) {
        memcpy(q->dst + x->got, p, len);
    } else {
        df_error e = {0};
        if (q->sink(q->ctx, x->got, (const uint8_t *)p, len, &e)) {
            xfer_fault(x, FAULT_PERMANENT, "%s", e.msg);
            return 0;
        }
    }
    x->got += len;
    return len;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Starting and judging transfers (background thread). */

static void xfer_start(remote *r, xfer *x) {
    CURL *h = r->n_idle ? r->idle[--r->n_idle] : curl_easy_init();
    if (!h) df_die("curl_easy_init failed");
    curl_easy_reset(h);
    x->h = h;
    free(x->url);
    x->url = x->whole ? NULL : remote_redir_get(r, x->q->file);
    x->via_cache = x->url != NULL;
    if (!x->url) {
        size_t n = strlen(r->base) + strlen(x->q->file) + 2;
        x->url = xmalloc(n);
        snprintf(x->url, n, "%s/%s", r->base, x->q->file);
    }
    x->checked = 0;
    x->code = 0;
    x->has_cr = 0;
    x->retry_after = -1;
    x->discarded = 0;
    x->fault = FAULT_NONE;
    x->why[0] = 0;
    x->a_start = x->q->off + x->got;
    char range[64];
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)x->a_start,
             (unsigned long long)(x->q->off + x->q->len - 1));
    curl_easy_setopt(h, CURLOPT_URL, x->url);
    if (!x->whole) curl_easy_setopt(h, CURLOPT_RANGE, range);
    if (!x->via_cache && r->hdrs) curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(r->o.connect_s * 1000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(r->o.stall_s + 0.999));
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "deltafin");
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, xfer_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, xfer_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_PRIVATE, x);
    curl_multi_add_handle(r->multi, h);
    r->active++;
}

/* Classifies a finished attempt: sets x->fault (NONE = success) and x->why. */
static void xfer_judge(remote *r, xfer *x, CURLcode res) {
    if (x->fault) return;   /* set by a callback, which aborted the transfer */
    if (res != CURLE_OK) {
        switch (res) {
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            xfer_fault(x, FAULT_PERMANENT, "cannot resolve the host name (DNS failure: %s)", curl_easy_strerror(res));
            return;
        case CURLE_OPERATION_TIMEDOUT:
            xfer_fault(x, FAULT_TRANSIENT, "stalled (less than 1 KiB/s for %.0f s, or no connection in %.0f s)",
                       r->o.stall_s, r->o.connect_s);
            return;
        case CURLE_PARTIAL_FILE:
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_COULDNT_CONNECT:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
        case CURLE_SSL_CONNECT_ERROR:
            xfer_fault(x, FAULT_TRANSIENT, "%s", curl_easy_strerror(res));
            return;
        default:
            xfer_fault(x, FAULT_PERMANENT, "%s", curl_easy_strerror(res));
            return;
        }
    }
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->code);
    if (!x->checked && (x->whole ? x->code == 200 : x->code == 206 || x->code == 200) && !xfer_check_first(x))
        return;   /* an empty body: the status checks still apply */
    if (x->whole ? x->code == 200 : x->code == 206) {
        if (!x->whole && x->got < x->q->len)
            xfer_fault(x, FAULT_TRANSIENT, "short body: %llu of %llu bytes", (unsigned long long)(x->got - (x->a_start - x->q->off)),
                       (unsigned long long)(x->q->off + x->q->len - x->a_start));
        return;
    }
    long c = x->code;
    if (x->via_cache && (c == 401 || c == 403 || c == 404 || c == 410)) {
        remote_redir_set(r, x->q->file, NULL);   /* an expired signed URL: ask the original again */
        xfer_fault(x, FAULT_TRANSIENT, "redirect target answered HTTP %ld", c);
        x->attempt--;                            /* not the server's fault */
    } else if (c == 429 || c == 500 || c == 502 || c == 503 || c == 504) {
        xfer_fault(x, FAULT_TRANSIENT, "HTTP %ld%s", c, x->retry_after >= 0 ? " (with Retry-After)" : "");
    } else if (c == 404) {
        xfer_fault(x, FAULT_PERMANENT, "not found (HTTP 404)");
    } else if (c == 401 || c == 403) {
        xfer_fault(x, FAULT_PERMANENT, "access denied (HTTP %ld): a gated or private repository needs HF_TOKEN", c);
    } else if (c == 416) {
        xfer_fault(x, FAULT_PERMANENT, "range not satisfiable (HTTP 416): the file is shorter than its header says");
    } else {
        xfer_fault(x, FAULT_PERMANENT, "unexpected HTTP status %ld", c);
    }
}

static void xfer_finish(remote *r, xfer *x, CURLcode res) {
    xfer_judge(r, x, res);
    long redirects = 0, conns = 0;
    curl_easy_getinfo(x->h, CURLINFO_REDIRECT_COUNT, &redirects);
    curl_easy_getinfo(x->h, CURLINFO_NUM_CONNECTS, &conns);
    atomic_fetch_add(&r->requests, 1 + (uint64_t)redirects);
    atomic_fetch_add(&r->connects, (uint64_t)conns);
    if (!x->fault && !x->whole && !x->via_cache && redirects > 0) {
        char *eff = NULL;
        curl_easy_getinfo(x->h, CURLINFO_EFFECTIVE_URL, &eff);
        if (eff) remote_redir_set(r, x->q->file, eff);
    }
    curl_multi_remove_handle(r->multi, x->h);
    pthread_mutex_lock(&r->mu);
    r->idle = xrealloc(r->idle, sizeof *r->idle * (size_t)(r->n_idle + 1));
    r->idle[r->n_idle++] = x->h;
    x->h = NULL;
    r->active--;
    x->attempt++;
    x->q->attempts = x->attempt;
    if (x->fault == FAULT_TRANSIENT && x->attempt < r->o.attempts) {
        atomic_fetch_add(&r->retries, 1);
        double d = r->o.backoff_s;
        for (int i = 1; i < x->attempt && d < REMOTE_BACKOFF_MAX; i++) d *= 2;
        d = DF_MIN(d, REMOTE_BACKOFF_MAX);
        if (x->retry_after >= 0) d = DF_MIN(x->retry_after, r->o.retry_after_max_s);
        x->not_before = df_now() + d;
        x->next = NULL;
        if (r->tail) r->tail->next = x;
        else r->head = x;
        r->tail = x;
    } else {
        batch *b = x->b;
        x->q->rc = x->fault ? DF_EIO : DF_OK;
        if (x->fault && !b->rc) {
            b->rc = DF_EIO;
            char range[80] = "";
            if (!x->whole)
                snprintf(range, sizeof range, " bytes %llu-%llu", (unsigned long long)x->q->off,
                         (unsigned long long)(x->q->off + x->q->len - 1));
            df_error_set(&b->err, DF_EIO, "%s: GET %s%s: %s%s", x->q->what ? x->q->what : x->q->file, x->url, range,
                         x->fault == FAULT_TRANSIENT ? "gave up after repeated faults, last: " : "", x->why);
            if (x->fault == FAULT_TRANSIENT)
                snprintf(b->err.msg + strlen(b->err.msg), sizeof b->err.msg - strlen(b->err.msg), " (%d attempts)",
                         x->attempt);
        }
        if (--b->left == 0) pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static void *remote_main(void *arg) {
    remote *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        if (r->stop && !r->head && !r->active) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        double now = df_now(), wait = 1.0;
        xfer **pp = &r->head, *prev = NULL;
        while (*pp && r->active < r->o.jobs) {
            xfer *x = *pp;
            if (x->not_before > now) {
                wait = DF_MIN(wait, x->not_before - now);
                prev = x;
                pp = &x->next;
                continue;
            }
            *pp = x->next;
            if (r->tail == x) r->tail = prev;
            xfer_start(r, x);
        }
        pthread_mutex_unlock(&r->mu);
        int running = 0;
        curl_multi_perform(r->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(r->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                xfer *x = NULL;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
                xfer_finish(r, x, m->data.result);
            }
        /* sleep only when nothing queued could start now (a finished transfer frees a slot) */
        pthread_mutex_lock(&r->mu);
        now = df_now();
        for (xfer *x = r->head; x && r->active < r->o.jobs; x = x->next) wait = DF_MIN(wait, x->not_before - now);
        pthread_mutex_unlock(&r->mu);
        if (wait > 0) curl_multi_poll(r->multi, NULL, 0, (int)(wait * 1000) + 1, NULL);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------- */

static int remote_run(remote *r, xfer *xs, int n, df_error *err) {
    batch b = {.left = n};
    pthread_cond_init(&b.cv, NULL);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n; i++) {
        xs[i].r = r;
        xs[i].b = &b;
        xs[i].q->rc = DF_OK;
        xs[i].next = NULL;
        if (r->tail) r->tail->next = &xs[i];
        else r->head = &xs[i];
        r->tail = &xs[i];
    }
    pthread_mutex_unlock(&r->mu);
    curl_multi_wakeup(r->multi);
    pthread_mutex_lock(&r->mu);
    while (b.left > 0) pthread_cond_wait(&b.cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pthread_cond_destroy(&b.cv);
    for (int i = 0; i < n; i++) free(xs[i].url);
    if (b.rc) *err = b.err;
    return b.rc;
}

int remote_fetch(remote *r, remote_req *reqs, int n, df_error *err) {
    if (n <= 0) return DF_OK;
    xfer *xs = xcalloc((size_t)n, sizeof *xs);
    for (int i = 0; i < n; i++) {
        DF_ASSERT(reqs[i].len > 0 && (reqs[i].dst || reqs[i].sink));
        xs[i].q = &reqs[i];
    }
    int rc = remote_run(r, xs, n, err);
    free(xs);
    return rc;
}

int remote_file_info(remote *r, const char *file, uint64_t *size, char sha256[65], df_error *err) {
    uint8_t one;
    remote_req q = {.file = file, .off = 0, .len = 1, .what = file, .dst = &one};
    xfer x = {.q = &q};
    int rc = remote_run(r, &x, 1, err);
    *size = rc ? 0 : x.cr_total;
    if (sha256) snprintf(sha256, 65, "%s", rc ? "" : x.linked_etag[0] ? x.linked_etag : x.etag);
    return rc;
}

int remote_file_size(remote *r, const char *file, uint64_t *size, df_error *err) {
    return remote_file_info(r, file, size, NULL, err);
}

int remote_get_file(remote *r, const char *file, char **data, size_t *len, int *missing, df_error *err) {
    remote_req q = {.file = file, .off = 0, .len = 1, .what = file};
    xfer x = {.q = &q, .whole = 1};
    *data = NULL;
    *len = 0;
    *missing = 0;
    int rc = remote_run(r, &x, 1, err);
    if (rc && x.code == 404) {
        *missing = 1;
        rc = DF_OK;
        err->code = DF_OK;
    }
    if (rc || *missing) {
        free(x.buf);
        return rc;
    }
    if (!x.buf) x.buf = xmalloc(1);
    x.buf[x.buf_len] = 0;
    *data = x.buf;
    *len = x.buf_len;
    return DF_OK;
}

void remote_get_stats(remote *r, remote_stats *o) {
    o->requests = atomic_load(&r->requests);
    o->bytes = atomic_load(&r->bytes);
    o->retries = atomic_load(&r->retries);
    o->connects = atomic_load(&r->connects);
}

int remote_open(remote **out, const char *base, const remote_opts *opts, df_error *err) {
    *out = NULL;
    if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8))
        return df_error_set(err, DF_EINVAL, "%s: not an http(s) URL", base), DF_EINVAL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT))
        return df_error_set(err, DF_EIO, "libcurl failed to initialise"), DF_EIO;
    remote *r = xcalloc(1, sizeof *r);
    r->base = xstrdup(base);
    size_t bl = strlen(r->base);
    while (bl > 0 && r->base[bl - 1] == '/') r->base[--bl] = 0;
    if (opts) r->o = *opts;
    if (r->o.jobs <= 0) r->o.jobs = 8;
    if (r->o.stall_s <= 0) r->o.stall_s = 30;
    if (r->o.connect_s <= 0) r->o.connect_s = 15;
    if (r->o.attempts <= 0) r->o.attempts = 6;
    if (r->o.backoff_s <= 0) r->o.backoff_s = 0.25;
    if (r->o.retry_after_max_s <= 0) r->o.retry_after_max_s = 30;
    const char *tok = r->o.token ? r->o.token : getenv("HF_TOKEN");
    r->o.token = NULL;
    if (tok && *tok) {
        size_t n = strlen(tok) + 32;
        char *h = xmalloc(n);
        snprintf(h, n, "Authorization: Bearer %s", tok);
        r->hdrs = curl_slist_append(NULL, h);
        free(h);
    }
    r->multi = curl_multi_init();
    curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r->o.jobs);
    curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, (long)r->o.jobs * 2);
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->th, NULL, remote_main, r)) df_die("cannot start the HTTP thread");
    *out = r;
    return DF_OK;
}

void remote_free(remote *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_mutex_unlock(&r->mu);
    curl_multi_wakeup(r->multi);
    pthread_join(r->th, NULL);
    for (int i = 0; i < r->n_idle; i++) curl_easy_cleanup(r->idle[i]);
    free(r->idle);
    curl_multi_cleanup(r->multi);
    curl_slist_free_all(r->hdrs);
    for (int i = 0; i < r->n_redir; i++) free(r->redir_file[i]), free(r->redir_url[i]);
    free(r->redir_file);
    free(r->redir_url);
    pthread_mutex_destroy(&r->mu);
    free(r->base);
    free(r);
}

char *remote_resolve_base(const char *from, df_error *err) {
    if (!strncmp(from, "http://", 7) || !strncmp(from, "https://", 8)) return xstrdup(from);
    const char *slash = strchr(from, '/');
    if (!slash || slash == from || !slash[1] || strchr(slash + 1, '/') || strstr(from, ".."))
        return df_error_set(err, DF_EINVAL, "'%s': expected an http(s) URL or a hub repository id 'org/name[@rev]'",
                            from), NULL;
    const char *ep = getenv("HF_ENDPOINT");
    if (!ep || !*ep) ep = "https://huggingface.co";
    const char *at = strchr(from, '@');
    size_t nl = at ? (size_t)(at - from) : strlen(from);
    const char *rev = at && at[1] ? at + 1 : "main";
    size_t n = strlen(ep) + nl + strlen(rev) + 16;
    char *u = xmalloc(n);
    snprintf(u, n, "%s%s%.*s/resolve/%s", ep, ep[strlen(ep) - 1] == '/' ? "" : "/", (int)nl, from, rev);
    return u;
}
