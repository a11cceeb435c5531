/* grammar_internal.h — the node graph and grammar struct shared by the grammar's files: building and analysis
 * (grammar.c), the JSON-schema compiler (grammar_schema.c) and the pushdown machine that runs it
 * (grammar_run.c). */
#ifndef DF_GRAMMAR_INTERNAL_H
#define DF_GRAMMAR_INTERNAL_H

#include <jansson.h>
#include "sample/grammar.h"

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
    uint32_t need;             /* frames its shortest completion stacks, its own included */
    int filter;                /* GN_LITS from enum/const: the node its literals must also satisfy, -1: none */
    uint64_t first[4];         /* bytes that can start it */
    int32_t first_tok;         /* the special token that can start it, or -1 */
} gnode;

/* One entry of the schema compiler's table from a schema object to its node (open addressing on the
 * pointer: every subschema and every $ref target is compiled once, however often it is reached). */
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
    int n_memo, cap_memo;      /* cap_memo: a power of two, or 0 */
    int depth;
    int any_value, any_object; /* the shared "any JSON value" / "any object" nodes, -1 until needed */
    size_t lit_bytes;          /* bytes of every literal so far (GRAMMAR_MAX_LIT_BYTES) */
};

/* Saturating arithmetic on byte costs: GRAMMAR_INF stands for "cannot be completed". */
static inline uint32_t sat_add(uint32_t a, uint32_t b) {
    uint64_t s = (uint64_t)a + b;
    return s >= GRAMMAR_INF ? GRAMMAR_INF : (uint32_t)s;
}

static inline uint32_t sat_mul(uint32_t a, uint32_t k) {
    uint64_t s = (uint64_t)a * k;
    return s >= GRAMMAR_INF ? GRAMMAR_INF : (uint32_t)s;
}

/* Bytes of property p of an object node: its quoted key, the colon and the value's shortest form. */
static inline uint32_t prop_cost(const grammar *g, const gnode *nd, int p) {
    return sat_add(nd->lit_len[p] + 1, g->nodes[nd->kids[p]].minlen);
}

/* commas + members for the required keys not in seen, excluding `except`, each preceded by a comma */
static inline uint32_t required_rest(const grammar *g, const gnode *nd, uint64_t seen, int except) {
    uint32_t c = 0;
    for (int p = 0; p < nd->n_lits; p++)
        if ((nd->required >> p & 1) && !(seen >> p & 1) && p != except) c = sat_add(c, sat_add(1, prop_cost(g, nd, p)));
    return c;
}

/* A new node of this kind with no bounds; returns its id (the node array may move). */
int grammar_node_new(grammar *g, int kind);
void grammar_node_add_lit(grammar *g, int id, const char *s, size_t len);
void grammar_node_add_kid(grammar *g, int id, int kid);
/* The fewest bytes that complete a number node from frame f (grammar_run.c). */
uint32_t grammar_num_cost(const gnode *nd, const grammar_frame *f);
/* The whole of p[0..n) is one complete value of node (the analysis done): how enum members are checked
 * against the other keywords of their schema (grammar_run.c). */
int grammar_node_accepts(const grammar *g, int node, const uint8_t *p, size_t n);

#endif
