/* cmd_info.c — `deltafin info`. */
#include <stdio.h>
#include "cli.h"

int cmd_info(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
