/* test_grammar.c — the JSON-schema machine of src/sample/grammar.c: byte strings it must accept or refuse,
 * tokens that span several states, forced completion under a tight token budget, and random schemas whose
 * every generated document must parse (jansson) and validate (a small validator written here, independent
 * of the machine). Prints the mask's cost per token on the bundled model's vocabulary (and on a larger one
 * when GRAMMAR_BENCH_TIKTOKEN names a tiktoken file). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sample/grammar.h"
#include "test.h"
#include "grammar_fixture.h"

static void expect_doc(const char *schema, const char *text, int want) {
    df_error err = {0};
    grammar *g = build(schema, &err);
    int got = g ? run(g, text) : -9;
    CHECK(got == want, "schema %s: '%s' -> %d (want %d) %s", schema, text, got, want, err.msg);
    grammar_free(g);
}

static void test_accept_reject(void) {
    const char *obj = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                      "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},\"required\":[\"name\"],"
                      "\"additionalProperties\":false}";
    expect_doc(obj, "{\"name\":\"Bob\"}", 1);
    expect_doc(obj, "{\"age\":30,\"name\":\"Al\"}", 1);
    expect_doc(obj, "{ \"name\" : \"Al\" , \"age\" : 7 }", 1);
    expect_doc(obj, "{\"age\":30}", -1);               /* required name missing at '}' */
    expect_doc(obj, "{\"name\":\"Bob\",\"x\":1}", -1);  /* unknown key */
    expect_doc(obj, "{\"name\":\"Robert\"}", -1);       /* maxLength 5 */
    expect_doc(obj, "{\"name\":\"A\",\"age\":151}", -1);
    expect_doc(obj, "{\"name\":\"A\",\"age\":-1}", -1);
    expect_doc(obj, "{\"name\":\"A\",\"age\":01}", -1);
    expect_doc(obj, "{\"name\":\"A\",\"name\":\"B\"}", -1);   /* a key twice */
    expect_doc(obj, "{\"name\":\"A\"", 0);
    expect_doc(obj, "{\"name\":\"A\"}\n", -1);          /* nothing after the document */
    expect_doc(obj, " {\"name\":\"A\"}", -1);
    expect_doc(obj, "{\"name\":\"A\",         \"age\":1}", -1);   /* whitespace run over the cap */
    const char *arr = "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":2.25},"
                      "\"minItems\":2,\"maxItems\":3}";
    expect_doc(arr, "[1,2.25]", 1);
    expect_doc(arr, "[-1.5,0.125,2]", 1);
    expect_doc(arr, "[1]", -1);
    expect_doc(arr, "[1,2,0,1]", -1);
    expect_doc(arr, "[2.26,1]", -1);
    expect_doc(arr, "[-1.51,1]", -1);
    expect_doc(arr, "[1e3,1]", -1);
    expect_doc(arr, "[1.,1]", -1);
    expect_doc(arr, "[-0.5,0]", 1);
    expect_doc("{\"type\":\"integer\",\"minimum\":-5}", "-0", -1);   /* never generated: "0" is the zero */
    expect_doc("{\"type\":\"integer\",\"minimum\":-5}", "-5", 1);
    const char *en = "{\"enum\":[\"red\",\"green\",1,10,null]}";
    expect_doc(en, "\"red\"", 1);
    expect_doc(en, "\"gre\"", -1);
    expect_doc(en, "1", 1);
    expect_doc(en, "10", 1);
    expect_doc(en, "11", -1);
    expect_doc(en, "null", 1);
    const char *un = "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"exclusiveMinimum\":0}],\"title\":\"t\"}";
    expect_doc(un, "\"x\\n\\u00e9\\\"\"", 1);
    expect_doc(un, "3", 1);
    expect_doc(un, "0", -1);
    expect_doc(un, "\"\\ud800\"", -1);
    expect_doc(un, "\"\x01\"", -1);
    expect_doc(un, "\"\xc3\xa9\"", 1);
    expect_doc(un, "\"\xc3\"", -1);
    expect_doc("{\"type\":[\"boolean\",\"null\"]}", "false", 1);
    expect_doc("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"", 1);
    expect_doc("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", -1);
    expect_doc("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-31T23:59:00Z\"", -1);   /* day 31 */
    expect_doc("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-21T23:59:00Z\"", 1);
    expect_doc("{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", 1);
    expect_doc("{\"type\":\"string\",\"format\":\"email\"}", "\"john.doe@example.com\"", 1);
    expect_doc("{\"type\":\"string\",\"format\":\"email\"}", "\"@example.com\"", -1);
    const char *rec = "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                      "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"v\"],"
                      "\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}";
    expect_doc(rec, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", 1);
    expect_doc(rec, "{\"v\":1,\"kids\":[{}]}", -1);
    expect_doc("{\"type\":\"object\"}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", 1);

    df_error err = {0};
    const char *refused[] = {"{\"type\":\"string\",\"pattern\":\"a+\"}", "{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}",
                             "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "{\"$ref\":\"#/nowhere\"}",
                             "{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{}}", "[1,2]", "{\"type\":\"thing\"}"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        memset(&err, 0, sizeof err);
        CHECK(grammar_check_schema(refused[i], strlen(refused[i]), &err) != DF_OK && err.msg[0],
              "refused: %s (%s)", refused[i], err.msg);
    }
}

/* ---- an independent validator for the generated documents ---- */

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int valid_date(const char *s) {
    if (strlen(s) < 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2))
        return 0;
    int mo = atoi(s + 5), d = atoi(s + 8);
    return mo >= 1 && mo <= 12 && d >= 1 && d <= 28;
}

static int valid_time(const char *s) {
    return strlen(s) == 9 && digits(s, 2) && s[2] == ':' && digits(s + 3, 2) && s[5] == ':' && digits(s + 6, 2) &&
           s[8] == 'Z' && atoi(s) < 24 && atoi(s + 3) < 60 && atoi(s + 6) < 60;
}

static int validate(const json_t *v, const json_t *s, const json_t *root) {
    if (json_is_true(s)) return 1;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const char *r = json_string_value(ref);
        return validate(v, json_object_get(json_object_get(root, "$defs"), r + 8), root);
    }
    json_t *en = json_object_get(s, "enum");
    if (en) {
        size_t i;
        json_t *e;
        json_array_foreach(en, i, e) if (json_equal(e, v)) return 1;
        return 0;
    }
    json_t *any = json_object_get(s, "anyOf");
    if (any) {
        size_t i;
        json_t *e;
        json_array_foreach(any, i, e) if (validate(v, e, root)) return 1;
        return 0;
    }
    json_t *type = json_object_get(s, "type");
    const char *t = json_string_value(type);
    if (!t) return 1;
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        size_t i;
        json_t *r;
        json_array_foreach(req, i, r) if (!json_object_get(v, json_string_value(r))) return 0;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            json_t *ps = json_object_get(props, k);
            if (!ps && json_is_false(json_object_get(s, "additionalProperties"))) return 0;
            if (ps && !validate(x, ps, root)) return 0;
        }
        return 1;
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (mn && json_array_size(v) < (size_t)json_integer_value(mn)) return 0;
        if (mx && json_array_size(v) > (size_t)json_integer_value(mx)) return 0;
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) if (!validate(x, json_object_get(s, "items"), root)) return 0;
        return 1;
    }
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return 0;
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength"),
               *f = json_object_get(s, "format");
        size_t n = utf8_chars(json_string_value(v));
        if (mn && n < (size_t)json_integer_value(mn)) return 0;
        if (mx && n > (size_t)json_integer_value(mx)) return 0;
        const char *sv = json_string_value(v);
        if (f && !strcmp(json_string_value(f), "date")) return strlen(sv) == 10 && valid_date(sv);
        if (f && !strcmp(json_string_value(f), "date-time"))
            return strlen(sv) == 20 && valid_date(sv) && sv[10] == 'T' && valid_time(sv + 11);
        return 1;
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        if (!strcmp(t, "integer") ? !json_is_integer(v) : !json_is_number(v)) return 0;
        double x = json_number_value(v);
        json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
        if (mn && x < json_number_value(mn)) return 0;
        if (mx && x > json_number_value(mx)) return 0;
        return 1;
    }
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return 0;
}

