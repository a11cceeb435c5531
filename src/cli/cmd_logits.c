/* cmd_logits.c — `deltafin logits`. */
#include <stdio.h>
#include "cli.h"

int cmd_logits(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
