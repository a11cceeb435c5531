/* grammar.c — the JSON-schema pushdown machine of grammar.h (the logits mask is grammar_mask.c). Nodes form
 * a graph (cycles through $ref and "any JSON value"); a state is a stack of frames over it. Alternatives are
 * chosen by their first symbol only, which keeps the machine deterministic: one state, no backtracking. */
#include "grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"

enum { GN_OBJECT, GN_ARRAY, GN_STRING, GN_INT, GN_NUM, GN_LITS, GN_UNION, GN_TOKEN, GN_SEQ, GN_REPEAT, GN_SELECT };
enum { FMT_NONE, FMT_TEMPLATE, FMT_EMAIL };

#define MAX_INT_DIGITS 15
#define MAX_NUM_DIGITS 12
#define MAX_FRAC 6
#define MAX_KEYS 64
#define MAX_LITS 64
#define BIG 1e300
#define SYM_END (-1)
#define SYM_TOKEN(id) (256 + (int64_t)(id))

typedef struct gnode {
    int kind;
    int *kids;                 /* union alternatives, seq parts, select targets, object property values */
    int n_kids;
    char **lits;               /* literals, select literals, object keys (quoted) */
    uint32_t *lit_len;
    int n_lits;
    uint64_t required;         /* object: bit per property */
    int additional;            /* object: node of values under other keys, -1: none */
    int item;                  /* array / repeat */
    int min, max;              /* items, repeats, string length; max < 0 = unbounded */
    int format;
    const char *tmpl;          /* FMT_TEMPLATE: character classes per position */
    double lo, hi;             /* numbers, inclusive */
    int32_t token;
    uint32_t minlen;
    uint64_t first[4];         /* bytes that can start it */
    int32_t first_tok;         /* the special token that can start it, or -1 */
} gnode;

typedef struct memo {
    const json_t *schema;
    int node;
} memo;

struct grammar {
    gnode *nodes;
    int n, cap;
    int root;
    int str_node;              /* a plain string, for map keys */
    /* schema compilation */
    json_t *doc;
    memo *memo;
    int n_memo, cap_memo;
    int depth;
};

/* ---- building ---- */

static int node_new(grammar *g, int kind) {
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 16;
        g->nodes = xrealloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    gnode *nd = &g->nodes[g->n];
    memset(nd, 0, sizeof *nd);
    nd->kind = kind;
    nd->additional = -1;
    nd->item = -1;
    nd->max = -1;
    nd->lo = -BIG;
    nd->hi = BIG;
    nd->token = -1;
    nd->first_tok = -1;
    nd->minlen = GRAMMAR_INF;
    return g->n++;
}

static void node_add_lit(grammar *g, int id, const char *s, size_t len) {
    gnode *nd = &g->nodes[id];
    nd->lits = xrealloc(nd->lits, (size_t)(nd->n_lits + 1) * sizeof *nd->lits);
    nd->lit_len = xrealloc(nd->lit_len, (size_t)(nd->n_lits + 1) * sizeof *nd->lit_len);
    nd->lits[nd->n_lits] = xmalloc(len + 1);
    memcpy(nd->lits[nd->n_lits], s, len);
    nd->lits[nd->n_lits][len] = 0;
    nd->lit_len[nd->n_lits++] = (uint32_t)len;
}

static void node_add_kid(grammar *g, int id, int kid) {
    gnode *nd = &g->nodes[id];
    nd->kids = xrealloc(nd->kids, (size_t)(nd->n_kids + 1) * sizeof *nd->kids);
    nd->kids[nd->n_kids++] = kid;
}

grammar *grammar_new(void) {
    grammar *g = xcalloc(1, sizeof *g);
    g->root = -1;
    g->str_node = node_new(g, GN_STRING);
    g->nodes[g->str_node].min = 0;
    return g;
}

void grammar_free(grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        for (int k = 0; k < g->nodes[i].n_lits; k++) free(g->nodes[i].lits[k]);
        free(g->nodes[i].lits);
        free(g->nodes[i].lit_len);
        free(g->nodes[i].kids);
    }
    free(g->nodes);
    free(g->memo);
    free(g);
}

int grammar_add_token(grammar *g, int32_t id) {
    int n = node_new(g, GN_TOKEN);
    g->nodes[n].token = id;
    return n;
}

int grammar_add_text(grammar *g, const char *text) {
    int n = node_new(g, GN_LITS);
    node_add_lit(g, n, text, strlen(text));
    return n;
}

int grammar_add_int(grammar *g, long long lo, long long hi) {
    int n = node_new(g, GN_INT);
    g->nodes[n].lo = (double)lo;
    g->nodes[n].hi = (double)hi;
    return n;
}

int grammar_add_seq(grammar *g, const int *nodes, int n) {
    int id = node_new(g, GN_SEQ);
    for (int i = 0; i < n; i++) node_add_kid(g, id, nodes[i]);
    return id;
}

int grammar_add_repeat(grammar *g, int node, int min, int max) {
    int id = node_new(g, GN_REPEAT);
    g->nodes[id].item = node;
    g->nodes[id].min = min;
    g->nodes[id].max = max;
    return id;
}