/* ---- random schemas ---- */

static uint64_t rnd_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return (uint32_t)(rnd_state >> 11) % n;
}

static json_t *random_schema(int depth) {
    int kind = (int)rnd(depth > 2 ? 6 : 8);
    switch (kind) {
    case 0: {
        json_t *s = json_pack("{s:s}", "type", "string");
        if (rnd(2)) json_object_set_new(s, "minLength", json_integer(rnd(4)));
        if (rnd(2)) json_object_set_new(s, "maxLength", json_integer(4 + rnd(8)));
        return s;
    }
    case 1: {
        json_t *s = json_pack("{s:s}", "type", "integer");
        long long lo = (long long)rnd(2000) - 1000;
        if (rnd(2)) json_object_set_new(s, "minimum", json_integer(lo));
        if (rnd(2)) json_object_set_new(s, "maximum", json_integer(lo + (long long)rnd(5000)));
        return s;
    }
    case 2: {
        json_t *s = json_pack("{s:s}", "type", "number");
        double lo = ((double)rnd(20000) - 10000) / 64;
        if (rnd(2)) json_object_set_new(s, "minimum", json_real(lo));
        if (rnd(2)) json_object_set_new(s, "maximum", json_real(lo + (double)rnd(3000) / 8));
        return s;
    }
    case 3: return json_pack("{s:[s,s,i,b]}", "enum", "alpha", "beta", (int)rnd(100), 1);
    case 4: return rnd(2) ? json_pack("{s:s}", "type", "boolean") : json_pack("{s:[s,s]}", "type", "string", "null");
    case 5: return json_pack("{s:s,s:s}", "type", "string", "format", rnd(2) ? "date" : "date-time");
    case 6: {
        json_t *s = json_pack("{s:s,s:o}", "type", "array", "items", random_schema(depth + 1));
        int mn = (int)rnd(3);
        json_object_set_new(s, "minItems", json_integer(mn));
        if (rnd(2)) json_object_set_new(s, "maxItems", json_integer(mn + (int)rnd(3)));
        return s;
    }
    default: {
        json_t *props = json_object(), *req = json_array();
        int n = 1 + (int)rnd(4);
        for (int i = 0; i < n; i++) {
            char k[8];
            snprintf(k, sizeof k, "k%d", i);
            json_object_set_new(props, k, random_schema(depth + 1));
            if (rnd(2)) json_array_append_new(req, json_string(k));
        }
        return json_pack("{s:s,s:o,s:o,s:b}", "type", "object", "properties", props, "required", req,
                         "additionalProperties", 0);
    }
    }
}

