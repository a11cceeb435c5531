/* test_schema_limits.c — the JSON-schema compiler against hostile and tricky schemas: families that once
 * compiled in exponential time and memory (a $ref reached twice per level, type lists naming a type twice)
 * must compile in nodes linear in the schema, with this process's peak memory and time bounded loosely;
 * budgets refuse what is larger, naming the limit; every keyword beside $ref or anyOf/oneOf is refused,
 * naming it; enum/const members are checked against the other keywords (an independent check here decides
 * which survive); random walks through the machine never reach a state with no way to finish (email,
 * nesting at the frame limit, recursion); and a tight token budget never leaves the mask with nothing. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/util.h"
#include "sample/grammar_internal.h"
#include "test.h"
#include "grammar_fixture.h"

static uint64_t rnd_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return (uint32_t)((rnd_state >> 11) % n);
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---- pathological families ---- */

/* d_i has two properties that both refer to d_{i+1}: 2^k paths to the last definition. */
static char *refs_doubling(int k) {
    json_t *defs = json_object();
    for (int i = 0; i < k; i++) {
        char name[16], ref[32];
        snprintf(name, sizeof name, "d%d", i);
        snprintf(ref, sizeof ref, "#/$defs/d%d", i + 1);
        json_object_set_new(defs, name, json_pack("{s:s,s:{s:{s:s},s:{s:s}},s:[s]}", "type", "object", "properties",
                                                  "a", "$ref", ref, "b", "$ref", ref, "required", "a"));
    }
    char last[16];
    snprintf(last, sizeof last, "d%d", k);
    json_object_set_new(defs, last, json_pack("{s:s,s:i}", "type", "integer", "maximum", 9));
    json_t *doc = json_pack("{s:s,s:o}", "$ref", "#/$defs/d0", "$defs", defs);
    char *t = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return t;
}

/* each level names object and array twice, with both properties and items holding the level below (the
 * text itself doubles per level) */
static char *types_repeated(int k) {
    json_t *s = json_pack("{s:s}", "type", "boolean");
    for (int i = 0; i < k; i++)
        s = json_pack("{s:[s,s,s,s,s],s:{s:o},s:O}", "type", "object", "array", "object", "array", "null",
                      "properties", "p", s, "items", s);
    char *t = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    return t;
}

/* both at once: a type list per definition, each reaching the next definition four times */
static char *mixed(int k) {
    json_t *defs = json_object();
    for (int i = 0; i < k; i++) {
        char name[16], ref[32];
        snprintf(name, sizeof name, "n%d", i);
        snprintf(ref, sizeof ref, "#/definitions/n%d", i + 1);
        json_object_set_new(defs, name, json_pack("{s:[s,s,s],s:{s:{s:s},s:{s:s}},s:{s:s}}", "type", "object", "array",
                                                  "object", "properties", "x", "$ref", ref, "y", "$ref", ref, "items",
                                                  "$ref", ref));
    }
    char last[16];
    snprintf(last, sizeof last, "n%d", k);
    json_object_set_new(defs, last, json_pack("{s:[s,s]}", "type", "string", "string"));
    json_t *doc = json_pack("{s:s,s:o}", "$ref", "#/definitions/n0", "definitions", defs);
    char *t = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return t;
}

