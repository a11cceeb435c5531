/* grammar_schema.c — compiles a JSON schema (the subset grammar.h lists) into grammar nodes: each schema
 * object becomes a node, $ref targets are memoised so recursive schemas become cycles, and keywords that would
 * constrain values beyond what the machine enforces are refused. */
#include "sample/grammar_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

static int schema_fail(df_error *err, const char *path, const char *fmt, const char *what) {
    char msg[300];
    snprintf(msg, sizeof msg, fmt, what);
    df_error_set(err, DF_EINVAL, "schema%s: %s", path, msg);
    return -1;
}

static int compile(grammar *g, const json_t *s, const char *path, df_error *err);

static const char *const IGNORED_KEYS[] = {"title", "description", "default", "examples", "$schema", "$id",
                                           "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                           "definitions", "strict", "contentMediaType", "contentEncoding", NULL};
static const char *const KNOWN_KEYS[] = {"type", "properties", "required", "additionalProperties", "items",
                                         "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
                                         "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "anyOf", "oneOf",
                                         "$ref", "format", "nullable", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int get_count(const json_t *s, const char *key, int dflt, const char *path, df_error *err, int *out) {
    json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
        return schema_fail(err, path, "'%s' must be a non-negative integer", key);
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

static int compile_typed(grammar *g, const json_t *s, const char *type, const char *path, df_error *err) {
    char sub[256];
    if (!strcmp(type, "object")) {
        int id = grammar_node_new(g, GN_OBJECT);
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
               *add = json_object_get(s, "additionalProperties");
        if (props && !json_is_object(props)) return schema_fail(err, path, "'%s' must be an object", "properties");
        if (json_object_size(props) > MAX_KEYS) return schema_fail(err, path, "more than 64 %s", "properties");
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
        }
        if (req) {
            if (!json_is_array(req)) return schema_fail(err, path, "'%s' must be an array", "required");
            size_t i;
            json_t *r;
            json_array_foreach(req, i, r) {
                int found = -1, k = 0;
                json_object_foreach(props, key, ps) {
                    if (json_is_string(r) && !strcmp(key, json_string_value(r))) found = k;
                    k++;
                }
                if (found < 0)
                    return schema_fail(err, path, "required key '%s' is not among the properties",
                                       json_is_string(r) ? json_string_value(r) : "?");
                g->nodes[id].required |= 1ull << found;
            }
        }
        if (add && json_is_false(add)) {
            g->nodes[id].additional = -1;
        } else if (add && json_is_object(add) && json_object_size(add)) {
            if (json_object_size(props))
                return schema_fail(err, path, "%s together with properties is not supported",
                                   "additionalProperties as a schema");
            snprintf(sub, sizeof sub, "%s.additionalProperties", path);
            int a = compile(g, add, sub, err);
            if (a < 0) return -1;
            g->nodes[id].additional = a;
        } else if (!json_object_size(props)) {   /* no properties: any members */
            g->nodes[id].additional = grammar_add_json_any(g, 0);
        }
        return id;
    }
    if (!strcmp(type, "array")) {
        int id = grammar_node_new(g, GN_ARRAY), mn, mx, item;
        json_t *items = json_object_get(s, "items");
        snprintf(sub, sizeof sub, "%s.items", path);
        if (items && !json_is_object(items) && !json_is_boolean(items))
            return schema_fail(err, path, "'%s' must be one schema (tuples are not supported)", "items");
        item = items ? compile(g, items, sub, err) : grammar_add_json_any(g, 0);
        if (item < 0) return -1;
        if (get_count(s, "minItems", 0, path, err, &mn) || get_count(s, "maxItems", -1, path, err, &mx)) return -1;
        if (mx >= 0 && mx < mn) return schema_fail(err, path, "%s", "maxItems < minItems");
        g->nodes[id].item = item;
        g->nodes[id].min = mn;
        g->nodes[id].max = mx;
        return id;
    }
    if (!strcmp(type, "string")) {
        int id = grammar_node_new(g, GN_STRING), mn, mx;
        if (get_count(s, "minLength", 0, path, err, &mn) || get_count(s, "maxLength", -1, path, err, &mx)) return -1;
        if (mx >= 0 && mx < mn) return schema_fail(err, path, "%s", "maxLength < minLength");
        g->nodes[id].min = mn;
        g->nodes[id].max = mx;
        json_t *f = json_object_get(s, "format");
        if (f && !json_is_string(f)) return schema_fail(err, path, "'%s' must be a string", "format");
        if (f && format_template(json_string_value(f))) {
            g->nodes[id].format = FMT_TEMPLATE;
            g->nodes[id].tmpl = format_template(json_string_value(f));
        } else if (f && !strcmp(json_string_value(f), "email")) {
            g->nodes[id].format = FMT_EMAIL;
        }
        if (g->nodes[id].format != FMT_NONE && (mn > 0 || mx >= 0))
            return schema_fail(err, path, "%s", "minLength/maxLength together with a format is not supported");
        return id;
    }
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        int integer = type[0] == 'i';
        int id = grammar_node_new(g, integer ? GN_INT : GN_NUM), p;
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
    if (!strcmp(type, "null")) {
        int id = grammar_node_new(g, GN_LITS);
        grammar_node_add_lit(g, id, "null", 4);
        return id;
    }
    return schema_fail(err, path, "unknown type '%s'", type);
}

static const json_t *resolve_ref(grammar *g, const char *ref) {
    if (!strcmp(ref, "#")) return g->doc;
    const char *name = NULL, *section = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) section = "$defs", name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) section = "definitions", name = ref + 14;
    if (!name || strchr(name, '/') || strchr(name, '~')) return NULL;
    return json_object_get(json_object_get(g->doc, section), name);
}