/* Generates under the mask with random logits; returns the text, *complete = ended by eos. */
static char *generate_timed(const grammar *g, const grammar_vocab *v, const tokenizer *t, int32_t eos, int max_tokens,
                            int *complete, int *stuck, double *mask_s, int *steps) {
    int nv = tokenizer_n_vocab(t);
    float *logits = xmalloc((size_t)nv * sizeof *logits);
    grammar_mask m;
    grammar_mask_init(&m, g, v, eos);
    char *out = xcalloc(1, 1);
    size_t len = 0;
    *complete = *stuck = 0;
    for (int i = 0; i < max_tokens; i++) {
        for (int k = 0; k < nv; k++) logits[k] = (float)rnd(1000) / 100.0f;
        if (!grammar_mask_apply(&m, logits, nv, max_tokens - i)) {
            *stuck = 1;
            break;
        }
        int32_t best = 0;
        for (int k = 1; k < nv; k++)
            if (logits[k] > logits[best]) best = k;
        if (best == eos) {
            *complete = 1;
            break;
        }
        if (grammar_mask_accept(&m, best)) {
            *stuck = 1;
            break;
        }
        size_t n;
        const uint8_t *b = tokenizer_token_bytes(t, best, &n);
        out = xrealloc(out, len + n + 1);
        memcpy(out + len, b, n);
        len += n;
        out[len] = 0;
    }
    if (mask_s && m.n_steps)
        printf("# grammar mask: %.0f token bytes run through the machine per step (the rest pruned by shared "
               "prefixes or judged by length)\n", (double)m.n_checked / (double)m.n_steps);
    if (mask_s) *mask_s = m.seconds;
    if (steps) *steps = (int)m.n_steps;
    grammar_mask_free(&m);
    free(logits);
    return out;
}

static char *generate(const grammar *g, const grammar_vocab *v, const tokenizer *t, int32_t eos, int max_tokens,
                      int *complete, int *stuck) {
    return generate_timed(g, v, t, eos, max_tokens, complete, stuck, NULL, NULL);
}

/* The mask (prefix walk, plain-text shortcut inside strings, budget rule) against a token-by-token check. */
static int mask_matches_reference(const grammar_mask *m, const tokenizer *t, int budget, int *n_allowed) {
    int32_t room = budget - 2;   /* this token and the end token */
    if ((int64_t)grammar_cost(m->g, &m->st) > (int64_t)room + 1) room = INT32_MAX;
    *n_allowed = 0;
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        size_t n;
        const uint8_t *b = tokenizer_token_bytes(t, id, &n);
        int want = 0;
        if (id == m->eos_id) {
            want = grammar_accepting(m->g, &m->st);
        } else if (b && n && !m->st.done) {
            grammar_state s2;
            grammar_state_copy(&s2, &m->st);
            int rc = tokenizer_is_special(t, id) ? grammar_feed_token(m->g, &s2, id) : grammar_feed(m->g, &s2, b, n);
            want = !rc && room >= 0 && grammar_cost(m->g, &s2) <= (uint32_t)room;
        }
        *n_allowed += want;
        if (want != m->allow[id]) return 0;
    }
    return 1;
}

