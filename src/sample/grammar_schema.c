/* grammar_schema.c — compiles a JSON schema (the subset grammar.h lists) into grammar nodes. Every schema
 * object is compiled once and found again through a table keyed by the object, so a $ref target or a part
 * reached along several paths costs one node and a recursive schema becomes a cycle: the work is linear in
 * the schema, and the node and literal budgets refuse what is too large. Keywords that would constrain
 * values beyond what the machine enforces are refused, naming them. */
#include "sample/grammar_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

#define MAX_SCHEMA_NESTING 64

__attribute__((format(printf, 3, 4))) static int schema_fail(df_error *err, const char *path, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    df_error_set(err, DF_EINVAL, "schema%s: %s", path, msg);
    return -1;
}

static int compile(grammar *g, const json_t *s, const char *path, df_error *err);
static int compile_ref(grammar *g, const json_t *t, const char *path, df_error *err);

static const char *const IGNORED_KEYS[] = {"title", "description", "default", "examples", "$schema", "$id",
                                           "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                           "definitions", "strict", "contentMediaType", "contentEncoding", NULL};
static const char *const KNOWN_KEYS[] = {"type", "properties", "required", "additionalProperties", "items",
                                         "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
                                         "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "anyOf", "oneOf",
                                         "$ref", "format", "nullable", NULL};
static const char *const TYPES[] = {"object", "array", "string", "integer", "number", "boolean", "null", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

/* The first keyword of s that constrains values, other than a and b (and enum/const when skip_enum): what
 * cannot stand beside $ref or anyOf/oneOf. */
static const char *other_keyword(const json_t *s, const char *a, const char *b, int skip_enum) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!in_list(KNOWN_KEYS, key) || !strcmp(key, a) || (b && !strcmp(key, b))) continue;
        if (skip_enum && (!strcmp(key, "enum") || !strcmp(key, "const"))) continue;
        if (!strcmp(key, "nullable") && !json_is_true(v)) continue;
        return key;
    }
    return NULL;
}

/* ---- the table of compiled schema objects ---- */

