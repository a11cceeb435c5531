/* cmd_run.c — `deltafin run`. */
#include <stdio.h>
#include "cli.h"

int cmd_run(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