int grammar_add_select(grammar *g, const char *const *lits, const int *nodes, int n) {
    int id = node_new(g, GN_SELECT);
    for (int i = 0; i < n && i < MAX_LITS; i++) {
        node_add_lit(g, id, lits[i], strlen(lits[i]));
        node_add_kid(g, id, nodes[i]);
    }
    return id;
}

int grammar_add_json_any(grammar *g, int objects_only) {
    int u = node_new(g, GN_UNION);
    int o = node_new(g, GN_OBJECT);
    g->nodes[o].additional = u;
    int a = node_new(g, GN_ARRAY);
    g->nodes[a].item = u;
    g->nodes[a].min = 0;
    int s = node_new(g, GN_STRING);
    int num = node_new(g, GN_NUM);
    int l = node_new(g, GN_LITS);
    node_add_lit(g, l, "true", 4);
    node_add_lit(g, l, "false", 5);
    node_add_lit(g, l, "null", 4);
    int kids[] = {o, a, s, num, l};
    for (int i = 0; i < 5; i++) node_add_kid(g, u, kids[i]);
    return objects_only ? o : u;
}

/* ---- JSON schema ---- */

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
        int id = node_new(g, GN_OBJECT);
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
            node_add_lit(g, id, q, strlen(q));
            free(q);
            snprintf(sub, sizeof sub, "%s.properties.%.100s", path, key);
            int kid = compile(g, ps, sub, err);
            if (kid < 0) return -1;
            node_add_kid(g, id, kid);
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
        int id = node_new(g, GN_ARRAY), mn, mx, item;
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
        int id = node_new(g, GN_STRING), mn, mx;
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
        int id = node_new(g, integer ? GN_INT : GN_NUM), p;
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
        int id = node_new(g, GN_LITS);
        node_add_lit(g, id, "true", 4);
        node_add_lit(g, id, "false", 5);
        return id;
    }
    if (!strcmp(type, "null")) {
        int id = node_new(g, GN_LITS);
        node_add_lit(g, id, "null", 4);
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
        int id = node_new(g, GN_UNION);
        if (g->n_memo == g->cap_memo) {
            g->cap_memo = g->cap_memo ? 2 * g->cap_memo : 8;
            g->memo = xrealloc(g->memo, (size_t)g->cap_memo * sizeof *g->memo);
        }
        g->memo[g->n_memo++] = (memo){s, id};
        int kid = compile(g, t, json_string_value(ref), err);
        if (kid < 0) return -1;
        node_add_kid(g, id, kid);
        g->depth--;
        return id;
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || !json_array_size(en) || json_array_size(en) > MAX_LITS))
            return schema_fail(err, path, "'%s' must be an array of 1 to 64 values", "enum");
        int id = node_new(g, GN_LITS);
        size_t n = en ? json_array_size(en) : 1;
        for (size_t i = 0; i < n; i++) {
            char *d = dump_value(en ? json_array_get(en, i) : cn);
            node_add_lit(g, id, d, strlen(d));
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
        int id = node_new(g, GN_UNION);
        size_t i;
        json_t *alt;
        json_array_foreach(any, i, alt) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.anyOf[%zu]", path, i);
            int kid = compile(g, alt, sub, err);
            if (kid < 0) return -1;
            node_add_kid(g, id, kid);
        }
        g->depth--;
        return id;
    }
    json_t *type = json_object_get(s, "type");
    int id;
    if (json_is_string(type)) {
        id = compile_typed(g, s, json_string_value(type), path, err);
        if (id >= 0 && json_is_true(json_object_get(s, "nullable"))) {
            int u = node_new(g, GN_UNION), nl = node_new(g, GN_LITS);
            node_add_lit(g, nl, "null", 4);
            node_add_kid(g, u, id);
            node_add_kid(g, u, nl);
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
        id = node_new(g, GN_UNION);
        json_array_foreach(type, i, t) {
            if (has_number && !strcmp(json_string_value(t), "integer")) continue;   /* number covers it */
            int kid = compile_typed(g, s, json_string_value(t), path, err);
            if (kid < 0) return -1;
            node_add_kid(g, id, kid);
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

/* ---- analysis: first symbols, minimum lengths ---- */

static uint32_t sat_add(uint32_t a, uint32_t b) {
    uint64_t s = (uint64_t)a + b;
    return s >= GRAMMAR_INF ? GRAMMAR_INF : (uint32_t)s;
}

static uint32_t sat_mul(uint32_t a, uint32_t k) {
    uint64_t s = (uint64_t)a * k;
    return s >= GRAMMAR_INF ? GRAMMAR_INF : (uint32_t)s;
}

static void set_bit(uint64_t *f, int c) { f[c >> 6] |= 1ull << (c & 63); }
static int has_bit(const uint64_t *f, int c) { return (int)((f[c >> 6] >> (c & 63)) & 1); }

static uint32_t num_cost(const gnode *nd, const grammar_frame *f);

static int first_update(grammar *g, int id) {
    gnode *nd = &g->nodes[id];
    uint64_t f[4] = {0};
    int32_t tok = -1;
    switch (nd->kind) {
    case GN_OBJECT: set_bit(f, '{'); break;
    case GN_ARRAY: set_bit(f, '['); break;
    case GN_STRING: set_bit(f, '"'); break;
    case GN_INT:
    case GN_NUM:
        set_bit(f, '-');
        for (int c = '0'; c <= '9'; c++) set_bit(f, c);
        break;
    case GN_LITS:
    case GN_SELECT:
        for (int i = 0; i < nd->n_lits; i++)
            if (nd->lit_len[i]) set_bit(f, (uint8_t)nd->lits[i][0]);
        break;
    case GN_TOKEN: tok = nd->token; break;
    case GN_UNION:
    case GN_SEQ:
    case GN_REPEAT: {
        int n = nd->kind == GN_UNION ? nd->n_kids : nd->kind == GN_SEQ ? (nd->n_kids > 0) : 1;
        for (int i = 0; i < n; i++) {
            const gnode *k = &g->nodes[nd->kind == GN_REPEAT ? nd->item : nd->kids[i]];
            for (int w = 0; w < 4; w++) f[w] |= k->first[w];
            if (k->first_tok >= 0) tok = k->first_tok;
        }
        break;
    }
    }
    int changed = memcmp(f, nd->first, sizeof f) || tok != nd->first_tok;
    memcpy(nd->first, f, sizeof f);
    nd->first_tok = tok;
    return changed;
}

static uint32_t prop_cost(const grammar *g, const gnode *nd, int p) {
    return sat_add(nd->lit_len[p] + 1, g->nodes[nd->kids[p]].minlen);
}

/* commas + members for the required keys not in seen, excluding `except`, each preceded by a comma */
static uint32_t required_rest(const grammar *g, const gnode *nd, uint64_t seen, int except) {
    uint32_t c = 0;
    for (int p = 0; p < nd->n_lits; p++)
        if ((nd->required >> p & 1) && !(seen >> p & 1) && p != except) c = sat_add(c, sat_add(1, prop_cost(g, nd, p)));
    return c;
}

static uint32_t node_minlen(const grammar *g, const gnode *nd) {
    uint32_t c = 0;
    switch (nd->kind) {
    case GN_OBJECT: {
        uint32_t r = required_rest(g, nd, 0, -1);   /* one comma too many when r > 0 */
        return r ? sat_add(r, 1) : 2;
    }
    case GN_ARRAY: {
        uint32_t ml = g->nodes[nd->item].minlen;
        return nd->min ? sat_add(2, sat_add(sat_mul(ml, (uint32_t)nd->min), (uint32_t)nd->min - 1)) : 2;
    }
    case GN_STRING:
        if (nd->format == FMT_TEMPLATE) return (uint32_t)strlen(nd->tmpl) + 2;
        if (nd->format == FMT_EMAIL) return 8;   /* "a@b.cc" */
        return sat_add(2, (uint32_t)nd->min);
    case GN_INT:
    case GN_NUM: {
        grammar_frame f = {0};
        return num_cost(nd, &f);
    }
    case GN_LITS:
        c = GRAMMAR_INF;
        for (int i = 0; i < nd->n_lits; i++) c = nd->lit_len[i] < c ? nd->lit_len[i] : c;
        return c;
    case GN_SELECT:
        c = GRAMMAR_INF;
        for (int i = 0; i < nd->n_lits; i++) {
            uint32_t x = sat_add(nd->lit_len[i], g->nodes[nd->kids[i]].minlen);
            c = x < c ? x : c;
        }
        return c;
    case GN_UNION:
        c = GRAMMAR_INF;
        for (int i = 0; i < nd->n_kids; i++) c = g->nodes[nd->kids[i]].minlen < c ? g->nodes[nd->kids[i]].minlen : c;
        return c;
    case GN_TOKEN: return 1;
    case GN_SEQ:
        for (int i = 0; i < nd->n_kids; i++) c = sat_add(c, g->nodes[nd->kids[i]].minlen);
        return c;
    case GN_REPEAT: return sat_mul(g->nodes[nd->item].minlen, (uint32_t)nd->min);
    }
    return GRAMMAR_INF;
}

int grammar_finish(grammar *g, int root, df_error *err) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n; i++) {
            uint32_t m = node_minlen(g, &g->nodes[i]);
            if (m != g->nodes[i].minlen) {
                g->nodes[i].minlen = m;
                changed = 1;
            }
            changed |= first_update(g, i);
        }
    }
    for (int i = 0; i < g->n; i++) {
        const gnode *nd = &g->nodes[i];
        if (nd->kind == GN_UNION)
            for (int a = 0; a < nd->n_kids; a++)
                for (int b = a + 1; b < nd->n_kids; b++) {
                    const gnode *x = &g->nodes[nd->kids[a]], *y = &g->nodes[nd->kids[b]];
                    int overlap = 0;
                    for (int w = 0; w < 4; w++) overlap |= (x->first[w] & y->first[w]) != 0;
                    if (overlap || (x->first_tok >= 0 && x->first_tok == y->first_tok)) {
                        df_error_set(err, DF_EINVAL,
                                     "schema: alternatives of anyOf/oneOf/type must start differently (e.g. be of "
                                     "different types); two of them can begin with the same character");
                        return DF_EINVAL;
                    }
                }
        if (nd->kind == GN_LITS)
            for (int k = 0; k < nd->n_lits; k++)
                if (!nd->lit_len[k]) {
                    df_error_set(err, DF_EINVAL, "grammar: empty literal");
                    return DF_EINVAL;
                }
    }
    if (root < 0 || root >= g->n || g->nodes[root].minlen >= GRAMMAR_INF) {
        df_error_set(err, DF_EINVAL, "schema: no JSON value satisfies it within the generator's limits");
        return DF_EINVAL;
    }
    g->root = root;
    return DF_OK;
}