static size_t memo_home(const json_t *s, int cap) {
    uint64_t h = (uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (size_t)(cap - 1);
}

static int memo_get(const grammar *g, const json_t *s) {
    if (!g->cap_memo) return -1;
    for (size_t i = memo_home(s, g->cap_memo);; i = (i + 1) & (size_t)(g->cap_memo - 1)) {
        if (g->memo[i].schema == s) return g->memo[i].node;
        if (!g->memo[i].schema) return -1;
    }
}

static void memo_put(grammar *g, const json_t *s, int node) {
    if (2 * (g->n_memo + 1) > g->cap_memo) {
        int old_cap = g->cap_memo;
        memo *old = g->memo;
        g->cap_memo = old_cap ? 2 * old_cap : 64;
        g->memo = xcalloc((size_t)g->cap_memo, sizeof *g->memo);
        g->n_memo = 0;
        for (int i = 0; i < old_cap; i++)
            if (old[i].schema) memo_put(g, old[i].schema, old[i].node);
        free(old);
    }
    size_t i = memo_home(s, g->cap_memo);
    while (g->memo[i].schema) i = (i + 1) & (size_t)(g->cap_memo - 1);
    g->memo[i] = (memo){s, node};
    g->n_memo++;
}

static int over_budget(const grammar *g, const char *path, df_error *err) {
    if (g->n >= GRAMMAR_MAX_NODES)
        return schema_fail(err, path, "the schema needs more than %d grammar nodes, the limit of constrained output",
                           GRAMMAR_MAX_NODES);
    if (g->lit_bytes > GRAMMAR_MAX_LIT_BYTES)
        return schema_fail(err, path, "its keys and enum/const values take more than %u bytes, the limit of "
                           "constrained output", GRAMMAR_MAX_LIT_BYTES);
    return 0;
}

/* ---- keywords ---- */

static int get_count(const json_t *s, const char *key, int dflt, const char *path, df_error *err, int *out) {
    json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
        return schema_fail(err, path, "'%s' must be an integer from 0 to 1000000", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_bound(const json_t *s, const char *key, double *out, int *present, const char *path, df_error *err) {
    json_t *v = json_object_get(s, key);
    *present = 0;
    if (!v) return 0;
    if (!json_is_number(v)) return schema_fail(err, path, "'%s' must be a number", key);
    *out = json_number_value(v);
    *present = 1;
    return 0;
}

/* Serialises one JSON value compactly (the bytes an enum member is generated as). */
static char *dump_value(const json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

static const char *format_template(const char *f) {
    /* classes: Y digit, M month tens, m month units, D day tens, d day units (days 01-28 are valid in every
     * month), H hour tens, h hour units, S minute/second tens, s units, x lowercase hex */
    if (!strcmp(f, "date")) return "YYYY-Mm-Dd";
    if (!strcmp(f, "time")) return "Hh:Ss:SsZ";
    if (!strcmp(f, "date-time")) return "YYYY-Mm-DdTHh:Ss:SsZ";
    if (!strcmp(f, "uuid")) return "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    return NULL;
}

static int compile_object(grammar *g, const json_t *s, const char *path, df_error *err) {
    char sub[256];
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return schema_fail(err, path, "'%s' must be an object", "properties");
    if (json_object_size(props) > MAX_KEYS) return schema_fail(err, path, "more than %d properties", MAX_KEYS);
    if (req && (!json_is_array(req) || json_array_size(req) > MAX_KEYS))
        return schema_fail(err, path, "'required' must be an array of at most %d property names", MAX_KEYS);
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return schema_fail(err, path, "'%s' must be a boolean or a schema", "additionalProperties");
    int id = grammar_node_new(g, GN_OBJECT);
    const char *names[MAX_KEYS];
    int n = 0;
    const char *key;
    json_t *ps;
    json_object_foreach(props, key, ps) {
        json_t *ks = json_string(key);
        char *q = dump_value(ks);
        json_decref(ks);
        grammar_node_add_lit(g, id, q, strlen(q));
        free(q);
        snprintf(sub, sizeof sub, "%s.properties.%.100s", path, key);
        int kid = compile(g, ps, sub, err);
        if (kid < 0) return -1;
        grammar_node_add_kid(g, id, kid);
        names[n++] = key;
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        int found = -1;
        for (int k = 0; k < n && json_is_string(r); k++)
            if (!strcmp(names[k], json_string_value(r))) found = k;
        if (found < 0)
            return schema_fail(err, path, "required key '%.100s' is not among the properties",
                               json_is_string(r) ? json_string_value(r) : "?");
        g->nodes[id].required |= 1ull << found;
    }
    if (add && json_is_false(add)) {
        g->nodes[id].additional = -1;
    } else if (add && json_is_object(add) && json_object_size(add)) {
        if (n) return schema_fail(err, path, "additionalProperties as a schema together with properties is not supported");
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        int a = compile(g, add, sub, err);
        if (a < 0) return -1;
        g->nodes[id].additional = a;
    } else if (!n) {   /* no properties: any members */
        g->nodes[id].additional = grammar_add_json_any(g, 0);
    }
    return id;
}

static int compile_typed(grammar *g, const json_t *s, const char *type, const char *path, df_error *err) {
    char sub[256];
    if (!strcmp(type, "object")) return compile_object(g, s, path, err);
    if (!strcmp(type, "array")) {
        int mn, mx, item;
        json_t *items = json_object_get(s, "items");
        snprintf(sub, sizeof sub, "%s.items", path);
        if (items && !json_is_object(items) && !json_is_true(items))
            return schema_fail(err, path, "'%s' must be one schema (tuples and false are not supported)", "items");
        if (get_count(s, "minItems", 0, path, err, &mn) || get_count(s, "maxItems", -1, path, err, &mx)) return -1;
        if (mx >= 0 && mx < mn) return schema_fail(err, path, "maxItems < minItems");
        item = items ? compile(g, items, sub, err) : grammar_add_json_any(g, 0);
        if (item < 0) return -1;
        int id = grammar_node_new(g, GN_ARRAY);
        g->nodes[id].item = item;
        g->nodes[id].min = mn;
        g->nodes[id].max = mx;
        return id;
    }
    if (!strcmp(type, "string")) {
        int mn, mx;
        if (get_count(s, "minLength", 0, path, err, &mn) || get_count(s, "maxLength", -1, path, err, &mx)) return -1;
        if (mx >= 0 && mx < mn) return schema_fail(err, path, "maxLength < minLength");
        json_t *f = json_object_get(s, "format");
        if (f && !json_is_string(f)) return schema_fail(err, path, "'%s' must be a string", "format");
        const char *fs = f ? json_string_value(f) : NULL;
        if (fs && !format_template(fs) && strcmp(fs, "email"))
            return schema_fail(err, path, "format '%.60s' is not supported in constrained output (date, time, "
                               "date-time, uuid, email are)", fs);
        if (fs && (mn > 0 || mx >= 0))
            return schema_fail(err, path, "minLength/maxLength together with a format is not supported");
        int id = grammar_node_new(g, GN_STRING);
        g->nodes[id].min = mn;
        g->nodes[id].max = mx;
        if (fs && format_template(fs)) {
            g->nodes[id].format = FMT_TEMPLATE;
            g->nodes[id].tmpl = format_template(fs);
        } else if (fs) {
            g->nodes[id].format = FMT_EMAIL;
        }
        return id;
    }
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        int integer = type[0] == 'i', p;
        double lo = -BIG, hi = BIG, x;
        if (get_bound(s, "minimum", &x, &p, path, err)) return -1;
        if (p) lo = x;
        if (get_bound(s, "maximum", &x, &p, path, err)) return -1;
        if (p) hi = x;
        if (get_bound(s, "exclusiveMinimum", &x, &p, path, err)) return -1;
        if (p) {
            x = integer ? floor(x) + 1 : nextafter(x, INFINITY);
            lo = x > lo ? x : lo;
        }
        if (get_bound(s, "exclusiveMaximum", &x, &p, path, err)) return -1;
        if (p) {
            x = integer ? ceil(x) - 1 : nextafter(x, -INFINITY);
            hi = x < hi ? x : hi;
        }
        if (integer) {
            lo = ceil(lo);
            hi = floor(hi);
        }
        int id = grammar_node_new(g, integer ? GN_INT : GN_NUM);
        g->nodes[id].lo = lo;
        g->nodes[id].hi = hi;
        return id;
    }
    if (!strcmp(type, "boolean")) {
        int id = grammar_node_new(g, GN_LITS);
        grammar_node_add_lit(g, id, "true", 4);
        grammar_node_add_lit(g, id, "false", 5);
        return id;
    }
    if (!strcmp(type, "null")) return grammar_add_text(g, "null");
    return schema_fail(err, path, "unknown type '%.60s'", type);
}

/* Without `type`, the type its keywords imply (restricting to it keeps every value valid), or NULL. */
static const char *implied_type(const json_t *s) {
    static const char *const by_type[][5] = {
        {"object", "properties", "additionalProperties", "required", NULL},
        {"array", "items", "minItems", "maxItems", NULL},
        {"string", "minLength", "maxLength", "format", NULL},
        {"number", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    };
    for (size_t t = 0; t < sizeof by_type / sizeof *by_type; t++)
        for (int k = 1; k < 5 && by_type[t][k]; k++)
            if (json_object_get(s, by_type[t][k])) return by_type[t][0];
    return NULL;
}

/* type (one, a list, or implied), then `nullable` */
static int compile_types(grammar *g, const json_t *s, const char *path, df_error *err) {
    json_t *type = json_object_get(s, "type");
    int id, has_null = 0;
    if (json_is_string(type)) {
        id = compile_typed(g, s, json_string_value(type), path, err);
        has_null = !strcmp(json_string_value(type), "null");
    } else if (json_is_array(type) && json_array_size(type)) {
        unsigned mask = 0;
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {   /* a type listed twice is the same alternative: merged */
            int k = 0;
            while (TYPES[k] && !(json_is_string(t) && !strcmp(TYPES[k], json_string_value(t)))) k++;
            if (!TYPES[k]) return schema_fail(err, path, "'type' entries must be type names (\"%s\", ...)", TYPES[0]);
            mask |= 1u << k;
        }
        if (mask >> 4 & 1) mask &= ~(1u << 3);   /* number covers integer */
        has_null = mask >> 6 & 1;
        id = grammar_node_new(g, GN_UNION);
        for (int k = 0; TYPES[k]; k++) {
            if (!(mask >> k & 1)) continue;
            int kid = compile_typed(g, s, TYPES[k], path, err);
            if (kid < 0) return -1;
            grammar_node_add_kid(g, id, kid);
        }
    } else if (type) {
        return schema_fail(err, path, "'%s' must be a type name or a non-empty array of them", "type");
    } else {
        const char *t = implied_type(s);
        id = t ? compile_typed(g, s, t, path, err) : grammar_add_json_any(g, 0);
        has_null = !t;
    }
    if (id >= 0 && !has_null && json_is_true(json_object_get(s, "nullable"))) {
        int u = grammar_node_new(g, GN_UNION);
        grammar_node_add_kid(g, u, id);
        grammar_node_add_kid(g, u, grammar_add_text(g, "null"));
        id = u;
    }
    return id;
}

static const json_t *resolve_ref(grammar *g, const char *ref) {
    if (!strcmp(ref, "#")) return g->doc;
    const char *name = NULL, *section = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) section = "$defs", name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) section = "definitions", name = ref + 14;
    if (!name || strchr(name, '/') || strchr(name, '~')) return NULL;
    return json_object_get(json_object_get(g->doc, section), name);
}

/* enum / const: the members as literals, each once; when other keywords stand beside them, the members
 * must also satisfy those (checked once the grammar is finished). */
static int compile_enum(grammar *g, const json_t *s, const char *path, df_error *err) {
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && (!json_is_array(en) || !json_array_size(en) || json_array_size(en) > MAX_LITS))
        return schema_fail(err, path, "'%s' must be an array of 1 to %d values", "enum", MAX_LITS);
    int id = grammar_node_new(g, GN_LITS);
    size_t n = en ? json_array_size(en) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        int dup = en && cn && !json_equal((json_t *)v, cn);   /* both: the members equal to const */
        for (size_t k = 0; k < i && !dup; k++) dup = json_equal((json_t *)v, json_array_get(en, k));
        if (dup) continue;
        char *d = dump_value(v);
        grammar_node_add_lit(g, id, d, strlen(d));
        free(d);
        if (over_budget(g, path, err)) return -1;
    }
    if (!g->nodes[id].n_lits) return schema_fail(err, path, "no member of 'enum' equals 'const'");
    if (other_keyword(s, "enum", "const", 0)) {
        int base = grammar_node_new(g, GN_UNION);   /* the rest of the schema, as its own node */
        g->nodes[id].filter = base;
        return id;
    }
    return id;
}

