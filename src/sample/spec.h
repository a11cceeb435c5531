/* spec.h — speculative decoding for the shared decode loop: draft sources (prompt lookup over the context's
 * n-grams, or a small draft model with the same vocabulary kept in step with the target's accepted tokens)
 * and a cost model that decides, pass by pass, whether drafting pays and how many tokens to draft, from the
 * acceptance and pass times this run has measured. Verification itself lives in the decode loop
 * (generate.c), so that what is emitted never depends on the drafts. */
#ifndef DF_SPEC_H
#define DF_SPEC_H

#include <stdint.h>
#include "deltafin.h"

typedef enum { SPEC_OFF = 0, SPEC_NGRAM, SPEC_DRAFT, SPEC_AUTO } spec_mode;

#define SPEC_DRAFT_MAX_DEFAULT 4   /* most tokens drafted per pass (--draft-max) */
#define SPEC_DRAFT_MAX_LIMIT 32
#define SPEC_NGRAM_BUCKETS 5       /* acceptance kept apart for suffix matches of 1, 2, 3, 4-7, 8+ tokens */

typedef struct spec_opts {
    spec_mode mode;        /* ngram / draft: draft draft_max tokens whenever the source proposes (n-gram: a
                              match of 2+ tokens); auto: the cost model chooses among the sources it has */
    int draft_max;         /* 0 = SPEC_DRAFT_MAX_DEFAULT */
    const char *draft_dir; /* draft model folder: needed by draft, used by auto when set */
    int n_threads;         /* the draft engine's compute threads (0 = all cores) */
} spec_opts;

void spec_opts_default(spec_opts *o);
/* "off", "ngram", "draft", "auto" -> mode; -1 if unknown. */
int spec_parse_mode(const char *s);
const char *spec_mode_name(spec_mode m);

typedef struct spec_stats {
    uint64_t passes;        /* target evaluations after the prompt */
    uint64_t spec_passes;   /* of which verified drafts */
    uint64_t drafted;       /* tokens proposed and verified */
    uint64_t accepted;      /* of which the target kept */
    uint64_t rollbacks;     /* passes that returned the session to an accepted prefix */
    uint64_t probes;        /* drafts the cost model allowed only to keep measuring acceptance */
    double pass_s, rollback_s, draft_s;   /* time in target passes, rollbacks, drafting */
} spec_stats;

typedef struct spec spec;

/* target: the engine of the session to decode (the draft model must share its vocabulary). */
int spec_init(spec **out, const spec_opts *o, df_engine *target, df_error *err);
void spec_free(spec *sp);
spec_mode spec_get_mode(const spec *sp);
int spec_draft_max(const spec *sp);

/* Proposes up to limit (capped at draft_max and by the target's context) tokens to follow the session's
 * tokens and then next (sampled, not yet evaluated) into drafts[]; returns how many (0: decode plainly). */
int spec_propose(spec *sp, df_session *target, int32_t next, int limit, int32_t *drafts, df_error *err);
/* The outcome of the pass after spec_propose: rows evaluated (drafts + 1), drafts accepted, the time of the
 * evaluation (< 0: unknown, e.g. a prompt slice shared the pass) and of the rollback (< 0: none). */
void spec_observe(spec *sp, int rows, int accepted, double eval_s, double rollback_s);
/* Several streams decoded in one pass (the server's slots): each has its own spec, made like a first one
 * (same options; the draft model's engine is shared, its sessions are not; base must outlive it), and
 * before spec_propose and spec_observe is told how many rows the other streams add to the pass, so that
 * the cost model times whole passes and weighs drafts against every stream's pace. */
int spec_init_like(spec **out, const spec *base, df_error *err);
void spec_set_shared_rows(spec *sp, int rows);
void spec_get_stats(const spec *sp, spec_stats *out);
/* Bytes a stream's speculation holds beside its target session once the context has n_tokens: the draft
 * model's two sessions and its logits (0 without a draft model). */
uint64_t spec_state_bytes(const spec *sp, int64_t n_tokens);

/* Longest earlier occurrence of a suffix of t[0..n): *len gets its length (at most max_len; 0 if none) and
 * the return value is the index just past that earlier occurrence (its continuation starts there). */
int spec_ngram_match(const int32_t *t, int n, int max_len, int *len);

#endif
