/* cli.h — the `deltafin` subcommands; each lives in its own cmd_*.c and returns the process exit code. */
#ifndef DF_CLI_H
#define DF_CLI_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_fetch(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_warm(int argc, char **argv);
int cmd_place(int argc, char **argv);
int cmd_verify(int argc, char **argv);
/* `deltafin bench` other than `bench kernels` (bench_model.c); argv[0] is "bench". */
int bench_model(int argc, char **argv);
/* `deltafin bench cache --trace FILE` (bench_cache.c): replacement policies replayed on a routing trace. */
int bench_cache(int argc, char **argv);
/* `deltafin bench rollback` (bench_rollback.c); argv[0] is "rollback". */
int bench_rollback(int argc, char **argv);
/* `deltafin bench fetch` (bench_fetch.c); argv[0] is "fetch". */
int bench_fetch(int argc, char **argv);

/* The default model folder: $DELTAFIN_MODEL, else the bundled model found next to the executable
 * (EXE_DIR/models/default), in EXE_DIR/../share/deltafin/models/default (make install) or in
 * ./models/default. Returns the variable's value, a path written into buf, or "models/default" after
 * saying on stderr where it looked when none of them holds a model. */
const char *cli_default_model(char *buf, size_t cap);
/* Expert parallelism: the commands that open a model (run, chat, logits, bench, serve, info) join the job an MPI
 * launcher started them in (sets o->ranks). On a rank other than 0 this serves rank 0's engine until it closes
 * and returns 1, *status being the exit code (an error is printed, naming cmd); alone or on rank 0 it returns 0. */
int cli_rank_serve(df_engine_opts *o, const char *cmd, int *status);

#endif
