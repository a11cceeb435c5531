/* fuzz_config.c — libFuzzer target for the config.json parser: any text parses or is refused with a message
 * naming the file; an accepted config has sane sizes and its parameter counts compute without overflow. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = xmalloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    df_config c;
    df_error err = {0};
    if (config_parse(&c, text, "fuzz/config.json", &err)) {
        DF_ASSERT(err.code && strstr(err.msg, "fuzz/config.json"));
        free(text);
        return 0;
    }
    DF_ASSERT(c.n_layers >= 1 && c.n_layers <= CONFIG_MAX_LAYERS && c.vocab > 0 && c.d > 0);
    /* the real values the forward pass multiplies and divides by are finite, and signed as it needs them */
    DF_ASSERT(isfinite(c.eps) && c.eps > 0 && isfinite(c.routed_scale) && c.routed_scale > 0);
    DF_ASSERT(isfinite(c.situ_beta) && c.situ_beta > 0 && isfinite(c.situ_lin_beta));
    DF_ASSERT(!c.has_lower_bound || (isfinite(c.lower_bound) && c.lower_bound < 0));
    DF_ASSERT(c.max_ctx > 0 && c.bos_id < c.vocab && c.eos_id < c.vocab);
    for (int i = 0; i < c.n_layers; i++) DF_ASSERT(c.mixer[i] <= MIXER_MLA && c.ffn[i] <= FFN_MOE);
    df_param_counts pc;
    config_param_counts(&c, &pc);   /* UBSan: no signed overflow */
    config_free(&c);
    free(text);
    return 0;
}