uint32_t grammar_min_len(const grammar *g) { return g->nodes[g->root].minlen; }

int grammar_check_schema(const char *schema_json, size_t len, df_error *err) {
    grammar *g = grammar_new();
    int id = grammar_add_schema(g, schema_json, len, err);
    int rc = id < 0 ? DF_EINVAL : grammar_finish(g, id, err);
    grammar_free(g);
    return rc;
}

/* ---- numbers: the fewest bytes that complete a number within [lo, hi] ---- */

enum { N_START, N_SIGN, N_INT, N_DOT, N_FRAC };

static const uint64_t POW10[] = {1ull,
                                 10ull,
                                 100ull,
                                 1000ull,
                                 10000ull,
                                 100000ull,
                                 1000000ull,
                                 10000000ull,
                                 100000000ull,
                                 1000000000ull,
                                 10000000000ull,
                                 100000000000ull,
                                 1000000000000ull,
                                 10000000000000ull,
                                 100000000000000ull,
                                 1000000000000000ull,
                                 10000000000000000ull};

/* Some multiple of 10^-f lies in [a, b] ∩ [L, H] (magnitudes). */
static int frac_fits(long double a, long double b, long double L, long double H, int f) {
    long double lo = a > L ? a : L, hi = b < H ? b : H;
    if (lo > hi) return 0;
    long double s = (long double)POW10[f];
    return ceill(lo * s) <= floorl(hi * s);
}

