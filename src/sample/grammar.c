/* grammar.c — building the node graph of grammar.h (nodes for tokens, text, integers, sequences, repeats,
 * selections, any JSON value) and analysing it once built: the symbols each node can start with, the fewest
 * bytes that complete it and the frames that shortest completion stacks; enum members are checked against
 * their schema's other keywords here, once the machine can run. The JSON-schema compiler is grammar_schema.c, the machine that runs the graph
 * grammar_run.c, the logits mask grammar_mask.c. */
#include "sample/grammar_internal.h"

#include <stdlib.h>
#include <string.h>
#include "common/util.h"

/* ---- building ---- */

int grammar_node_new(grammar *g, int kind) {
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
    nd->need = GRAMMAR_INF;
    nd->filter = -1;
    return g->n++;
}

void grammar_node_add_lit(grammar *g, int id, const char *s, size_t len) {
    gnode *nd = &g->nodes[id];
    nd->lits = xrealloc(nd->lits, (size_t)(nd->n_lits + 1) * sizeof *nd->lits);
    nd->lit_len = xrealloc(nd->lit_len, (size_t)(nd->n_lits + 1) * sizeof *nd->lit_len);
    nd->lits[nd->n_lits] = xmalloc(len + 1);
    memcpy(nd->lits[nd->n_lits], s, len);
    nd->lits[nd->n_lits][len] = 0;
    nd->lit_len[nd->n_lits++] = (uint32_t)len;
    g->lit_bytes += len;
}

void grammar_node_add_kid(grammar *g, int id, int kid) {
    gnode *nd = &g->nodes[id];
    nd->kids = xrealloc(nd->kids, (size_t)(nd->n_kids + 1) * sizeof *nd->kids);
    nd->kids[nd->n_kids++] = kid;
}

grammar *grammar_new(void) {
    grammar *g = xcalloc(1, sizeof *g);
    g->root = -1;
    g->any_value = g->any_object = -1;
    g->str_node = grammar_node_new(g, GN_STRING);
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
    int n = grammar_node_new(g, GN_TOKEN);
    g->nodes[n].token = id;
    return n;
}

int grammar_add_text(grammar *g, const char *text) {
    int n = grammar_node_new(g, GN_LITS);
    grammar_node_add_lit(g, n, text, strlen(text));
    return n;
}

int grammar_add_int(grammar *g, long long lo, long long hi) {
    int n = grammar_node_new(g, GN_INT);
    g->nodes[n].lo = (double)lo;
    g->nodes[n].hi = (double)hi;
    return n;
}

int grammar_add_seq(grammar *g, const int *nodes, int n) {
    int id = grammar_node_new(g, GN_SEQ);
    for (int i = 0; i < n; i++) grammar_node_add_kid(g, id, nodes[i]);
    return id;
}

int grammar_add_repeat(grammar *g, int node, int min, int max) {
    int id = grammar_node_new(g, GN_REPEAT);
    g->nodes[id].item = node;
    g->nodes[id].min = min;
    g->nodes[id].max = max;
    return id;
}

int grammar_add_select(grammar *g, const char *const *lits, const int *nodes, int n) {
    int id = grammar_node_new(g, GN_SELECT);
    for (int i = 0; i < n && i < MAX_LITS; i++) {
        grammar_node_add_lit(g, id, lits[i], strlen(lits[i]));
        grammar_node_add_kid(g, id, nodes[i]);
    }
    return id;
}

/* Built once per grammar and shared: a schema of many `{}` or `true` parts stays small. */
int grammar_add_json_any(grammar *g, int objects_only) {
    if (g->any_value >= 0) return objects_only ? g->any_object : g->any_value;
    int u = grammar_node_new(g, GN_UNION);
    int o = grammar_node_new(g, GN_OBJECT);
    g->nodes[o].additional = u;
    int a = grammar_node_new(g, GN_ARRAY);
    g->nodes[a].item = u;
    g->nodes[a].min = 0;
    int s = grammar_node_new(g, GN_STRING);
    int num = grammar_node_new(g, GN_NUM);
    int l = grammar_node_new(g, GN_LITS);
    grammar_node_add_lit(g, l, "true", 4);
    grammar_node_add_lit(g, l, "false", 5);
    grammar_node_add_lit(g, l, "null", 4);
    int kids[] = {o, a, s, num, l};
    for (int i = 0; i < 5; i++) grammar_node_add_kid(g, u, kids[i]);
    g->any_value = u;
    g->any_object = o;
    return objects_only ? o : u;
}

/* ---- analysis: first symbols, minimum lengths ---- */

static void set_bit(uint64_t *f, int c) { f[c >> 6] |= 1ull << (c & 63); }

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
        return grammar_num_cost(nd, &f);
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

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

/* Frames the shortest completion of nd stacks, its own included: the deepest of the parts it must open
 * (a union and a selection are replaced by the part they choose, so they add none). */
