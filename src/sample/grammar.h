/* grammar.h — constrained generation: a JSON-schema subset (plus special tokens and literal text, for tool-call
 * syntax) compiled into a deterministic pushdown machine over bytes, and the logits mask that keeps sampling
 * inside it.
 *
 * The machine reads bytes; a special token is one symbol of its own. A state is a small stack of frames, one
 * per open construct (object, array, string, number, ...). Every state knows the fewest bytes that complete
 * the document, so the mask can refuse a token that would leave less budget than the completion needs: with
 * max_tokens at least the schema's minimum, generation always ends with a complete document (every single
 * byte is a token in a byte-level BPE, so a completion of k bytes fits in k tokens).
 *
 * Supported schema keywords: type (one or a list), properties, required, additionalProperties (false, true
 * or a schema; keys outside `properties` are only generated when there are no `properties`), items,
 * minItems, maxItems, minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum,
 * const (members that fail the schema's other keywords are dropped; none left is refused), anyOf/oneOf
 * whose alternatives start differently (different types), $ref to #/$defs/... or #/definitions/..., format
 * date, time, date-time, uuid, email (generated in a strict subset of each format). Annotations (title,
 * description, default, examples, ...) are ignored. Everything else that constrains values is refused,
 * naming the keyword, so output never silently fails its schema: keywords not enforced here (pattern,
 * multipleOf, uniqueItems, allOf, not, other formats, ...) and constraints beside $ref or anyOf/oneOf.
 *
 * Compilation is linear in the schema: every subschema and $ref target becomes one node, reached however
 * often it is referenced; past GRAMMAR_MAX_NODES nodes or GRAMMAR_MAX_LIT_BYTES of literals a schema is
 * refused. A schema whose shortest document needs more than GRAMMAR_MAX_DEPTH frames is refused, and the
 * machine never opens a construct it could not finish within them (a recursive schema stops nesting there).
 *
 * Generation choices that keep output bounded: whitespace only between JSON tokens and at most
 * GRAMMAR_MAX_WS bytes in a row, none before or after the top-level value; integers have at most 15 digits,
 * numbers at most 12 integer and 6 fraction digits and no exponent; strings never use \u escapes of
 * surrogates; nesting is limited to GRAMMAR_MAX_DEPTH frames. */
#ifndef DF_GRAMMAR_H
#define DF_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include "deltafin.h"
#include "tokenizer/tokenizer.h"

#define GRAMMAR_MAX_DEPTH 48
#define GRAMMAR_MAX_WS 4
#define GRAMMAR_INF 0x3fffffffu
#define GRAMMAR_MAX_NODES 65536
#define GRAMMAR_MAX_LIT_BYTES (1u << 20)

typedef struct grammar grammar;

/* ---- building ---- */
grammar *grammar_new(void);
void grammar_free(grammar *g);
/* Each returns a node id (>= 0), or -1 with err filled (bad or unsupported schema). */
int grammar_add_schema(grammar *g, const char *schema_json, size_t len, df_error *err);
int grammar_add_json_any(grammar *g, int objects_only);   /* any JSON value (json_object mode: objects) */
int grammar_add_token(grammar *g, int32_t id);             /* one special token */
int grammar_add_text(grammar *g, const char *text);        /* literal bytes */
int grammar_add_int(grammar *g, long long lo, long long hi);
int grammar_add_seq(grammar *g, const int *nodes, int n);
int grammar_add_repeat(grammar *g, int node, int min, int max);
/* One of the literal strings, each followed by its own node (a function name, then its arguments); no
 * literal may be a prefix of another. */
int grammar_add_select(grammar *g, const char *const *lits, const int *nodes, int n);
/* Fixes the root and computes minimum completion lengths; fails when the root cannot be satisfied. */
int grammar_finish(grammar *g, int root, df_error *err);
/* Bytes of the shortest complete document (after grammar_finish). */
uint32_t grammar_min_len(const grammar *g);
/* Checks a schema without keeping it (request validation). */
int grammar_check_schema(const char *schema_json, size_t len, df_error *err);

/* ---- running ---- */
typedef struct grammar_frame {
    int32_t node;
    int16_t st;
    uint8_t ws;
    uint8_t neg;
    int32_t i, n;
    uint64_t a, b;
} grammar_frame;

typedef struct grammar_state {
    int depth;
    int done;   /* the root value is complete */
    grammar_frame f[GRAMMAR_MAX_DEPTH];
} grammar_state;

void grammar_state_init(const grammar *g, grammar_state *s);
void grammar_state_copy(grammar_state *dst, const grammar_state *src);
/* Feed bytes / one special token; 0 = accepted, -1 = refused (the state is then undefined). */
int grammar_feed(const grammar *g, grammar_state *s, const uint8_t *p, size_t n);
int grammar_feed_token(const grammar *g, grammar_state *s, int32_t id);
/* The document is complete here (end of generation allowed). */
int grammar_accepting(const grammar *g, const grammar_state *s);
/* Fewest bytes (a special token counts 1) that complete the document from s. */
uint32_t grammar_cost(const grammar *g, const grammar_state *s);

/* The top frame is a plain string with no escape or character pending: *len characters so far, it needs at
 * least *min and allows at most *max (-1: any). A token of plain text there only adds characters. */
int grammar_plain_string(const grammar *g, const grammar_state *s, int *len, int *min, int *max);

/* ---- the logits mask over one tokenizer's vocabulary (grammar_mask.c) ---- */
typedef struct grammar_vocab grammar_vocab;
/* Precomputes the vocabulary (non-special tokens sorted by bytes, shared-prefix lengths, specials). */
grammar_vocab *grammar_vocab_new(const tokenizer *t);
void grammar_vocab_free(grammar_vocab *v);

typedef struct grammar_mask {
    const grammar *g;
    const grammar_vocab *v;
    int32_t eos_id;           /* allowed once the document is complete; -1: none */
    grammar_state st;
    grammar_state *scratch;   /* one state per prefix depth of the vocabulary walk */
    uint8_t *allow;           /* [n_vocab] */
    uint64_t n_steps, n_checked;
    double seconds;
} grammar_mask;

void grammar_mask_init(grammar_mask *m, const grammar *g, const grammar_vocab *v, int32_t eos_id);
void grammar_mask_free(grammar_mask *m);
/* Sets the logits of forbidden tokens to -inf. budget: tokens that may still be generated, this one included.
 * Returns the number of allowed tokens (0: none, which a satisfiable grammar with enough budget never gives). */
int grammar_mask_apply(grammar_mask *m, float *logits, int n_vocab, int budget);
/* Advances the state by the sampled token; -1 if the grammar refuses it. */
int grammar_mask_accept(grammar_mask *m, int32_t id);

#endif