/* Cost of completing a magnitude whose integer part so far is m with d digits (d = 0: none yet). */
static uint32_t mag_cost(const gnode *nd, int d, uint64_t m, long double L, long double H) {
    int maxd = nd->kind == GN_INT ? MAX_INT_DIGITS : MAX_NUM_DIGITS;
    uint32_t best = GRAMMAR_INF;
    for (int k = d ? 0 : 1; d + k <= maxd; k++) {
        if (d == 1 && m == 0 && k > 0) break;   /* no leading zeros */
        uint64_t a, b;
        if (d == 0) {
            a = k == 1 ? 0 : POW10[k - 1];
            b = POW10[k] - 1;
        } else {
            a = m * POW10[k];
            b = a + POW10[k] - 1;
        }
        if ((uint32_t)k >= best) break;
        long double lo = (long double)a > L ? (long double)a : ceill(L), hi = (long double)b < H ? (long double)b : floorl(H);
        if (lo <= hi) return (uint32_t)k;   /* an integer fits: nothing shorter exists */
        if (nd->kind == GN_NUM)
            for (int f = 1; f <= MAX_FRAC && (uint32_t)(k + 1 + f) < best; f++)
                if (frac_fits((long double)a, (long double)b + 1 - 1.0L / (long double)POW10[f], L, H, f))
                    best = (uint32_t)(k + 1 + f);
    }
    return best;
}

static void mag_bounds(const gnode *nd, int neg, long double *L, long double *H) {
    if (!neg) {
        *L = nd->lo > 0 ? nd->lo : 0;
        *H = nd->hi;
    } else {   /* never "-0": a negative number is at least one unit of the last digit below zero */
        long double unit = nd->kind == GN_INT ? 1.0L : 1.0L / (long double)POW10[MAX_FRAC];
        *L = -nd->hi > unit ? -nd->hi : unit;
        *H = -nd->lo;
    }
}

static uint32_t num_cost(const gnode *nd, const grammar_frame *f) {
    long double L, H;
    if (f->st == N_START) {
        mag_bounds(nd, 0, &L, &H);
        uint32_t p = L <= H ? mag_cost(nd, 0, 0, L, H) : GRAMMAR_INF;
        mag_bounds(nd, 1, &L, &H);
        uint32_t n = L <= H ? sat_add(1, mag_cost(nd, 0, 0, L, H)) : GRAMMAR_INF;
        return p < n ? p : n;
    }
    mag_bounds(nd, f->neg, &L, &H);
    if (L > H) return GRAMMAR_INF;
    if (f->st == N_SIGN) return mag_cost(nd, 0, 0, L, H);
    if (f->st == N_INT) return mag_cost(nd, f->i, f->a, L, H);
    /* fraction: f->n digits so far with value f->b */
    uint32_t best = GRAMMAR_INF;
    for (int tot = f->n > 1 ? f->n : 1; tot <= MAX_FRAC; tot++) {
        int k = tot - f->n;
        long double s = (long double)POW10[tot];
        long double jlo = (long double)(f->b * POW10[k]), jhi = jlo + (long double)POW10[k] - 1;
        long double base = (long double)f->a * s;
        long double need_lo = ceill(L * s - base), need_hi = floorl(H * s - base);
        if (need_lo < jlo) need_lo = jlo;
        if (need_hi > jhi) need_hi = jhi;
        if (need_lo <= need_hi) {
            best = (uint32_t)k;
            break;
        }
    }
    return best;
}

