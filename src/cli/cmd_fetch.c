/* cmd_fetch.c — `deltafin fetch` (placeholder until its issue lands). */
#include <stdio.h>
#include "cli.h"

int cmd_fetch(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