static int compile(grammar *g, const json_t *s, const char *path, df_error *err) {
    if (json_is_true(s)) return grammar_add_json_any(g, 0);
    if (!json_is_object(s)) return schema_fail(err, path, "%s", "a schema must be an object or true");
    for (int i = 0; i < g->n_memo; i++)
        if (g->memo[i].schema == s) return g->memo[i].node;
    if (++g->depth > 64) return schema_fail(err, path, "%s", "nested too deeply");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!in_list(KNOWN_KEYS, key) && !in_list(IGNORED_KEYS, key))
            return schema_fail(err, path, "keyword '%s' is not supported in constrained output", key);
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const json_t *t = json_is_string(ref) ? resolve_ref(g, json_string_value(ref)) : NULL;
        if (!t) return schema_fail(err, path, "cannot resolve $ref '%s' (only #/$defs/NAME, #/definitions/NAME, #)",
                                   json_is_string(ref) ? json_string_value(ref) : "?");
        /* a placeholder union with one alternative lets a recursive reference point here before it is built */
        int id = grammar_node_new(g, GN_UNION);
        if (g->n_memo == g->cap_memo) {
            g->cap_memo = g->cap_memo ? 2 * g->cap_memo : 8;
            g->memo = xrealloc(g->memo, (size_t)g->cap_memo * sizeof *g->memo);
        }
        g->memo[g->n_memo++] = (memo){s, id};
        int kid = compile(g, t, json_string_value(ref), err);
        if (kid < 0) return -1;
        grammar_node_add_kid(g, id, kid);
        g->depth--;
        return id;
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || !json_array_size(en) || json_array_size(en) > MAX_LITS))
            return schema_fail(err, path, "'%s' must be an array of 1 to 64 values", "enum");
        int id = grammar_node_new(g, GN_LITS);
        size_t n = en ? json_array_size(en) : 1;
        for (size_t i = 0; i < n; i++) {
            char *d = dump_value(en ? json_array_get(en, i) : cn);
            grammar_node_add_lit(g, id, d, strlen(d));
            free(d);
        }
        g->depth--;
        return id;
    }
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    if (any) {
        if (!json_is_array(any) || !json_array_size(any))
            return schema_fail(err, path, "'%s' must be a non-empty array", "anyOf");
        int id = grammar_node_new(g, GN_UNION);
        size_t i;
        json_t *alt;
        json_array_foreach(any, i, alt) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.anyOf[%zu]", path, i);
            int kid = compile(g, alt, sub, err);
            if (kid < 0) return -1;
            grammar_node_add_kid(g, id, kid);
        }
        g->depth--;
        return id;
    }
    json_t *type = json_object_get(s, "type");
    int id;
    if (json_is_string(type)) {
        id = compile_typed(g, s, json_string_value(type), path, err);
        if (id >= 0 && json_is_true(json_object_get(s, "nullable"))) {
            int u = grammar_node_new(g, GN_UNION), nl = grammar_node_new(g, GN_LITS);
            grammar_node_add_lit(g, nl, "null", 4);
            grammar_node_add_kid(g, u, id);
            grammar_node_add_kid(g, u, nl);
            id = u;
        }
    } else if (json_is_array(type) && json_array_size(type)) {
        int has_number = 0;
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t)) return schema_fail(err, path, "'%s' entries must be strings", "type");
            if (!strcmp(json_string_value(t), "number")) has_number = 1;
        }
        id = grammar_node_new(g, GN_UNION);
        json_array_foreach(type, i, t) {
            if (has_number && !strcmp(json_string_value(t), "integer")) continue;   /* number covers it */
            int kid = compile_typed(g, s, json_string_value(t), path, err);
            if (kid < 0) return -1;
            grammar_node_add_kid(g, id, kid);
        }
    } else if (type) {
        return schema_fail(err, path, "'%s' must be a string or an array of strings", "type");
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
               json_object_get(s, "required")) {
        id = compile_typed(g, s, "object", path, err);
    } else if (json_object_get(s, "items")) {
        id = compile_typed(g, s, "array", path, err);
    } else {
        id = grammar_add_json_any(g, 0);
    }
    g->depth--;
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
    g->n_memo = 0;
    g->depth = 0;
    int id = compile(g, doc, "", err);
    g->n_memo = 0;
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