/* ---- running ---- */

enum { R_REJECT, R_OK, R_DONE, R_PASS, R_AGAIN };
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_IN, S_ESC, S_HEX, S_UTF, S_TMPL, S_EMAIL };

static int push(const grammar *g, grammar_state *s, int node) {
    if (s->depth == GRAMMAR_MAX_DEPTH) return R_REJECT;
    grammar_frame *f = &s->f[s->depth++];
    memset(f, 0, sizeof *f);
    f->node = node;
    if (g->nodes[node].kind == GN_LITS || g->nodes[node].kind == GN_SELECT) {
        int n = g->nodes[node].n_lits;
        f->a = n >= 64 ? ~0ull : (1ull << n) - 1;
    }
    return R_AGAIN;
}

static void replace_top(const grammar *g, grammar_state *s, int node) {
    s->depth--;
    push(g, s, node);
}

static int is_ws(int c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static int take_ws(grammar_frame *f, int c) {
    if (!is_ws(c)) return 0;
    return f->ws < GRAMMAR_MAX_WS ? (f->ws++, 1) : -1;
}

/* Which unseen properties can still be added. */
static uint64_t obj_open_keys(const gnode *nd, uint64_t seen) {
    uint64_t all = nd->n_lits >= 64 ? ~0ull : (1ull << nd->n_lits) - 1;
    return all & ~seen;
}

static int obj_key_start(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd) {
    if (nd->n_lits) {
        uint64_t cand = obj_open_keys(nd, f->a);
        if (!cand) return R_REJECT;
        f->st = O_KEY;
        f->b = cand;
        f->i = 1;   /* every key literal begins with the quote just read */
        return R_OK;
    }
    if (nd->additional < 0) return R_REJECT;
    f->st = O_COLON;
    f->n = -1;
    f->ws = 0;
    push(g, s, g->str_node);
    return R_AGAIN;
}

static int step_object(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    int w;
    switch (f->st) {
    case O_OPEN:
        if (c != '{') return R_REJECT;
        f->st = O_FIRST;
        return R_OK;
    case O_FIRST:
    case O_NEXT:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == '}' && f->st == O_FIRST) return (nd->required & ~f->a) ? R_REJECT : R_DONE;
        if (c != '"') return R_REJECT;
        return obj_key_start(g, s, f, nd);
    case O_KEY: {
        uint64_t cand = 0;
        for (int p = 0; p < nd->n_lits; p++)
            if ((f->b >> p & 1) && nd->lit_len[p] > (uint32_t)f->i && (uint8_t)nd->lits[p][f->i] == c)
                cand |= 1ull << p;
        if (!cand) return R_REJECT;
        f->b = cand;
        f->i++;
        for (int p = 0; p < nd->n_lits; p++)
            if ((cand >> p & 1) && nd->lit_len[p] == (uint32_t)f->i) {
                f->n = p;
                f->a |= 1ull << p;
                f->st = O_COLON;
                f->ws = 0;
            }
        return R_OK;
    }
    case O_COLON:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        if (c != ':') return R_REJECT;
        f->st = O_VALUE;
        f->ws = 0;
        return R_OK;
    case O_VALUE:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        if (c < 0) return R_REJECT;
        f->st = O_AFTER;
        f->ws = 0;
        return push(g, s, f->n >= 0 ? nd->kids[f->n] : nd->additional);
    case O_AFTER:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == '}') return (nd->required & ~f->a) ? R_REJECT : R_DONE;
        if (c != ',') return R_REJECT;
        if (nd->n_lits ? !obj_open_keys(nd, f->a) : nd->additional < 0) return R_REJECT;
        f->st = O_NEXT;
        return R_OK;
    }
    return R_REJECT;
}

static int step_array(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    int w;
    switch (f->st) {
    case A_OPEN:
        if (c != '[') return R_REJECT;
        f->st = A_FIRST;
        return R_OK;
    case A_FIRST:
    case A_NEXT:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == ']' && f->st == A_FIRST) return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c < 0 || (nd->max >= 0 && f->n >= nd->max)) return R_REJECT;
        f->st = A_AFTER;
        f->n++;
        return push(g, s, nd->item);
    case A_AFTER:
        if ((w = take_ws(f, c))) return w > 0 ? R_OK : R_REJECT;
        f->ws = 0;
        if (c == ']') return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c != ',' || (nd->max >= 0 && f->n >= nd->max)) return R_REJECT;
        f->st = A_NEXT;
        return R_OK;
    }
    return R_REJECT;
}

