/* cli.h — the `deltafin` subcommands; each lives in its own cmd_*.c and returns the process exit code. */
#ifndef DF_CLI_H
#define DF_CLI_H

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
/* `deltafin bench` other than `bench kernels` (bench_model.c); argv[0] is "bench". */
int bench_model(int argc, char **argv);
/* `deltafin bench rollback` (bench_rollback.c); argv[0] is "rollback". */
int bench_rollback(int argc, char **argv);

/* Bundled default model folder: $DELTAFIN_MODEL, else models/default (relative to the working folder). */
const char *cli_default_model(void);

#endif