/* The schema object s, except that with skip_enum its enum/const are left out (the node their members
 * are checked against). */
static int compile_body(grammar *g, const json_t *s, const char *path, int skip_enum, df_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!in_list(KNOWN_KEYS, key) && !in_list(IGNORED_KEYS, key))
            return schema_fail(err, path, "keyword '%.60s' is not supported in constrained output", key);
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const char *other = other_keyword(s, "$ref", NULL, 0);
        if (other)
            return schema_fail(err, path, "'%s' beside $ref is not supported (move it into the referenced schema)",
                               other);
        const json_t *t = json_is_string(ref) ? resolve_ref(g, json_string_value(ref)) : NULL;
        if (!t) return schema_fail(err, path, "cannot resolve $ref '%.100s' (only #/$defs/NAME, #/definitions/NAME, #)",
                                   json_is_string(ref) ? json_string_value(ref) : "?");
        return compile_ref(g, t, json_string_value(ref), err);
    }
    if (!skip_enum && (json_object_get(s, "enum") || json_object_get(s, "const"))) {
        int id = compile_enum(g, s, path, err);
        if (id < 0 || g->nodes[id].filter < 0) return id;
        int base = g->nodes[id].filter, rest = compile_body(g, s, path, 1, err);
        if (rest < 0) return -1;
        grammar_node_add_kid(g, base, rest);
        return id;
    }
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any && one) return schema_fail(err, path, "anyOf together with oneOf is not supported");
    if (any || one) {
        const char *name = any ? "anyOf" : "oneOf", *other = other_keyword(s, "anyOf", "oneOf", skip_enum);
        if (!any) any = one;
        if (other)
            return schema_fail(err, path, "'%s' beside %s is not supported (move it into each alternative)", other,
                               name);
        if (!json_is_array(any) || !json_array_size(any))
            return schema_fail(err, path, "'%s' must be a non-empty array", name);
        int id = grammar_node_new(g, GN_UNION);
        size_t i;
        json_t *alt;
        json_array_foreach(any, i, alt) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s[%zu]", path, name, i);
            int kid = compile(g, alt, sub, err);
            if (kid < 0) return -1;
            grammar_node_add_kid(g, id, kid);
        }
        return id;
    }
    return compile_types(g, s, path, err);
}

