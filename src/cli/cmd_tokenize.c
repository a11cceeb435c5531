/* cmd_tokenize.c — `deltafin tokenize` (placeholder until its issue lands). */
#include <stdio.h>
#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "deltafin %s: not implemented yet\n", argv[0]);
    return 2;
}
