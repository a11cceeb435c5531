/* cli_common.c — helpers shared by subcommands. */
#include <stdlib.h>
#include "cli.h"

const char *cli_default_model(void) {
    const char *m = getenv("DELTAFIN_MODEL");
    return m && *m ? m : "models/default";
}
