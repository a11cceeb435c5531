/* bench_model.c — `deltafin bench -m DIR`: the decode benchmark (being written). */
#include <stdio.h>
#include "cli.h"

int bench_model(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: decode benchmark not implemented yet\n", argv[0]);
    return 2;
}
