/* generate.h — the decode loop shared by `deltafin run`/`chat` and the server: from the logits after a
 * prompt, sample → decode text → route reasoning vs answer (chat) → match stop strings → report each token
 * through a callback → feed the token back, until end of message, a stop string, max_tokens or the caller
 * cancels. Text handed to the callback is always whole UTF-8 characters. */
#ifndef DF_GENERATE_H
#define DF_GENERATE_H

#include <stdint.h>
#include "deltafin.h"
#include "sample/sample.h"
#include "sample/stop.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/toolcall.h"

typedef struct gen_config {
    const tokenizer *tok;     /* NULL: ids only, no text */
    int chat;                 /* split reasoning/answer with the chat format's markers (needs tok) */
    chat_format fmt;
    int in_reasoning;         /* the chat prompt ended inside the reasoning part */
    int max_tokens;           /* > 0 */
    int32_t eos_id;           /* ends generation; -1 = none */
    const char *const *stop;  /* stop strings, matched on the answer text */
    int n_stop;
    sample_params sp;
    struct spec *spec;        /* speculative decoding (sample/spec.h); NULL = one token per pass */
    /* Optional constraint on the sampled tokens (e.g. a grammar): before each sample, mask(mask_ctx, logits,
     * n_vocab, budget) sets forbidden logits to -inf (budget: tokens that may still be generated, this one
     * included) and returns how many remain allowed; mask_accept(mask_ctx, id) then advances it. */
    int (*mask)(void *ctx, float *logits, int n_vocab, int budget);
    int (*mask_accept)(void *ctx, int32_t id);
    void *mask_ctx;
    chat_tool_parser *tools;  /* chat: reads tool calls out of the ids and keeps their sections out of the text */
} gen_config;

/* GEN_FINISH_ERROR: nothing could be sampled (non-finite logits, or a constraint that allows no token);
 * gen_state_error says why, and gen_run returns DF_EINVAL with it. */
typedef enum { GEN_FINISH_STOP = 0, GEN_FINISH_LENGTH, GEN_FINISH_CANCELLED, GEN_FINISH_ERROR } gen_finish;

/* One generated token and the text it released (either may be empty: a partial character or a possible
 * stop-string start is held back). final: the last event of the generation (finish is then set). */
typedef struct gen_event {
    int32_t id;
    const sample_result *sample;
    const char *content;
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    int final;
    gen_finish finish;
    const char *stop;                /* final: the stop string that ended it (valid during the call), or NULL */
    int passes, drafted, accepted;   /* the generation's counters so far (gen_result) */
} gen_event;

/* Return non-zero to stop generating (finish = cancelled). */
typedef int (*gen_event_fn)(void *ctx, const gen_event *ev);

typedef struct gen_result {
    gen_finish finish;
    tok_ids ids;              /* every sampled id (the caller frees with tok_ids_free) */
    int n_evaluated;          /* how many of them were fed back into the session (all but the last) */
    double decode_s;          /* time spent sampling and evaluating */
    int passes;               /* target evaluations (each verifies any drafts of its pass) */
    int drafted, accepted;    /* drafted tokens verified, and how many of them the target kept */
} gen_result;

/* logits: [vocab] after the prompt; reused as scratch. Returns DF_OK, DF_ECANCELLED (callback or the
 * session's step callback stopped it), DF_EINVAL when nothing could be sampled (GEN_FINISH_ERROR) or an
 * evaluation error. */
int gen_run(df_session *s, const gen_config *cfg, float *logits, int n_vocab, gen_event_fn cb, void *ctx,
            gen_result *res, df_error *err);

/* The same loop one token at a time, for callers that evaluate many sessions together (the server): a
 * gen_state samples from the logits it is given, reports the event, and hands back the id to evaluate. */
typedef struct gen_state gen_state;
gen_state *gen_state_new(const gen_config *cfg, int n_vocab);
void gen_state_free(gen_state *g);
/* Why the generation ended with GEN_FINISH_ERROR ("" otherwise). */
const char *gen_state_error(const gen_state *g);
/* Samples from logits (used as scratch) and reports the token through cb. Returns 0 when *next must be
 * evaluated and its logits passed to the next call, 1 when the generation ended (res->finish says how;
 * GEN_FINISH_CANCELLED when cb asked to stop, GEN_FINISH_ERROR when nothing could be sampled: no event is
 * reported then). res accumulates over the calls (ids, finish). */
int gen_step(gen_state *g, float *logits, gen_event_fn cb, void *ctx, int32_t *next, gen_result *res);
/* After a pass (counted in res) that evaluated the last emitted token and k drafts behind it, rows holding
 * the logits of its k + 1 rows: samples row by row, each through the constraint as without speculation,
 * emitting the drafts while each equals what its row sampled and then the model's own token (so every
 * token is reported on its own). Returns like gen_step; *keep gets how many of the pass's tokens the session
 * must keep (the caller truncates it to the pass's start + *keep when that is below k + 1), *accepted the
 * drafts emitted. k = 0 is a plain decode step from the one row's logits. */
int gen_step_rows(gen_state *g, float *rows, const int32_t *drafts, int k, gen_event_fn cb, void *ctx, int32_t *next,
                  int *keep, int *accepted, gen_result *res);

#endif
