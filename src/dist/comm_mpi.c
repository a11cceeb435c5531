/* comm_mpi.c — comm.h over MPI: point-to-point messages only (MPI_Isend/MPI_Iprobe polled against deadlines,
 * never a blocking wait), MPI_THREAD_SERIALIZED with one lock around every MPI call so that the heartbeat thread
 * and the caller's thread take turns, errors returned instead of aborting (MPI_ERRORS_RETURN). */
#include "comm.h"

#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define TAG_HEARTBEAT 10
#define HOST_MAX 64
/* Joining the job (the host names' exchange) may wait this long for every rank to start. */
#define OPEN_TIMEOUT_S 60.0

struct df_comm {
    int rank, size;
    char (*hosts)[HOST_MAX];       /* per rank */
    double timeout;                /* liveness, seconds */
    double delay_s;                /* emulated link latency added to every send */
    pthread_mutex_t mu;            /* held around every MPI call */
    pthread_t hb;
    int hb_running;
    atomic_int stop, failed;
    _Atomic int64_t *heard_ns;     /* per rank: when anything was last received from it */
    MPI_Request *hb_req;           /* per rank: the heartbeat in flight to it, or MPI_REQUEST_NULL */
    char hb_byte;
    dist_counters n;               /* under mu */
};

static int64_t now_ns(void) { return (int64_t)(df_now() * 1e9); }

/* Peers this rank exchanges heartbeats with. */
static int comm_talks_to(const dist_comm *c, int peer) { return peer != c->rank && (c->rank == 0 || peer == 0); }

static void comm_note_heard(dist_comm *c, int peer) {
    if (peer >= 0 && peer < c->size) atomic_store(&c->heard_ns[peer], now_ns());
}

static void mpi_err_text(int code, char *buf) {
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", code);
}