static int tmpl_ok(char cls, int prev, int c) {
    switch (cls) {
    case 'Y': return c >= '0' && c <= '9';
    case 'M': return c == '0' || c == '1';
    case 'm': return prev == '0' ? c >= '1' && c <= '9' : c >= '0' && c <= '2';
    case 'D': return c >= '0' && c <= '2';
    case 'd': return prev == '0' ? c >= '1' && c <= '9' : prev == '2' ? c >= '0' && c <= '8' : c >= '0' && c <= '9';
    case 'H': return c >= '0' && c <= '2';
    case 'h': return prev == '2' ? c >= '0' && c <= '3' : c >= '0' && c <= '9';
    case 'S': return c >= '0' && c <= '5';
    case 's': return c >= '0' && c <= '9';
    case 'x': return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    default: return c == cls;
    }
}

static int alnum_lower(int c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

/* email, generated as [a-z0-9._-]{1,32} @ [a-z0-9]{1,32} . [a-z]{2,6}; i = part, n = length in it, b = last */
static int step_email(grammar_frame *f, int c) {
    if (f->i == 0) {
        if (c == '@' && f->n > 0 && f->b != '.') f->i = 1, f->n = 0;
        else if (f->n < 32 && (alnum_lower(c) || ((c == '.' || c == '_' || c == '-') && f->n > 0 && f->b != '.'))) f->n++;
        else return R_REJECT;
    } else if (f->i == 1) {
        if (c == '.' && f->n > 0) f->i = 2, f->n = 0;
        else if (f->n < 32 && alnum_lower(c)) f->n++;
        else return R_REJECT;
    } else {
        if (c == '"' && f->n >= 2) return R_DONE;
        if (f->n < 6 && c >= 'a' && c <= 'z') f->n++;
        else return R_REJECT;
    }
    f->b = (uint64_t)c;
    return R_OK;
}

static int step_string(grammar_frame *f, const gnode *nd, int c) {
    if (c < 0 || c > 255) return R_REJECT;
    int room = nd->max < 0 || f->n < nd->max;
    switch (f->st) {
    case S_OPEN:
        if (c != '"') return R_REJECT;
        f->st = nd->format == FMT_TEMPLATE ? S_TMPL : nd->format == FMT_EMAIL ? S_EMAIL : S_IN;
        return R_OK;
    case S_IN:
        if (c == '"') return f->n >= nd->min ? R_DONE : R_REJECT;
        if (c < 0x20 || !room) return R_REJECT;
        if (c == '\\') {
            f->st = S_ESC;
            return R_OK;
        }
        if (c < 0x80) {
            f->n++;
            return R_OK;
        }
        f->st = S_UTF;
        if (c >= 0xC2 && c <= 0xDF) f->i = 1, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xE0) f->i = 2, f->a = 0xA0 | 0xBF << 8;
        else if (c == 0xED) f->i = 2, f->a = 0x80 | 0x9F << 8;
        else if (c >= 0xE1 && c <= 0xEF) f->i = 2, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xF0) f->i = 3, f->a = 0x90 | 0xBF << 8;
        else if (c >= 0xF1 && c <= 0xF3) f->i = 3, f->a = 0x80 | 0xBF << 8;
        else if (c == 0xF4) f->i = 3, f->a = 0x80 | 0x8F << 8;
        else return R_REJECT;
        return R_OK;
    case S_UTF:
        if (c < (int)(f->a & 0xFF) || c > (int)(f->a >> 8)) return R_REJECT;
        f->a = 0x80 | 0xBF << 8;
        if (--f->i == 0) {
            f->n++;
            f->st = S_IN;
        }
        return R_OK;
    case S_ESC:
        if (c == 'u') {
            f->st = S_HEX;
            f->i = 0;
            f->a = 0;
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return R_REJECT;
        f->n++;
        f->st = S_IN;
        return R_OK;
    case S_HEX: {
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) return R_REJECT;
        f->a = f->a * 16 + (uint64_t)v;
        if (++f->i == 2 && f->a >= 0xD8 && f->a <= 0xDF) return R_REJECT;   /* no surrogate halves */
        if (f->i == 4) {
            f->n++;
            f->st = S_IN;
        }
        return R_OK;
    }
    case S_TMPL: {
        int len = (int)strlen(nd->tmpl);
        if (f->i == len) return c == '"' ? R_DONE : R_REJECT;
        if (!tmpl_ok(nd->tmpl[f->i], (int)f->b, c)) return R_REJECT;
        f->b = (uint64_t)c;
        f->i++;
        return R_OK;
    }
    case S_EMAIL: return step_email(f, c);
    }
    return R_REJECT;
}

static int step_number(grammar_frame *f, const gnode *nd, int c) {
    grammar_frame t = *f;
    int digit = c >= '0' && c <= '9';
    switch (f->st) {
    case N_START:
        if (c == '-') {
            t.neg = 1;
            t.st = N_SIGN;
            break;
        }
        /* fallthrough */
    case N_SIGN:
        if (!digit) return R_REJECT;
        t.st = N_INT;
        t.i = 1;
        t.a = (uint64_t)(c - '0');
        break;
    case N_INT:
        if (digit) {
            if (f->a == 0 && f->i == 1) return R_REJECT;
            t.i++;
            t.a = f->a * 10 + (uint64_t)(c - '0');
            if (t.i > (nd->kind == GN_INT ? MAX_INT_DIGITS : MAX_NUM_DIGITS)) return R_REJECT;
            break;
        }
        if (c == '.' && nd->kind == GN_NUM) {
            t.st = N_DOT;
            t.n = 0;
            t.b = 0;
            break;
        }
        return num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
    case N_DOT:
    case N_FRAC:
        if (digit && f->n < MAX_FRAC) {
            t.st = N_FRAC;
            t.n++;
            t.b = f->b * 10 + (uint64_t)(c - '0');
            break;
        }
        return f->st == N_FRAC && num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
    }
    if (num_cost(nd, &t) >= GRAMMAR_INF) return R_REJECT;
    *f = t;
    return R_OK;
}