static void test_linear(void) {
    char *(*fam[])(int) = {refs_doubling, types_repeated, mixed};
    const char *names[] = {"$ref twice per level", "type list naming types twice", "type lists and $ref"};
    const int max_k[] = {40, 12, 40};
    long rss0 = peak_rss_kb();
    double t0 = df_now();
    for (int f = 0; f < 3; f++) {
        int linear = 0, n = 0, refused_named = 1;
        size_t biggest = 0;
        int most_nodes = 0;
        for (int k = 1; k <= max_k[f]; k++) {
            char *text = fam[f](k);
            df_error err = {0};
            grammar *g = grammar_new();
            int id = grammar_add_schema(g, text, strlen(text), &err);
            int rc = id < 0 ? -1 : grammar_finish(g, id, &err);
            size_t bytes = strlen(text);
            /* a handful of nodes per schema object, each object at least a few bytes */
            if (g->n <= 64 + 2 * (int)bytes) linear++;
            if (rc && !strstr(err.msg, "limit") && !strstr(err.msg, "nest")) refused_named = 0;
            if (bytes > biggest) biggest = bytes, most_nodes = g->n;
            n++;
            grammar_free(g);
            free(text);
        }
        CHECK(linear == n && refused_named, "%s: %d/%d sizes compile to nodes linear in the schema (%zu bytes: %d "
              "nodes), refusals name their limit", names[f], linear, n, biggest, most_nodes);
    }
    /* ten levels of the mixed family: some 10^7 nodes before compilation was memoised */
    char *text = mixed(10);
    df_error err = {0};
    grammar *g = build(text, &err);
    CHECK(g != NULL && g->n < 200, "a %zu-byte schema of type lists and $refs compiles (%d nodes) %s",
          strlen(text), g ? g->n : -1, err.msg);
    grammar_free(g);
    free(text);
    long grew_mb = (peak_rss_kb() - rss0) / 1024;
    double secs = df_now() - t0;
    CHECK(grew_mb < 256 && secs < 60, "all of them: peak memory grew %ld MiB (bound 256), %.1f s (bound 60)", grew_mb,
          secs);
}

static void test_budgets(void) {
    /* 64 x 64 x 20 leaves: more nodes than the budget, in a 3 MB schema */
    json_t *top = json_object();
    for (int a = 0; a < 64; a++) {
        json_t *mid = json_object();
        for (int b = 0; b < 64; b++) {
            json_t *leaf = json_object();
            for (int c = 0; c < 20; c++) {
                char k[8];
                snprintf(k, sizeof k, "c%d", c);
                json_object_set_new(leaf, k, json_pack("{s:s}", "type", "integer"));
            }
            char k[8];
            snprintf(k, sizeof k, "b%d", b);
            json_object_set_new(mid, k, json_pack("{s:s,s:o}", "type", "object", "properties", leaf));
        }
        char k[8];
        snprintf(k, sizeof k, "a%d", a);
        json_object_set_new(top, k, json_pack("{s:s,s:o}", "type", "object", "properties", mid));
    }
    json_t *doc = json_pack("{s:s,s:o}", "type", "object", "properties", top);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    long rss0 = peak_rss_kb();
    df_error err = {0};
    int rc = grammar_check_schema(text, strlen(text), &err);
    char want[32];
    snprintf(want, sizeof want, "%d", GRAMMAR_MAX_NODES);
    CHECK(rc != DF_OK && strstr(err.msg, want) && strstr(err.msg, "limit"),
          "%zu-byte schema of %d leaves refused at the node budget (%s), peak grew %ld MiB", strlen(text), 64 * 64 * 20,
          err.msg, (peak_rss_kb() - rss0) / 1024);
    free(text);

    json_t *en = json_array();
    char *big = xmalloc(40001);
    memset(big, 'x', 40000);
    big[40000] = 0;
    for (int i = 0; i < 30; i++) {
        big[i] = 'a' + (char)(i % 26);
        big[i + 100] = 'a' + (char)(i / 26);
        json_array_append_new(en, json_string(big));
    }
    free(big);
    doc = json_pack("{s:o}", "enum", en);
    text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    memset(&err, 0, sizeof err);
    rc = grammar_check_schema(text, strlen(text), &err);
    CHECK(rc != DF_OK && strstr(err.msg, "bytes") && strstr(err.msg, "limit"),
          "1.2 MB of enum members refused at the literal budget (%s)", err.msg);
    free(text);
}

/* ---- keywords that cannot be ignored ---- */