static void test_mask_reference(const tokenizer *t, const grammar_vocab *v, int32_t eos) {
    int steps = 0, same = 0, allowed_total = 0;
    int nv = tokenizer_n_vocab(t);
    float *logits = xmalloc((size_t)nv * sizeof *logits);
    for (int it = 0; it < 8; it++) {
        json_t *s = random_schema(0);
        char *st = json_dumps(s, JSON_COMPACT);
        df_error err = {0};
        grammar *g = build(st, &err);
        if (g) {
            grammar_mask m;
            grammar_mask_init(&m, g, v, eos);
            int max_tokens = (int)grammar_min_len(g) + 1 + (int)rnd(60);
            for (int i = 0; i < max_tokens; i++) {
                for (int k = 0; k < nv; k++) logits[k] = (float)rnd(1000);
                grammar_mask_apply(&m, logits, nv, max_tokens - i);
                int na;
                steps++;
                same += mask_matches_reference(&m, t, max_tokens - i, &na);
                allowed_total += na;
                int32_t best = 0;
                for (int k = 1; k < nv; k++)
                    if (logits[k] > logits[best]) best = k;
                if (best == eos || grammar_mask_accept(&m, best)) break;
            }
            grammar_mask_free(&m);
            grammar_free(g);
        }
        free(st);
        json_decref(s);
    }
    free(logits);
    CHECK(steps > 20 && same == steps, "mask equals a token-by-token check at %d/%d steps (%d allowed in all)", same,
          steps, allowed_total);
}

static void test_random(const tokenizer *t, const grammar_vocab *v, int32_t eos) {
    int n_ok = 0, n = 60, tight_ok = 0;
    char first_bad[600] = "";
    for (int it = 0; it < n; it++) {
        json_t *s = random_schema(0);
        char *st = json_dumps(s, JSON_COMPACT);
        df_error err = {0};
        grammar *g = build(st, &err);
        if (!g) {
            snprintf(first_bad, sizeof first_bad, "compile %s: %s", st, err.msg);
            free(st);
            json_decref(s);
            continue;
        }
        /* exactly enough tokens for the shortest document plus the end token, or some slack */
        int slack = it % 3 == 0 ? 0 : (int)rnd(40);
        int max_tokens = (int)grammar_min_len(g) + 1 + slack;
        int complete, stuck;
        char *doc = generate(g, v, t, eos, max_tokens, &complete, &stuck);
        json_error_t je;
        json_t *val = json_loads(doc, JSON_DECODE_ANY, &je);
        int ok = complete && !stuck && val && validate(val, s, s);
        if (ok) n_ok++;
        if (ok && slack == 0) tight_ok++;
        if (!ok && !first_bad[0])
            snprintf(first_bad, sizeof first_bad, "schema %s budget %d -> '%s' (complete %d stuck %d)", st,
                     max_tokens, doc, complete, stuck);
        json_decref(val);
        free(doc);
        free(st);
        grammar_free(g);
        json_decref(s);
    }
    CHECK(n_ok == n, "%d/%d random schemas: every document complete, parses and validates (%d with zero slack) %s",
          n_ok, n, tight_ok, first_bad);
}

/* Tokens that cross several states: `."` ends a string's text and the string, `,"` separates members and
 * opens the next key, `"What` opens a string and writes into it. */
static int32_t find_token(const tokenizer *t, const char *text) {
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        size_t n;
        const uint8_t *b = tokenizer_token_bytes(t, id, &n);
        if (b && !tokenizer_is_special(t, id) && n == strlen(text) && !memcmp(b, text, n)) return id;
    }
    return -1;
}

static int allowed_after(const grammar *g, const grammar_vocab *v, int32_t eos, const char *prefix, int32_t id,
                         int budget) {
    grammar_mask m;
    grammar_mask_init(&m, g, v, eos);
    grammar_feed(g, &m.st, (const uint8_t *)prefix, strlen(prefix));
    float *logits = xcalloc(8192, sizeof *logits);
    grammar_mask_apply(&m, logits, 0, budget);
    int ok = id >= 0 && m.allow[id];
    free(logits);
    grammar_mask_free(&m);
    return ok;
}