static int step_lits(const grammar *g, grammar_state *s, grammar_frame *f, const gnode *nd, int c) {
    uint64_t cand = 0, whole = 0;
    for (int k = 0; k < nd->n_lits; k++) {
        if (!(f->a >> k & 1)) continue;
        if (nd->lit_len[k] == (uint32_t)f->i) whole |= 1ull << k;
        else if (c >= 0 && (uint8_t)nd->lits[k][f->i] == c) cand |= 1ull << k;
    }
    if (!cand) return whole && nd->kind == GN_LITS ? R_PASS : R_REJECT;
    f->a = cand;
    f->i++;
    int all_whole = 1, one = -1;
    for (int k = 0; k < nd->n_lits; k++)
        if (cand >> k & 1) {
            if (nd->lit_len[k] != (uint32_t)f->i) all_whole = 0;
            else one = k;
        }
    if (nd->kind == GN_SELECT) {
        if (one >= 0) replace_top(g, s, nd->kids[one]);   /* select literals are prefix-free */
        return R_OK;
    }
    return all_whole ? R_DONE : R_OK;
}

static int step(const grammar *g, grammar_state *s, int64_t c) {
    grammar_frame *f = &s->f[s->depth - 1];
    const gnode *nd = &g->nodes[f->node];
    int b = c >= 0 && c < 256 ? (int)c : c == SYM_END ? -1 : -2;   /* -2: a special token */
    switch (nd->kind) {
    case GN_OBJECT: return b == -2 ? R_REJECT : step_object(g, s, f, nd, b);
    case GN_ARRAY: return b == -2 ? R_REJECT : step_array(g, s, f, nd, b);
    case GN_STRING: return step_string(f, nd, b);
    case GN_INT:
    case GN_NUM:
        if (b == -1) return (f->st == N_INT || f->st == N_FRAC) && num_cost(nd, f) == 0 ? R_PASS : R_REJECT;
        return b == -2 ? (num_cost(nd, f) == 0 && f->st != N_START && f->st != N_SIGN && f->st != N_DOT ? R_PASS : R_REJECT)
                       : step_number(f, nd, b);
    case GN_LITS:
    case GN_SELECT: return b == -2 ? (nd->kind == GN_LITS && f->i && step_lits(g, s, f, nd, -1) == R_PASS ? R_PASS : R_REJECT)
                                   : step_lits(g, s, f, nd, b);
    case GN_UNION:
        if (c == SYM_END) return R_REJECT;
        for (int k = 0; k < nd->n_kids; k++) {
            const gnode *kd = &g->nodes[nd->kids[k]];
            if (b >= 0 ? has_bit(kd->first, b) : kd->first_tok >= 0 && c == SYM_TOKEN(kd->first_tok)) {
                replace_top(g, s, nd->kids[k]);
                return R_AGAIN;
            }
        }
        return R_REJECT;
    case GN_TOKEN: return c == SYM_TOKEN(nd->token) ? R_DONE : R_REJECT;
    case GN_SEQ:
        if (f->i == nd->n_kids) return R_PASS;
        return push(g, s, nd->kids[f->i++]);
    case GN_REPEAT: {
        const gnode *it = &g->nodes[nd->item];
        int starts = b >= 0 ? has_bit(it->first, b) : it->first_tok >= 0 && c == SYM_TOKEN(it->first_tok);
        if (starts && (nd->max < 0 || f->n < nd->max)) {
            f->n++;
            return push(g, s, nd->item);
        }
        return f->n >= nd->min ? R_PASS : R_REJECT;
    }
    }
    return R_REJECT;
}

static int feed_symbol(const grammar *g, grammar_state *s, int64_t c) {
    for (;;) {
        if (s->depth == 0) return s->done && c == SYM_END ? 0 : -1;
        int r = step(g, s, c);
        switch (r) {
        case R_REJECT: return -1;
        case R_OK: return 0;
        case R_DONE:
            if (--s->depth == 0) s->done = 1;
            return 0;
        case R_PASS:
            if (--s->depth == 0) s->done = 1;
            break;
        case R_AGAIN: break;
        }
    }
}

void grammar_state_init(const grammar *g, grammar_state *s) {
    s->depth = 0;
    s->done = 0;
    push(g, s, g->root);
}

void grammar_state_copy(grammar_state *dst, const grammar_state *src) {
    dst->depth = src->depth;
    dst->done = src->done;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof *src->f);
}

int grammar_feed(const grammar *g, grammar_state *s, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (feed_symbol(g, s, p[i])) return -1;
    return 0;
}

int grammar_feed_token(const grammar *g, grammar_state *s, int32_t id) { return feed_symbol(g, s, SYM_TOKEN(id)); }