static void test_keywords_beside(void) {
    static const char *const kv[][2] = {
        {"type", "\"integer\""}, {"properties", "{\"a\":{}}"}, {"required", "[]"}, {"additionalProperties", "false"},
        {"items", "{}"}, {"minItems", "1"}, {"maxItems", "1"}, {"minLength", "1"}, {"maxLength", "2"},
        {"minimum", "0"}, {"maximum", "5"}, {"exclusiveMinimum", "0"}, {"exclusiveMaximum", "5"}, {"enum", "[1]"},
        {"const", "1"}, {"format", "\"date\""}, {"nullable", "true"}, {"anyOf", "[{}]"}, {"oneOf", "[{}]"}};
    int n = (int)(sizeof kv / sizeof *kv), ref_named = 0, any_named = 0, n_any = 0;
    char first_bad[400] = "";
    for (int i = 0; i < n; i++) {
        char text[300];
        df_error err = {0};
        snprintf(text, sizeof text, "{\"$defs\":{\"a\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/a\",\"%s\":%s}", kv[i][0],
                 kv[i][1]);
        if (grammar_check_schema(text, strlen(text), &err) != DF_OK && strstr(err.msg, kv[i][0])) ref_named++;
        else if (!first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s -> %s", text, err.msg);
        if (!strcmp(kv[i][0], "anyOf")) continue;
        memset(&err, 0, sizeof err);
        snprintf(text, sizeof text, "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"%s\":%s}", kv[i][0],
                 kv[i][1]);
        int rc = grammar_check_schema(text, strlen(text), &err);
        /* enum/const beside anyOf: members are checked against the alternatives, so it may compile */
        int ok = !strcmp(kv[i][0], "enum") || !strcmp(kv[i][0], "const") ? rc == DF_OK
                                                                          : rc != DF_OK && strstr(err.msg, kv[i][0]);
        any_named += ok;
        n_any++;
        if (!ok && !first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s -> %s", text, err.msg);
    }
    CHECK(ref_named == n && any_named == n_any, "constraints beside $ref (%d/%d) and anyOf (%d/%d) refused naming the "
          "keyword %s", ref_named, n, any_named, n_any, first_bad);
    const char *refused[][2] = {{"{\"type\":\"string\",\"format\":\"uri\"}", "uri"},
                                {"{\"type\":\"string\",\"format\":\"ipv4\"}", "ipv4"},
                                {"{\"type\":\"integer\",\"maximum\":5,\"enum\":[10]}", "enum"},
                                {"{\"type\":\"string\",\"const\":3}", "enum"},
                                {"{\"enum\":[1,2],\"const\":3}", "const"},
                                {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":3,"
                                 "\"enum\":[\"ab\"]}}}", "enum"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        df_error err = {0};
        CHECK(grammar_check_schema(refused[i][0], strlen(refused[i][0]), &err) != DF_OK && strstr(err.msg, refused[i][1]),
              "refused naming '%s': %s (%s)", refused[i][1], refused[i][0], err.msg);
    }
    df_error err = {0};
    grammar *g = build("{\"minLength\":3}", &err);
    CHECK(g && run(g, "\"abc\"") == 1 && run(g, "\"ab\"") == -1 && run(g, "1") == -1,
          "minLength without a type: only strings of 3+ characters");
    grammar_free(g);
    g = build("{\"type\":[\"string\",\"string\",\"null\",\"null\"]}", &err);
    CHECK(g && run(g, "\"a\"") == 1 && run(g, "null") == 1 && run(g, "1") == -1, "a type listed twice is merged (%s)",
          err.msg);
    grammar_free(g);
}

/* enum members checked against random bounds: exactly those an independent comparison keeps survive */
static void test_enum_filter(void) {
    int ok = 0, n = 300, refused_right = 0, n_none = 0;
    char first_bad[500] = "";
    for (int it = 0; it < n; it++) {
        json_t *s = json_object(), *en = json_array();
        int kind = (int)rnd(3);
        long long lo = (long long)rnd(60) - 30, hi = lo + (long long)rnd(40) - 5;
        int has_lo = (int)rnd(2), has_hi = (int)rnd(2), ml = (int)rnd(5), xl = ml + (int)rnd(4);
        if (kind == 0) {
            json_object_set_new(s, "type", json_string("integer"));
            if (has_lo) json_object_set_new(s, "minimum", json_integer(lo));
            if (has_hi) json_object_set_new(s, "exclusiveMaximum", json_integer(hi));
        } else if (kind == 1) {
            json_object_set_new(s, "type", json_string("string"));
            json_object_set_new(s, "minLength", json_integer(ml));
            if (has_hi) json_object_set_new(s, "maxLength", json_integer(xl));
        } else {
            json_object_set_new(s, "maximum", json_integer(hi));   /* implies a number */
        }
        int m = 1 + (int)rnd(8), keep[8], n_keep = 0;
        json_t *vals[8];
        for (int i = 0; i < m; i++) {
            if (rnd(4) == 0) vals[i] = json_string("zz");
            else if (kind == 1) {
                char b[12];
                int len = (int)rnd(9);
                for (int c = 0; c < len; c++) b[c] = (char)('a' + rnd(3));
                b[len] = 0;
                vals[i] = json_string(b);
            } else {
                vals[i] = rnd(5) ? json_integer((long long)rnd(80) - 40) : json_real((double)rnd(80) / 4 - 10);
            }
            json_array_append(en, vals[i]);
            int good;
            if (kind == 0) {
                double x = json_number_value(vals[i]);
                good = json_is_integer(vals[i]) && (!has_lo || x >= (double)lo) && (!has_hi || x < (double)hi);
            } else if (kind == 1) {
                size_t len = json_is_string(vals[i]) ? strlen(json_string_value(vals[i])) : 0;
                good = json_is_string(vals[i]) && (int)len >= ml && (!has_hi || (int)len <= xl);
            } else {
                good = json_is_number(vals[i]) && json_number_value(vals[i]) <= (double)hi;
            }
            keep[i] = good;
            n_keep += good;
        }
        json_object_set_new(s, "enum", en);
        char *text = json_dumps(s, JSON_COMPACT);
        df_error err = {0};
        grammar *g = build(text, &err);
        int right;
        if (!n_keep) {
            n_none++;
            right = !g && strstr(err.msg, "enum");
            refused_right += right;
        } else {
            right = g != NULL;
            for (int i = 0; i < m && g; i++) {
                char *d = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
                right &= (run(g, d) == 1) == keep[i];
                free(d);
            }
        }
        ok += right;
        if (!right && !first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s -> %s", text, g ? "wrong members" : err.msg);
        for (int i = 0; i < m; i++) json_decref(vals[i]);
        grammar_free(g);
        free(text);
        json_decref(s);
    }
    CHECK(ok == n, "enum beside bounds/lengths/types: %d/%d schemas keep exactly the members that satisfy them "
          "(%d with none left refused) %s", ok, n, n_none, first_bad);
    CHECK(refused_right == n_none, "no member left: refused naming enum (%d/%d)", refused_right, n_none);
}

/* ---- no dead ends ---- */

/* From s (not refused): the cost is finite, and when the document is not complete some byte lowers it by
 * exactly one (so the completion grammar_cost promises exists); returns 0 on a dead end. */
static int has_way_on(const grammar *g, const grammar_state *s, uint8_t *best) {
    uint32_t c = grammar_cost(g, s);
    if (c >= GRAMMAR_INF) return 0;
    if (c == 0) return grammar_accepting(g, s);
    for (int b = 0; b < 256; b++) {
        grammar_state t;
        grammar_state_copy(&t, s);
        uint8_t byte = (uint8_t)b;
        if (!grammar_feed(g, &t, &byte, 1) && grammar_cost(g, &t) == c - 1) {
            *best = byte;
            return 1;
        }
    }
    return 0;
}

/* A random walk: random accepted bytes (preferring those that open or extend), then the shortest way home.
 * Every state on it must have a way on; returns 0 at the first that has none (text holds the walk). */
static int walk_ok(const grammar *g, int wander, char *text, size_t cap, int *max_depth) {
    grammar_state s;
    grammar_state_init(g, &s);
    size_t len = 0;
    for (int step = 0; step < wander + 4000; step++) {
        uint8_t best;
        if (!has_way_on(g, &s, &best)) return 0;
        if (s.depth > *max_depth) *max_depth = s.depth;
        if (grammar_accepting(g, &s) && (step >= wander || !rnd(8))) return 1;
        uint8_t pick = best;
        if (step < wander) {
            uint8_t ok[256];
            int n = 0;
            for (int b = 0; b < 256; b++) {
                grammar_state t;
                grammar_state_copy(&t, &s);
                uint8_t byte = (uint8_t)b;
                if (!grammar_feed(g, &t, &byte, 1)) ok[n++] = byte;
            }
            if (!n) return grammar_accepting(g, &s);   /* complete, and nothing may follow */
            int deeper = 0;
            for (int i = 0; i < n; i++) deeper += ok[i] == '{' || ok[i] == '[' || ok[i] == '"' || ok[i] == ',';
            if (deeper && rnd(3)) {
                int k = (int)rnd((uint32_t)deeper);
                for (int i = 0; i < n; i++)
                    if ((ok[i] == '{' || ok[i] == '[' || ok[i] == '"' || ok[i] == ',') && k-- == 0) pick = ok[i];
            } else if (n) {
                pick = ok[rnd((uint32_t)n)];
            }
        }
        if (grammar_feed(g, &s, &pick, 1)) return 0;
        if (len + 1 < cap) text[len++] = (char)pick, text[len] = 0;
    }
    return 0;
}

static char *nested_required(int k, int required) {
    json_t *s = json_pack("{s:s}", "type", "integer");
    for (int i = 0; i < k; i++)
        s = required ? json_pack("{s:s,s:{s:o},s:[s]}", "type", "object", "properties", "a", s, "required", "a")
                     : json_pack("{s:s,s:{s:o,s:{s:s}}}", "type", "object", "properties", "a", s, "b", "type", "string");
    char *t = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    return t;
}

static void test_no_dead_end(void) {
    const char *schemas[] = {
        "{\"type\":\"string\",\"format\":\"email\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"email\"},\"minItems\":1}",
        "{\"type\":\"string\",\"format\":\"date-time\"}",
        "{\"type\":\"string\",\"format\":\"uuid\"}",
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"k\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/t\"}",
        "{\"$defs\":{\"l\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/l\"},"
        "\"minItems\":1,\"maxItems\":1}]}},\"$ref\":\"#/$defs/l\"}",
        "{\"type\":\"object\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{}},\"minItems\":2}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"object\",\"additionalProperties\":{\"$ref\":\"#\"}}}",
        "{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"maximum\":0.25}",
    };
    int n_s = (int)(sizeof schemas / sizeof *schemas);
    int walks = 0, good = 0, max_depth = 0;
    char text[8192], bad[600] = "";
    for (int i = 0; i < n_s + 2; i++) {
        df_error err = {0};
        char *owned = i == n_s ? nested_required(60, 0) : i == n_s + 1 ? nested_required(47, 1) : NULL;
        grammar *g = build(owned ? owned : schemas[i], &err);
        if (!g) {
            snprintf(bad, sizeof bad, "compile %s: %s", owned ? owned : schemas[i], err.msg);
            free(owned);
            continue;
        }
        for (int w = 0; w < 60; w++) {
            text[0] = 0;
            int ok = walk_ok(g, 20 + (int)rnd(400), text, sizeof text, &max_depth);
            walks++;
            good += ok;
            if (!ok && !bad[0]) snprintf(bad, sizeof bad, "schema %.200s: dead end after '%.300s'", owned ? owned : schemas[i], text);
        }
        grammar_free(g);
        free(owned);
    }
    CHECK(good == walks && walks == 60 * (n_s + 2), "%d/%d random walks (formats, recursion, nesting to the frame "
          "limit) always had a way to finish, deepest stack %d of %d %s", good, walks, max_depth, GRAMMAR_MAX_DEPTH, bad);
    /* the email local part at its length limit: a dot there could never be followed */
    df_error err = {0};
    grammar *g = build("{\"type\":\"string\",\"format\":\"email\"}", &err);
    char local[64] = "\"";
    for (int i = 0; i < 31; i++) strcat(local, "a");
    strcat(local, ".");
    grammar_state s;
    grammar_state_init(g, &s);
    uint8_t best;
    int fed = !grammar_feed(g, &s, (const uint8_t *)local, strlen(local));
    CHECK(!fed || has_way_on(g, &s, &best), "email: 31 characters then a dot is refused or can go on (fed %d)", fed);
    grammar_free(g);
}

/* Depth: a chain of k required objects needs k + 1 frames; accepted exactly when that fits. */
static void test_depth(void) {
    int right = 0, n = 0;
    char bad[300] = "";
    for (int k = 1; k <= 60; k++) {
        char *text = nested_required(k, 1);
        df_error err = {0};
        grammar *g = build(text, &err);
        int fits = k + 1 <= GRAMMAR_MAX_DEPTH, ok;
        if (fits) {
            int d = 0;
            char w[4096];
            ok = g && walk_ok(g, 0, w, sizeof w, &d);
        } else {
            char want[8];
            snprintf(want, sizeof want, "%d", GRAMMAR_MAX_DEPTH);
            ok = !g && strstr(err.msg, want) != NULL;
        }
        right += ok;
        n++;
        if (!ok && !bad[0]) snprintf(bad, sizeof bad, "k=%d: %s", k, g ? "accepted" : err.msg);
        grammar_free(g);
        free(text);
    }
    CHECK(right == n, "required nesting: %d/%d chains accepted exactly when their %d frames fit, and then finish %s",
          right, n, GRAMMAR_MAX_DEPTH, bad);
}

/* ---- a tight token budget ---- */

static void test_budget(const tokenizer *t, const grammar_vocab *v, int32_t eos) {
    const char *schemas[] = {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":4},"
                             "\"n\":{\"type\":\"integer\"}},\"required\":[\"name\",\"n\"]}",
                             "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date\"},\"minItems\":3}",
                             "{\"enum\":[\"alpha\",\"beta\",12345]}", "{\"type\":\"object\"}"};
    int nv = tokenizer_n_vocab(t), runs = 0, never_stuck = 0;
    float *logits = xmalloc((size_t)nv * sizeof *logits);
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        df_error err = {0};
        grammar *g = build(schemas[i], &err);
        int ml = (int)grammar_min_len(g);
        for (int max_tokens = 1; max_tokens <= ml + 2; max_tokens++) {
            grammar_mask m;
            grammar_mask_init(&m, g, v, eos);
            int stuck = 0, ended = 0;
            for (int k = 0; k < max_tokens; k++) {
                for (int x = 0; x < nv; x++) logits[x] = (float)rnd(1000);
                if (!grammar_mask_apply(&m, logits, nv, max_tokens - k)) {
                    stuck = 1;
                    break;
                }
                int32_t best = 0;
                for (int x = 1; x < nv; x++)
                    if (logits[x] > logits[best]) best = x;
                if (best == eos) {
                    ended = 1;
                    break;
                }
                if (grammar_mask_accept(&m, best)) {
                    stuck = 1;
                    break;
                }
            }
            /* too few tokens for the shortest document: generation runs to max_tokens ("length"), never a
             * forced end of message with half a document */
            runs++;
            never_stuck += !stuck && (ended ? grammar_accepting(g, &m.st) : 1);
            grammar_mask_free(&m);
        }
        grammar_free(g);
    }
    free(logits);
    CHECK(never_stuck == runs, "every budget from 1 token up: the mask always allows a token, and the end token only "
          "after a complete document (%d/%d runs)", never_stuck, runs);
}

int main(void) {
    test_linear();
    test_budgets();
    test_keywords_beside();
    test_enum_filter();
    test_no_dead_end();
    test_depth();
    tokenizer *t = NULL;
    df_error err = {0};
    CHECK(tokenizer_load_dir(&t, "models/default", &err) == DF_OK, "load models/default tokenizer (%s)", err.msg);
    if (!t) TEST_EXIT();
    int32_t eos = tokenizer_special_id(t, "<|im_end|>");
    grammar_vocab *v = grammar_vocab_new(t);
    test_budget(t, v, eos);
    grammar_vocab_free(v);
    tokenizer_free(t);
    TEST_EXIT();
}
