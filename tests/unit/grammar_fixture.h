/* grammar_fixture.h — what the grammar tests share: a schema compiled into a finished grammar, and a text
 * run through it from the start. */
#ifndef DF_TEST_GRAMMAR_FIXTURE_H
#define DF_TEST_GRAMMAR_FIXTURE_H

#include <string.h>
#include "sample/grammar.h"

static grammar *build(const char *schema, df_error *err) {
    grammar *g = grammar_new();
    int id = grammar_add_schema(g, schema, strlen(schema), err);
    if (id < 0 || grammar_finish(g, id, err)) {
        grammar_free(g);
        return NULL;
    }
    return g;
}

/* 1: the whole text is accepted and complete, 0: accepted but incomplete, -1: refused */
static int run(const grammar *g, const char *text) {
    grammar_state s;
    grammar_state_init(g, &s);
    if (grammar_feed(g, &s, (const uint8_t *)text, strlen(text))) return -1;
    return grammar_accepting(g, &s);
}

#endif