int grammar_accepting(const grammar *g, const grammar_state *s) {
    grammar_state t;
    grammar_state_copy(&t, s);
    return feed_symbol(g, &t, SYM_END) == 0;
}

static uint32_t frame_cost(const grammar *g, const grammar_frame *f) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case GN_OBJECT: {
        uint32_t rest = required_rest(g, nd, f->a, -1);
        switch (f->st) {
        case O_OPEN: return nd->minlen;
        case O_FIRST: return rest ? rest : 1;   /* the first member has no comma; '}' adds one */
        case O_AFTER: return sat_add(rest, 1);
        case O_NEXT: {
            if (rest) return rest;   /* rest counts one comma (already written) too many, '}' one too few */
            if (!nd->n_lits) return sat_add(g->nodes[g->str_node].minlen + 1, sat_add(g->nodes[nd->additional].minlen, 1));
            uint32_t best = GRAMMAR_INF;
            for (int p = 0; p < nd->n_lits; p++)
                if (!(f->a >> p & 1) && prop_cost(g, nd, p) < best) best = prop_cost(g, nd, p);
            return sat_add(best, 1);
        }
        case O_KEY: {
            uint32_t best = GRAMMAR_INF;
            for (int p = 0; p < nd->n_lits; p++)
                if (f->b >> p & 1) {
                    uint32_t x = sat_add(nd->lit_len[p] - (uint32_t)f->i + 1, g->nodes[nd->kids[p]].minlen);
                    x = sat_add(x, sat_add(required_rest(g, nd, f->a, p), 1));
                    best = x < best ? x : best;
                }
            return best;
        }
        case O_COLON:
        case O_VALUE: {
            uint32_t v = g->nodes[f->n >= 0 ? nd->kids[f->n] : nd->additional].minlen;
            return sat_add(sat_add(f->st == O_COLON, v), sat_add(rest, 1));
        }
        }
        return GRAMMAR_INF;
    }
    case GN_ARRAY: {
        uint32_t ml = g->nodes[nd->item].minlen, need = f->n < nd->min ? (uint32_t)(nd->min - f->n) : 0;
        switch (f->st) {
        case A_OPEN: return nd->minlen;
        case A_FIRST: return need ? sat_add(sat_mul(ml + 1, need), 0) : 1;   /* items, commas between, ']' */
        case A_AFTER: return sat_add(sat_mul(ml + 1, need), 1);
        case A_NEXT: return sat_add(sat_mul(ml + 1, need ? need : 1), 0);
        }
        return GRAMMAR_INF;
    }
    case GN_STRING:
        switch (f->st) {
        case S_OPEN: return nd->minlen;
        case S_TMPL: return (uint32_t)strlen(nd->tmpl) - (uint32_t)f->i + 1;
        case S_EMAIL:
            if (f->i == 0) return (f->n == 0 || f->b == '.') + 1 + 1 + 1 + 2 + 1;
            if (f->i == 1) return (f->n == 0) + 1 + 2 + 1;
            return (f->n < 2 ? 2 - (uint32_t)f->n : 0) + 1;
        default: {
            uint32_t pend = f->st == S_ESC ? 1 : f->st == S_HEX ? 4 - (uint32_t)f->i : f->st == S_UTF ? (uint32_t)f->i : 0;
            uint32_t have = (uint32_t)f->n + (f->st != S_IN);
            return pend + (have < (uint32_t)nd->min ? (uint32_t)nd->min - have : 0) + 1;
        }
        }
    case GN_INT:
    case GN_NUM: return num_cost(nd, f);
    case GN_LITS:
    case GN_SELECT: {
        uint32_t best = GRAMMAR_INF;
        for (int k = 0; k < nd->n_lits; k++)
            if (f->a >> k & 1) {
                uint32_t x = nd->lit_len[k] - (uint32_t)f->i;
                if (nd->kind == GN_SELECT) x = sat_add(x, g->nodes[nd->kids[k]].minlen);
                best = x < best ? x : best;
            }
        return best;
    }
    case GN_UNION:
    case GN_TOKEN: return nd->minlen;
    case GN_SEQ: {
        uint32_t c = 0;
        for (int k = f->i; k < nd->n_kids; k++) c = sat_add(c, g->nodes[nd->kids[k]].minlen);
        return c;
    }
    case GN_REPEAT: return f->n < nd->min ? sat_mul(g->nodes[nd->item].minlen, (uint32_t)(nd->min - f->n)) : 0;
    }
    return GRAMMAR_INF;
}

uint32_t grammar_cost(const grammar *g, const grammar_state *s) {
    uint32_t c = 0;
    for (int i = 0; i < s->depth; i++) c = sat_add(c, frame_cost(g, &s->f[i]));
    return c;
}

int grammar_plain_string(const grammar *g, const grammar_state *s, int *len, int *min, int *max) {
    if (!s->depth) return 0;
    const grammar_frame *f = &s->f[s->depth - 1];
    const gnode *nd = &g->nodes[f->node];
    if (nd->kind != GN_STRING || f->st != S_IN) return 0;
    *len = f->n;
    *min = nd->min;
    *max = nd->max;
    return 1;
}
