/* fuzz_schema.c — libFuzzer target for the JSON-schema compiler of constrained output: any text compiles or
 * is refused with a message; the work stays within the node budget; an accepted schema's machine reaches a
 * complete document by following its own shortest completion, one byte at a time, in exactly the bytes it
 * promised (so no state on that way is a dead end), and every document it so writes is valid JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "sample/grammar_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    grammar *g = grammar_new();
    df_error err = {0};
    int id = grammar_add_schema(g, (const char *)data, size, &err);
    int rc = id < 0 ? DF_EINVAL : grammar_finish(g, id, &err);
    DF_ASSERT(g->n <= GRAMMAR_MAX_NODES + 4 * MAX_KEYS + 16);
    if (rc) {
        DF_ASSERT(err.code && err.msg[0]);
        grammar_free(g);
        return 0;
    }
    grammar_state s;
    grammar_state_init(g, &s);
    uint32_t left = grammar_min_len(g);
    DF_ASSERT(left < GRAMMAR_INF && grammar_cost(g, &s) == left);
    char *doc = xmalloc((size_t)left + 1);
    for (uint32_t k = 0; k < left; k++) {
        int found = 0;
        for (int b = 0; b < 256 && !found; b++) {
            grammar_state t;
            grammar_state_copy(&t, &s);
            uint8_t byte = (uint8_t)b;
            if (!grammar_feed(g, &t, &byte, 1) && grammar_cost(g, &t) == left - k - 1) {
                grammar_state_copy(&s, &t);
                doc[k] = (char)byte;
                found = 1;
            }
        }
        DF_ASSERT(found);   /* a dead end: no byte continues the promised completion */
    }
    DF_ASSERT(grammar_accepting(g, &s));
    json_error_t je;
    json_t *v = json_loadb(doc, left, JSON_DECODE_ANY, &je);
    DF_ASSERT(v);
    json_decref(v);
    free(doc);
    grammar_free(g);
    return 0;
}
