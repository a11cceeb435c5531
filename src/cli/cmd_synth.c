/* cmd_synth.c — `deltafin synth` (placeholder until its issue lands). */
#include <stdio.h>
#include "cli.h"

int cmd_synth(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