static uint32_t node_need(const grammar *g, const gnode *nd) {
    uint32_t m = 1;
    switch (nd->kind) {
    case GN_OBJECT:
        for (int p = 0; p < nd->n_lits; p++)
            if (nd->required >> p & 1) m = max_u32(m, sat_add(1, g->nodes[nd->kids[p]].need));
        return m;
    case GN_ARRAY:
    case GN_REPEAT: return nd->min > 0 ? sat_add(1, g->nodes[nd->item].need) : 1;
    case GN_SEQ:
        for (int i = 0; i < nd->n_kids; i++) m = max_u32(m, sat_add(1, g->nodes[nd->kids[i]].need));
        return m;
    case GN_SELECT:   /* whichever literal is written, its part must fit */
        for (int i = 0; i < nd->n_kids; i++) m = max_u32(m, g->nodes[nd->kids[i]].need);
        return m;
    case GN_UNION:    /* the shallowest of the shortest alternatives */
        m = GRAMMAR_INF;
        for (int i = 0; i < nd->n_kids; i++) {
            const gnode *k = &g->nodes[nd->kids[i]];
            if (k->minlen == nd->minlen && k->need < m) m = k->need;
        }
        return m;
    default: return nd->minlen >= GRAMMAR_INF ? GRAMMAR_INF : 1;
    }
}

/* Fixed points from scratch: minimum lengths and first symbols together, then the frames needed (which
 * follow the shortest completions). Nodes are mostly created parents first, so children are visited first
 * by going backwards. */
static void analyse(grammar *g) {
    for (int i = 0; i < g->n; i++) {
        g->nodes[i].minlen = g->nodes[i].need = GRAMMAR_INF;
        memset(g->nodes[i].first, 0, sizeof g->nodes[i].first);
        g->nodes[i].first_tok = -1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = g->n - 1; i >= 0; i--) {
            uint32_t m = node_minlen(g, &g->nodes[i]);
            if (m != g->nodes[i].minlen) {
                g->nodes[i].minlen = m;
                changed = 1;
            }
            changed |= first_update(g, i);
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = g->n - 1; i >= 0; i--) {
            uint32_t d = node_need(g, &g->nodes[i]);
            if (d != g->nodes[i].need) {
                g->nodes[i].need = d;
                changed = 1;
            }
        }
    }
}

/* Drops the enum/const members that their schema's other keywords refuse; returns how many were dropped,
 * or -1 when a node is left with none. */
static int filter_literals(grammar *g, df_error *err) {
    int dropped = 0;
    for (int i = 0; i < g->n; i++) {
        gnode *nd = &g->nodes[i];
        if (nd->kind != GN_LITS || nd->filter < 0) continue;
        int k = 0;
        for (int l = 0; l < nd->n_lits; l++) {
            if (grammar_node_accepts(g, nd->filter, (const uint8_t *)nd->lits[l], nd->lit_len[l])) {
                nd->lits[k] = nd->lits[l];
                nd->lit_len[k++] = nd->lit_len[l];
            } else {
                free(nd->lits[l]);
                dropped++;
            }
        }
        nd->n_lits = k;
        if (!k) {
            df_error_set(err, DF_EINVAL, "schema: no member of an enum/const satisfies the other keywords of its "
                                         "schema (type, bounds, lengths, ...)");
            return -1;
        }
    }
    return dropped;
}

int grammar_finish(grammar *g, int root, df_error *err) {
    for (;;) {   /* dropping members can lengthen other nodes, and so drop further members */
        analyse(g);
        int d = filter_literals(g, err);
        if (d < 0) return DF_EINVAL;
        if (!d) break;
    }
    for (int i = 0; i < g->n; i++) {
        const gnode *nd = &g->nodes[i];
        if (nd->kind == GN_UNION) {   /* pairwise disjoint first symbols, checked against their union so far */
            uint64_t seen[4] = {0};
            int overlap = 0;
            for (int a = 0; a < nd->n_kids && !overlap; a++) {
                const gnode *x = &g->nodes[nd->kids[a]];
                for (int w = 0; w < 4; w++) {
                    overlap |= (seen[w] & x->first[w]) != 0;
                    seen[w] |= x->first[w];
                }
                for (int b = 0; b < a && x->first_tok >= 0; b++) overlap |= g->nodes[nd->kids[b]].first_tok == x->first_tok;
            }
            if (overlap) {
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
    if (g->nodes[root].need > GRAMMAR_MAX_DEPTH) {
        df_error_set(err, DF_EINVAL,
                     "schema: its shortest document nests %u constructs; constrained output nests at most %d",
                     g->nodes[root].need, GRAMMAR_MAX_DEPTH);
        return DF_EINVAL;
    }
    g->root = root;
    return DF_OK;
}

uint32_t grammar_min_len(const grammar *g) { return g->nodes[g->root].minlen; }