static void test_multi_state(const tokenizer *t, const grammar_vocab *v, int32_t eos) {
    df_error err = {0};
    grammar *g = build("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}},"
                       "\"required\":[\"a\"],\"additionalProperties\":false}", &err);
    int32_t dq = find_token(t, ".\""), cq = find_token(t, ",\""), what = find_token(t, "\"What");
    CHECK(dq >= 0 && allowed_after(g, v, eos, "{\"a\":\"x", dq, 100), "token '.\"' (%d) allowed inside a string", dq);
    CHECK(cq >= 0 && allowed_after(g, v, eos, "{\"a\":\"x\"", cq, 100), "token ',\"' (%d) allowed before key b", cq);
    CHECK(!allowed_after(g, v, eos, "{\"a\":\"x\",\"b\":\"y\"", cq, 100), "token ',\"' refused when no key is left");
    CHECK(what >= 0 && allowed_after(g, v, eos, "{\"a\":", what, 100), "token '\"What' allowed as a value's start");
    CHECK(!allowed_after(g, v, eos, "{\"a\":\"x", eos, 100), "end of message refused inside the document");
    CHECK(allowed_after(g, v, eos, "{\"a\":\"x\"}", eos, 100), "end of message allowed after the document");
    /* 3 tokens left (this one, one more, the end): each allowed token must leave at most 1 byte to write */
    grammar_mask m;
    grammar_mask_init(&m, g, v, eos);
    grammar_feed(g, &m.st, (const uint8_t *)"{\"a\":\"x", 7);
    int nv = tokenizer_n_vocab(t), all_short = 1, n_allowed = 0;
    float *logits = xcalloc((size_t)nv, sizeof *logits);
    grammar_mask_apply(&m, logits, nv, 3);
    for (int32_t id = 0; id < nv; id++)
        if (m.allow[id]) {
            size_t n;
            const uint8_t *b = tokenizer_token_bytes(t, id, &n);
            grammar_state s2;
            grammar_state_copy(&s2, &m.st);
            n_allowed++;
            if (grammar_feed(g, &s2, b, n) || grammar_cost(g, &s2) > 1) all_short = 0;
        }
    CHECK(all_short && n_allowed >= 2 && m.allow[dq] && !m.allow[find_token(t, "x")],
          "budget 3: %d tokens allowed, each leaves at most one byte to write", n_allowed);
    grammar_mask_free(&m);
    free(logits);
    grammar_free(g);
}

static void bench(const char *what, const tokenizer *t, int32_t eos) {
    grammar_vocab *v = grammar_vocab_new(t);
    df_error err = {0};
    grammar *g = build("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\","
                       "\"items\":{\"type\":\"string\"}},\"n\":{\"type\":\"number\"}},\"required\":[\"name\",\"tags\",\"n\"],"
                       "\"additionalProperties\":false}", &err);
    int complete, stuck;
    double mask_s = 0;
    int steps = 0;
    char *doc = generate_timed(g, v, t, eos, 120, &complete, &stuck, &mask_s, &steps);
    printf("# grammar mask on %s (%d tokens): %.1f us per token (mask only, %d tokens of a JSON document)\n", what,
           tokenizer_n_vocab(t), steps ? mask_s / steps * 1e6 : 0.0, steps);
    CHECK(complete && !stuck, "bench document on %s completes within its budget", what);
    free(doc);
    grammar_free(g);
    grammar_vocab_free(v);
}

int main(void) {
    test_accept_reject();
    tokenizer *t = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_dir(&t, "models/default", &err) == DF_OK, "load models/default tokenizer (%s)", err.msg);
    if (!t) TEST_EXIT();
    int32_t eos = tokenizer_special_id(t, "<|im_end|>");
    grammar_vocab *v = grammar_vocab_new(t);
    test_multi_state(t, v, eos);
    test_mask_reference(t, v, eos);
    test_random(t, v, eos);
    grammar_vocab_free(v);
    bench("models/default", t, eos);
    tokenizer_free(t);
    const char *big = getenv("GRAMMAR_BENCH_TIKTOKEN");
    if (big && tokenizer_load_tiktoken(&t, big, TOK_PATTERN_CL100K, &err) == DF_OK) {
        tokenizer_add_special(t, "<|end|>", tokenizer_n_vocab(t), &err);
        bench(big, t, tokenizer_special_id(t, "<|end|>"));
        tokenizer_free(t);
    }
    TEST_EXIT();
}
