/* cli_gen.h — what `run` and `chat` share: model + tokenizer loading, sampling flags, prefill progress on
 * a TTY, per-token profile lines, and Ctrl-C handling that stops an answer without ending the program. */
#ifndef DF_CLI_GEN_H
#define DF_CLI_GEN_H

#include <signal.h>
#include <stdio.h>
#include "deltafin.h"
#include "cli_opts.h"
#include "sample/generate.h"
#include "tokenizer/tokenizer.h"

typedef struct cli_model {
    const char *dir;         /* the model folder opened (-m, or the default model found) */
    char dir_buf[4096];
    char *remote;            /* the partial install's recorded source, when used */
    df_engine *eng;
    df_session *s;
    tokenizer *tok;          /* NULL when the folder has no tokenizer */
    chat_format fmt;         /* 0 when no chat format was detected */
    int n_vocab;
    float *logits;           /* [n_vocab] */
    spec *spec;              /* speculative decoding; NULL when off */
} cli_model;

/* Common flags. Returns 1 if the option was one of these (consumed), 0 if not, -1 on a bad value. */
typedef struct cli_gen_opts {
    df_engine_opts eng;
    sample_params sp;
    int max_tokens;
    int profile;
    spec_opts spec;
    int seed_set;            /* --seed given */
} cli_gen_opts;

#define CLI_SEED_MAX 0x7fffffffL

void cli_gen_opts_default(cli_gen_opts *o);
int cli_gen_parse(cli_gen_opts *o, int opt, const char *arg);
/* The getopt_long entries cli_gen_parse understands (short options: m: n: t:); terminated by a zero entry
 * at index CLI_GEN_N_LONGOPTS. */
#define CLI_GEN_N_LONGOPTS (9 + CLI_STORAGE_N_LONGOPTS + CLI_SPEC_N_LONGOPTS)
extern const struct option cli_gen_longopts[CLI_GEN_N_LONGOPTS + 1];
const char *cli_gen_usage(void);
/* After parsing: sampling with no --seed gets a random one, printed on stderr so a run can be repeated. */
void cli_gen_pick_seed(cli_gen_opts *o);

/* Opens o->eng.model_dir or the default model. A partial install without --remote streams its missing
 * experts from the source deltafin fetch recorded. */
int cli_model_open(cli_model *m, const cli_gen_opts *o, int need_tokenizer, df_error *err);
void cli_model_close(cli_model *m);

/* Evaluates prompt ids (the logits of the last land in m->logits), showing layer progress on stderr when
 * it is a TTY and the prompt is long. Ctrl-C cancels (DF_ECANCELLED; the session is then reset). */
int cli_prefill(cli_model *m, const int32_t *ids, int n, df_error *err);

/* DF_OK when n_prompt more tokens leave room to generate at least one; else an error giving both sizes. */
int cli_prompt_fits(cli_model *m, size_t n_prompt, df_error *err);
/* Says on stderr that generation stopped because the context is full: `allowed` (< `asked` tokens) was all
 * the room left, and it was used up. */
void cli_context_notice(cli_model *m, const gen_result *res, int asked, int allowed);

/* Ctrl-C: SIGINT is blocked for the whole command and polled, so no handler or global flag is needed. */
void cli_sigint_block(void);
int cli_sigint_pending(void);     /* consumes a pending Ctrl-C; 1 if there was one */

/* Streams generated text to stdout (reasoning dimmed, then the answer), or ids when ids_only; with profile,
 * a line per token on stderr. A gen_event_fn; returns non-zero on Ctrl-C. */
typedef struct cli_stream {
    cli_model *m;
    int ids_only, profile;
    int reasoning_open, n_tok;
    df_profile prof;
} cli_stream;
int cli_stream_event(void *ctx, const gen_event *ev);
/* Closes an open reasoning span (after a stopped answer). */
void cli_stream_end(cli_stream *o);

/* Prints one line per generated token: the phase times since the previous call, i.e. of the evaluation
 * that produced this token's logits (the prefill for token 0). */
void cli_profile_line(cli_model *m, int index, df_profile *prev);
/* One line of per-layer look-ahead recall (nothing when no layer had a guess scored). */
void cli_lookahead_line(df_engine *eng, FILE *f);
/* The per-layer recall and ranks read (at `when`) of n layers' look-ahead counters, without a newline;
 * returns how many layers had a guess. */
int cli_lookahead_layers(FILE *f, const df_layer_lookahead *la, int n, const char *when);
/* The precision of the guesses per confidence rank, summed over n layers' counters, for the ranks that named
 * any expert: a JSON array, or percentages separated by spaces. */
void cli_lookahead_precision(FILE *f, const df_layer_lookahead *la, int n, int json);

/* One line on stderr: passes, tokens per pass, drafted/accepted of a generation (with speculation on). */
void cli_spec_summary(const cli_model *m, const gen_result *res);
/* Writes one JSON object: tokens, passes, tokens_per_pass, drafted, accepted, decode_s, s_per_token and the
 * disk bytes read between the stats a (before decoding) and b (after), per generated token. */
int cli_write_stats_json(const char *path, const gen_result *res, const df_stats *a, const df_stats *b,
                         df_error *err);

#endif