static int schema_enter(grammar *g, const json_t *s, const char *path, df_error *err) {
    if (!json_is_object(s)) return schema_fail(err, path, "a schema must be an object or true");
    if (over_budget(g, path, err)) return -1;
    if (g->depth >= MAX_SCHEMA_NESTING)
        return schema_fail(err, path, "nested (through $ref too) more than %d levels deep", MAX_SCHEMA_NESTING);
    g->depth++;
    return 0;
}

/* A subschema: compiled once, however many paths reach it. */
static int compile(grammar *g, const json_t *s, const char *path, df_error *err) {
    if (json_is_true(s)) return grammar_add_json_any(g, 0);
    int id = json_is_object(s) ? memo_get(g, s) : -1;
    if (id >= 0) return id;
    if (schema_enter(g, s, path, err)) return -1;
    id = compile_body(g, s, path, 0, err);
    g->depth--;
    if (id >= 0) memo_put(g, s, id);
    return id;
}

/* A $ref target (or the whole document): a placeholder union with one alternative is entered in the table
 * first, so that a reference from inside the target comes back to it as a cycle. */
static int compile_ref(grammar *g, const json_t *t, const char *path, df_error *err) {
    if (json_is_true(t)) return grammar_add_json_any(g, 0);
    int id = json_is_object(t) ? memo_get(g, t) : -1;
    if (id >= 0) return id;
    if (schema_enter(g, t, path, err)) return -1;
    id = grammar_node_new(g, GN_UNION);
    memo_put(g, t, id);
    int kid = compile_body(g, t, path, 0, err);
    g->depth--;
    if (kid < 0) return -1;
    grammar_node_add_kid(g, id, kid);
    return id;
}

int grammar_add_schema(grammar *g, const char *schema_json, size_t len, df_error *err) {
    json_error_t je;
    json_t *doc = json_loadb(schema_json, len, JSON_DECODE_ANY, &je);
    if (!doc) {
        df_error_set(err, DF_EINVAL, "schema is not valid JSON: %s", je.text);
        return -1;
    }
    json_t *prev = g->doc;
    g->doc = doc;
    g->depth = 0;
    int id = compile_ref(g, doc, "", err);
    /* the table is keyed by this document's objects, which die with it */
    free(g->memo);
    g->memo = NULL;
    g->n_memo = g->cap_memo = 0;
    g->doc = prev;
    json_decref(doc);
    return id;
}

int grammar_check_schema(const char *schema_json, size_t len, df_error *err) {
    grammar *g = grammar_new();
    int id = grammar_add_schema(g, schema_json, len, err);
    int rc = id < 0 ? DF_EINVAL : grammar_finish(g, id, err);
    grammar_free(g);
    return rc;
}
