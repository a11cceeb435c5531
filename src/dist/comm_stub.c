/* comm_stub.c — comm.h for a build without MPI: a world of one rank. Started by a launcher for more than one
 * rank, it says that this build cannot join them instead of running N unrelated copies. */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

struct df_comm {
    char host[64];
    int failed;
};

static int launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 0;
}

int comm_open(dist_comm **out, int *argc, char ***argv, df_error *err) {
    (void)argc, (void)argv;
    *out = NULL;
    if (launcher_size() > 1)
        return df_error_set(err, DF_EUNSUPPORTED, "started by an MPI launcher for %d ranks, but this deltafin was "
                            "built without MPI (install libopenmpi-dev or libmpich-dev and rebuild)",
                            launcher_size()), DF_EUNSUPPORTED;
    dist_comm *c = xcalloc(1, sizeof *c);
    if (gethostname(c->host, sizeof c->host - 1)) snprintf(c->host, sizeof c->host, "localhost");
    *out = c;
    return DF_OK;
}

void comm_close(dist_comm *c, int failed) {
    (void)failed;
    free(c);
}

int comm_rank(const dist_comm *c) { return (void)c, 0; }
int comm_size(const dist_comm *c) { return (void)c, 1; }
const char *comm_host(const dist_comm *c) { return c->host; }
double comm_timeout(const dist_comm *c) { return (void)c, DIST_TIMEOUT_DEFAULT_S; }
void comm_fail(dist_comm *c) { c->failed = 1; }
int comm_failed(const dist_comm *c) { return c->failed; }
void comm_counters(const dist_comm *c, dist_counters *out) { (void)c, memset(out, 0, sizeof *out); }

int comm_send(dist_comm *c, int peer, int tag, const void *buf, size_t n, df_error *err) {
    (void)c, (void)tag, (void)buf, (void)n;
    return df_error_set(err, DF_EINVAL, "no rank %d: this build runs one rank (no MPI)", peer), DF_EINVAL;
}

int comm_recv(dist_comm *c, int peer, int tag, dist_buf *b, size_t max, double timeout_s, df_error *err) {
    (void)c, (void)tag, (void)b, (void)max, (void)timeout_s;
    return df_error_set(err, DF_EINVAL, "no rank %d: this build runs one rank (no MPI)", peer), DF_EINVAL;
}

void dist_buf_free(dist_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
