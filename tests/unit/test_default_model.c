/* test_default_model.c — the bundled model (models/default) through the engine reproduces the greedy
 * continuations transformers computed from the same stored weights (models/default/reference.json), and its
 * tokenizer gives the reference prompt ids. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "deltafin.h"
#include "common/util.h"
#include "tokenizer/tokenizer.h"

#define MODEL "models/default"

static int32_t *json_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = xmalloc((*n + 1) * sizeof(int32_t));
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void check_case(df_engine *eng, const tokenizer *tok, json_t *c, int idx) {
    int np, ng;
    int32_t *prompt = json_ids(json_object_get(c, "prompt_ids"), &np);
    int32_t *want = json_ids(json_object_get(c, "greedy"), &ng);
    const char *text = json_string_value(json_object_get(c, "prompt"));
    tok_ids enc = {0};
    df_error err = {0};
    int rc = tokenizer_encode(tok, text, strlen(text), 0, &enc, &err);
    CHECK(!rc && enc.n == (size_t)np && !memcmp(enc.v, prompt, np * sizeof(int32_t)),
          "case %d: tokenizer gives the reference prompt ids", idx);
    df_session *s = NULL;
    int V = df_engine_info(eng)->vocab_size, same = 0;
    float *logits = xmalloc((size_t)V * sizeof(float));
    rc = df_session_init(&s, eng, &err);
    if (!rc) rc = df_session_eval(s, prompt, np, logits, 0, &err);
    for (int i = 0; !rc && i < ng; i++) {
        int32_t next = argmax(logits, V);
        if (next != want[i]) break;
        same++;
        if (i + 1 < ng) rc = df_session_eval(s, &next, 1, logits, 0, &err);
    }
    CHECK(!rc && same == ng, "case %d: %d of %d greedy tokens match transformers%s%s", idx, same, ng,
          rc ? ": " : "", rc ? err.msg : "");
    df_session_free(s);
    free(logits);
    free(prompt);
    free(want);
    tok_ids_free(&enc);
}

int main(void) {
    json_error_t jerr;
    json_t *ref = json_load_file(MODEL "/reference.json", 0, &jerr);
    CHECK(ref != NULL, "reference.json loads");
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.model_dir = MODEL;
    df_engine *eng = NULL;
    tokenizer *tok = NULL;
    df_error err = {0};
    int rc = df_engine_open(&eng, &o, &err);
    if (!rc) rc = tokenizer_load_dir(&tok, MODEL, &err);
    CHECK(!rc, "default model and tokenizer open (%s)", rc ? err.msg : "ok");
    json_t *cases = ref ? json_object_get(ref, "cases") : NULL;
    CHECK(json_array_size(cases) >= 2, "reference has %zu cases", json_array_size(cases));
    for (size_t i = 0; !rc && i < json_array_size(cases); i++) check_case(eng, tok, json_array_get(cases, i), (int)i);
    tokenizer_free(tok);
    df_engine_free(eng);
    json_decref(ref);
    TEST_EXIT();
}
