/* comm.h — the ranks of one job and the messages between them: the only interface the rest of Deltafin has to
 * MPI (comm_mpi.c, standard MPI-3 calls only, so Open MPI and MPICH both work; comm_stub.c, one rank, when the
 * build found no MPI).
 *
 * Every wait has a deadline. Besides the caller's messages each rank keeps a heartbeat going (a thread sends a
 * tiny message every DIST_HEARTBEAT_S to the ranks it talks to and notes what it hears), so a receive tells a
 * slow peer from a lost one: it fails, naming the peer and its host, as soon as the peer has sent nothing at
 * all for the liveness timeout (DELTAFIN_RANK_TIMEOUT seconds, default 5), and in any case after the caller's
 * own deadline. Rank 0 talks to every rank; the others talk to rank 0 only.
 *
 * DELTAFIN_NET_DELAY_US emulates link latency: every send waits that long before it is posted (kernels without
 * netem cannot delay a veth). */
#ifndef DF_DIST_COMM_H
#define DF_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

typedef struct df_comm dist_comm;

/* Message tags the engine uses; the heartbeat's own tag is the comm layer's. */
enum { DIST_TAG_HELLO = 11, DIST_TAG_JOB = 12, DIST_TAG_REPLY = 13, DIST_TAG_SPINE = 14 };

#define DIST_HEARTBEAT_S 0.2
#define DIST_TIMEOUT_DEFAULT_S 5.0

/* A growable receive buffer. */
typedef struct dist_buf {
    void *p;
    size_t n, cap;
} dist_buf;

typedef struct dist_counters {
    uint64_t bytes_sent, bytes_recv, msgs_sent;
    double wait_s;               /* seconds spent waiting in comm_recv for a message not yet there */
} dist_counters;

/* Joins the job a launcher (mpirun, mpiexec) started this process in; without one (no launcher variables in
 * the environment) a world of one rank that needs no MPI at all. A build without MPI under a launcher is an
 * error saying so. */
int comm_open(dist_comm **out, int *argc, char ***argv, df_error *err);
/* Leaves the job: failed = 0 (and no loss seen) after a clean end, when every rank closes (MPI_Finalize); else
 * without finalizing, since a lost peer would make that wait forever: the launcher then ends the other ranks
 * when this process exits. NULL is a no-op. */
void comm_close(dist_comm *c, int failed);
int comm_rank(const dist_comm *c);
int comm_size(const dist_comm *c);
/* The host this rank runs on (MPI_Get_processor_name). */
const char *comm_host(const dist_comm *c);
/* The liveness timeout in seconds. */
double comm_timeout(const dist_comm *c);
/* Sends n bytes to peer under tag; waits (within the deadline) until the buffer may be reused. */
int comm_send(dist_comm *c, int peer, int tag, const void *buf, size_t n, df_error *err);
/* Receives the next message from peer under tag into b (grown as needed; at most max bytes, more is an error),
 * waiting at most timeout_s seconds and no longer than the peer stays silent. */
int comm_recv(dist_comm *c, int peer, int tag, dist_buf *b, size_t max, double timeout_s, df_error *err);
/* Marks the job as failed (a peer lost, a protocol error): comm_close then aborts it. */
void comm_fail(dist_comm *c);
int comm_failed(const dist_comm *c);
void comm_counters(const dist_comm *c, dist_counters *out);

void dist_buf_free(dist_buf *b);

#endif