static void *comm_heartbeat(void *arg) {
    dist_comm *c = arg;
    while (!atomic_load(&c->stop)) {
        pthread_mutex_lock(&c->mu);
        for (int p = 0; p < c->size; p++) {
            if (!comm_talks_to(c, p)) continue;
            int done = 1;
            if (c->hb_req[p] != MPI_REQUEST_NULL && MPI_Test(&c->hb_req[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                done = 0;
            if (done) MPI_Isend(&c->hb_byte, 1, MPI_BYTE, p, TAG_HEARTBEAT, MPI_COMM_WORLD, &c->hb_req[p]);
        }
        for (int k = 0; k < 4 * c->size; k++) {   /* what arrived since */
            int flag = 0;
            MPI_Status st;
            if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_HEARTBEAT, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS || !flag) break;
            char b;
            MPI_Recv(&b, 1, MPI_BYTE, st.MPI_SOURCE, TAG_HEARTBEAT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            comm_note_heard(c, st.MPI_SOURCE);
        }
        pthread_mutex_unlock(&c->mu);
        struct timespec ts = {0, (long)(DIST_HEARTBEAT_S * 1e9)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Waiting for a message: spin briefly (a reply is often microseconds away), then sleep in short steps so that
 * a rank waiting on another leaves it the cores. */
static void comm_backoff(double waited) {
    if (waited < 100e-6) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited < 5e-3 ? 20000 : 200000};
    nanosleep(&ts, NULL);
}

static int launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return getenv("PMIX_RANK") || getenv("PMI_RANK") ? 2 : 0;
}

static double env_seconds(const char *name, double def, double lo, double hi) {
    const char *v = getenv(name);
    char *end;
    double x = v ? strtod(v, &end) : def;
    return v && (end == v || *end || !(x >= lo && x <= hi)) ? def : x;
}

int comm_open(dist_comm **out, int *argc, char ***argv, df_error *err) {
    dist_comm *c = xcalloc(1, sizeof *c);
    *out = c;
    c->size = 1;
    c->timeout = env_seconds("DELTAFIN_RANK_TIMEOUT", DIST_TIMEOUT_DEFAULT_S, 0.5, 3600);
    c->delay_s = env_seconds("DELTAFIN_NET_DELAY_US", 0, 0, 1e6) * 1e-6;
    c->hosts = xcalloc(1, sizeof *c->hosts);
    if (gethostname(c->hosts[0], HOST_MAX - 1)) snprintf(c->hosts[0], HOST_MAX, "localhost");
    pthread_mutex_init(&c->mu, NULL);
    if (launcher_size() < 1) return DF_OK;   /* not started by a launcher: one rank, no MPI */
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
        *out = NULL;
        free(c->hosts);
        free(c);
        return df_error_set(err, DF_EIO, "MPI_Init_thread failed (error %d)", rc), DF_EIO;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    if (provided < MPI_THREAD_SERIALIZED) {
        df_error_set(err, DF_EUNSUPPORTED, "rank %d: the MPI library gives thread level %d; Deltafin needs "
                     "MPI_THREAD_SERIALIZED (its heartbeat thread)", c->rank, provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char name[MPI_MAX_PROCESSOR_NAME + 1] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    free(c->hosts);
    c->hosts = xcalloc((size_t)c->size, sizeof *c->hosts);
    snprintf(c->hosts[c->rank], HOST_MAX, "%s", name);
    c->heard_ns = xcalloc((size_t)c->size, sizeof *c->heard_ns);
    c->hb_req = xmalloc(sizeof *c->hb_req * (size_t)c->size);
    for (int p = 0; p < c->size; p++) c->hb_req[p] = MPI_REQUEST_NULL, c->heard_ns[p] = now_ns();
    /* host names: a non-blocking all-gather polled against a deadline (a rank that never starts is an error) */
    MPI_Request q;
    char (*all)[HOST_MAX] = xcalloc((size_t)c->size, sizeof *all);
    memcpy(all[c->rank], c->hosts[c->rank], HOST_MAX);
    rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, HOST_MAX, MPI_CHAR, MPI_COMM_WORLD, &q);
    double t0 = df_now();
    for (int done = 0; rc == MPI_SUCCESS && !done;) {
        rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE);
        if (!done && df_now() - t0 > OPEN_TIMEOUT_S) {
            df_error_set(err, DF_EIO, "rank %d (%s): not every one of the job's %d ranks started within %.0f s",
                         c->rank, c->hosts[c->rank], c->size, OPEN_TIMEOUT_S);
            free(all);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (!done) comm_backoff(df_now() - t0);
    }
    if (rc == MPI_SUCCESS) memcpy(c->hosts, all, (size_t)c->size * HOST_MAX);
    free(all);
    if (c->size > 1) c->hb_running = !pthread_create(&c->hb, NULL, comm_heartbeat, c);
    return DF_OK;
}

void comm_close(dist_comm *c, int failed) {
    if (!c) return;
    if (c->hb_running) {
        atomic_store(&c->stop, 1);
        pthread_join(c->hb, NULL);
    }
    /* After a loss MPI_Finalize could wait forever for the lost rank: this process leaves without it, and the
     * launcher, seeing a rank end without finalizing, ends the others. */
    if (c->heard_ns && !failed && !atomic_load(&c->failed)) {
        for (int p = 0; p < c->size; p++)
            if (c->hb_req[p] != MPI_REQUEST_NULL) {
                MPI_Cancel(&c->hb_req[p]);
                MPI_Request_free(&c->hb_req[p]);
            }
        MPI_Finalize();
    }
    pthread_mutex_destroy(&c->mu);
    free(c->heard_ns);
    free(c->hb_req);
    free(c->hosts);
    free(c);
}

int comm_rank(const dist_comm *c) { return c ? c->rank : 0; }
int comm_size(const dist_comm *c) { return c ? c->size : 1; }
const char *comm_host(const dist_comm *c) { return c->hosts[c->rank]; }
double comm_timeout(const dist_comm *c) { return c->timeout; }
void comm_fail(dist_comm *c) { atomic_store(&c->failed, 1); }
int comm_failed(const dist_comm *c) { return atomic_load(&c->failed); }

void comm_counters(const dist_comm *c, dist_counters *out) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *out = c->n;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

static int comm_peer_ok(dist_comm *c, int peer, df_error *err) {
    if (peer >= 0 && peer < c->size && peer != c->rank && c->heard_ns) return DF_OK;
    return df_error_set(err, DF_EINVAL, "rank %d: no rank %d in a job of %d", c->rank, peer, c->size), DF_EINVAL;
}

/* Silent for longer than the liveness timeout, or past the caller's deadline: the error names the peer. */
static int comm_check_peer(dist_comm *c, int peer, double t0, double limit, const char *what, df_error *err) {
    double t = df_now(), quiet = (double)(now_ns() - atomic_load(&c->heard_ns[peer])) * 1e-9;
    if (quiet > c->timeout) {
        comm_fail(c);
        return df_error_set(err, DF_EIO, "rank %d (%s) has sent nothing for %.1f s while rank %d %s: it died, "
                            "stopped or was cut off", peer, c->hosts[peer], quiet, c->rank, what), DF_EIO;
    }
    if (t - t0 > limit) {
        comm_fail(c);
        return df_error_set(err, DF_EIO, "rank %d (%s) did not answer within %.1f s (rank %d %s)", peer,
                            c->hosts[peer], limit, c->rank, what), DF_EIO;
    }
    return DF_OK;
}

static int comm_mpi_error(dist_comm *c, int peer, int code, const char *what, df_error *err) {
    char text[MPI_MAX_ERROR_STRING + 1] = {0};
    mpi_err_text(code, text);
    comm_fail(c);
    return df_error_set(err, DF_EIO, "rank %d (%s) is lost: %s failed: %s", peer, c->hosts[peer], what, text), DF_EIO;
}

int comm_send(dist_comm *c, int peer, int tag, const void *buf, size_t n, df_error *err) {
    int rc = comm_peer_ok(c, peer, err);
    if (rc) return rc;
    if (n > (size_t)INT32_MAX)
        return df_error_set(err, DF_EINVAL, "rank %d: a message of %zu bytes to rank %d is over the 2 GiB limit",
                            c->rank, n, peer), DF_EINVAL;
    if (c->delay_s > 0)   /* emulated latency: spin, since sleeps this short overshoot */
        for (double t = df_now(); df_now() - t < c->delay_s;) sched_yield();
    MPI_Request q;
    pthread_mutex_lock(&c->mu);
    int mrc = MPI_Isend(buf, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q);
    c->n.bytes_sent += n;
    c->n.msgs_sent++;
    pthread_mutex_unlock(&c->mu);
    if (mrc != MPI_SUCCESS) return comm_mpi_error(c, peer, mrc, "sending", err);
    double t0 = df_now();
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&c->mu);
        mrc = MPI_Test(&q, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&c->mu);
        if (mrc != MPI_SUCCESS) return comm_mpi_error(c, peer, mrc, "sending", err);
        if (done) return DF_OK;
        if ((rc = comm_check_peer(c, peer, t0, 600, "was sending to it", err))) {
            pthread_mutex_lock(&c->mu);
            MPI_Cancel(&q);
            MPI_Request_free(&q);
            pthread_mutex_unlock(&c->mu);
            return rc;
        }
        comm_backoff(df_now() - t0);
    }
}

int comm_recv(dist_comm *c, int peer, int tag, dist_buf *b, size_t max, double timeout_s, df_error *err) {
    int rc = comm_peer_ok(c, peer, err);
    if (rc) return rc;
    double t0 = df_now();
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        pthread_mutex_lock(&c->mu);
        int mrc = MPI_Iprobe(peer, tag, MPI_COMM_WORLD, &flag, &st);
        if (mrc == MPI_SUCCESS && flag) mrc = MPI_Get_count(&st, MPI_BYTE, &count);
        if (mrc == MPI_SUCCESS && flag && count >= 0 && (size_t)count <= max) {
            if ((size_t)count > b->cap) {
                b->cap = (size_t)count + (size_t)count / 2 + 64;
                free(b->p);
                b->p = xmalloc(b->cap);
            }
            /* the message is there (probed), so this receive does not wait */
            mrc = MPI_Recv(b->p, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            b->n = (size_t)count;
            c->n.bytes_recv += (size_t)count;
            c->n.wait_s += df_now() - t0;
        }
        pthread_mutex_unlock(&c->mu);
        if (mrc != MPI_SUCCESS) return comm_mpi_error(c, peer, mrc, "receiving", err);
        if (flag && (count < 0 || (size_t)count > max)) {
            comm_fail(c);
            return df_error_set(err, DF_EFORMAT, "rank %d (%s) sent a message of %d bytes where at most %zu fit",
                                peer, c->hosts[peer], count, max), DF_EFORMAT;
        }
        if (flag) {
            comm_note_heard(c, peer);
            return DF_OK;
        }
        if ((rc = comm_check_peer(c, peer, t0, timeout_s, "waited for it", err))) return rc;
        comm_backoff(df_now() - t0);
    }
}

void dist_buf_free(dist_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
