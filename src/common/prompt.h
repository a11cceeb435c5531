/* prompt.h — the fixture prompt format shared by `deltafin logits` and the parity tests. */
#ifndef DF_PROMPT_H
#define DF_PROMPT_H

#include <stdint.h>
#include "deltafin.h"

/* Reads {"prefill":[ids],"decode":[ids]} (prefill non-empty, decode optional); arrays are malloc'ed. */
int prompt_read_file(const char *path, int32_t **prefill, int *np, int32_t **decode, int *nd, df_error *err);

#endif
