/* bench_streams.h — the streams `deltafin bench` decodes: N independent greedy generations, each with its own
 * session and pseudo-random prompt, evaluated together through the library's batch API (prompts in passes of
 * a bounded number of rows, then one pass per decode step with one row per stream), and the number of unique
 * (layer, expert) pairs a prefill needed, counted from the routing trace (bench_streams.c). */
#ifndef DF_BENCH_STREAMS_H
#define DF_BENCH_STREAMS_H

#include <stdint.h>
#include "deltafin.h"

typedef struct bench_streams {
    int n, prompt, vocab;     /* streams, prompt tokens of each, vocabulary */
    df_session **s;           /* [n] */
    df_session **saved;       /* [n] copies for re-running the last pass, or NULL */
    df_batch *batch;
    int32_t *ids;             /* [n][prompt]: stream k's prompt; stream 0's is the single-stream bench's */
    float *logits;            /* [n][vocab]: each stream's logits after its latest token */
} bench_streams;

/* n streams with prompts of `prompt` tokens; with_saved: also the sessions bench_streams_save copies into. */
int bench_streams_init(bench_streams *b, df_engine *eng, int n, int prompt, int with_saved, df_error *err);
void bench_streams_free(bench_streams *b);
/* Consumes every stream's prompt in passes of at most `rows` rows: streams in order, each taking as large a
 * slice as the pass has room for (so a pass may hold the end of one prompt and the start of the next).
 * *passes gets how many passes it took; b->logits then holds each stream's logits after its prompt. */
int bench_streams_prefill(bench_streams *b, int rows, int *passes, df_error *err);
/* One pass: tok[k] appended to stream k, its logits written to logits + k * vocab. */
int bench_streams_eval(bench_streams *b, const int32_t *tok, float *logits, df_error *err);
/* Copies every stream's state to its saved session / back from it. */
int bench_streams_save(bench_streams *b, df_error *err);
int bench_streams_restore(bench_streams *b, df_error *err);
/* Bytes every stream's session holds (saved copies included). */
uint64_t bench_streams_memory(const bench_streams *b);

/* Unique (layer, expert) pairs among the records of a routing trace (residency/trace.h format) from byte `from`
 * to its end, and in *asked the sum of the records' sizes (what storage counted as expert requests); -1 when
 * the file cannot be read. */
int64_t bench_trace_unique(const char *path, int64_t from, uint64_t *asked);

#endif
