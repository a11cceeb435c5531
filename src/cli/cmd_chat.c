/* cmd_chat.c — `deltafin chat`: an interactive conversation in the model's chat format. The session keeps
 * its state between turns: each turn feeds only the new user message and the generation prompt, never the
 * earlier turns again. Ctrl-C stops the current answer (the program goes on); Ctrl-D or /exit ends it;
 * /reset starts a new conversation, /help lists the commands. A line starting with / is a command and never
 * reaches the model (an unknown one is reported); // sends a message that starts with /. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_gen.h"
#include "common/util.h"

/* The conversation so far, as the renderer sees it. Strings are owned. */
typedef struct {
    chat_message *v;
    int n, cap;
} chat_log;

static void chat_log_push(chat_log *l, const char *role, const char *content) {
    if (l->n == l->cap) l->v = xrealloc(l->v, (l->cap = l->cap ? l->cap * 2 : 8) * sizeof *l->v);
    l->v[l->n++] = (chat_message){role, xstrdup(content), NULL};
}

static void chat_log_clear(chat_log *l) {
    for (int i = 0; i < l->n; i++) free((char *)l->v[i].content);
    l->n = 0;
}

/* The ids that take the session from the end of the previous answer to the new generation prompt: the
 * rendering of the whole log minus the rendering of the log without the new user turn. */
static int turn_delta(cli_model *m, chat_log *log, int first, tok_ids *out, df_error *err) {
    chat_opts co;
    chat_opts_default(&co);
    co.thinking = m->fmt == CHAT_K3;
    tok_ids all = {0}, before = {0};
    int rc = chat_render(m->tok, m->fmt, log->v, log->n, &co, &all, err);
    co.add_generation_prompt = 0;
    if (!rc && !first) rc = chat_render(m->tok, m->fmt, log->v, log->n - 1, &co, &before, err);
    if (!rc && (before.n > all.n || (before.n && memcmp(before.v, all.v, before.n * sizeof(int32_t))))) {
        df_error_set(err, DF_EINVAL, "chat format is not append-only for this conversation");
        rc = DF_EINVAL;
    }
    for (size_t i = before.n; !rc && i < all.n; i++) tok_ids_push(out, all.v[i]);
    tok_ids_free(&all);
    tok_ids_free(&before);
    return rc;
}

static char *read_line(void) {
    size_t cap = 0;
    char *line = NULL;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return line;
}

/* One turn: feed the delta, generate, log the answer; after a stopped or cut answer, close the message
 * with the end-of-message token so the next turn continues a well-formed conversation. */
static int chat_turn(cli_model *m, chat_log *log, const cli_gen_opts *go, df_error *err) {
    int first = df_session_pos(m->s) == 0;
    tok_ids delta = {0};
    gen_result res = {0};
    cli_stream out = {.m = m, .profile = go->profile};
    df_engine_profile(m->eng, &out.prof);
    int rc = turn_delta(m, log, first, &delta, err);
    if (!rc) rc = cli_prefill(m, delta.v, (int)delta.n, err);
    int32_t eos = df_engine_info(m->eng)->eos_id;
    int allowed = 0;
    /* leave room for the answer and its closing end-of-message token */
    int64_t room = df_engine_info(m->eng)->max_context - df_session_pos(m->s) - 2;
    if (!rc && room < 1) {
        df_error_set(err, DF_EINVAL, "the conversation fills the model's context of %lld tokens; /reset starts over",
                     (long long)df_engine_info(m->eng)->max_context);
        rc = DF_EINVAL;
    }
    if (!rc) {
        gen_config gc = {.tok = m->tok, .chat = 1, .fmt = m->fmt, .in_reasoning = m->fmt == CHAT_K3,
                         .max_tokens = go->max_tokens < room ? go->max_tokens : (int)room, .eos_id = eos, .sp = go->sp,
                         .spec = m->spec};
        rc = gen_run(m->s, &gc, m->logits, m->n_vocab, cli_stream_event, &out, &res, err);
        if (rc == DF_ECANCELLED) {
            cli_stream_end(&out);
            fputs(" [stopped]", stdout);
            rc = DF_OK;
        }
        allowed = gc.max_tokens;
        /* feed the last sampled id (or the end-of-message id if the answer did not end by itself) */
        int32_t last = res.ids.n ? res.ids.v[res.ids.n - 1] : eos;
        if (!rc) rc = df_session_eval(m->s, &last, 1, NULL, 0, err);
        if (!rc && last != eos) rc = df_session_eval(m->s, &eos, 1, NULL, 0, err);
    }
    cli_stream_end(&out);
    fputs("\n", stdout);
    fflush(stdout);
    if (!rc) cli_context_notice(m, &res, go->max_tokens, allowed);
    if (!rc) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        tokenizer_decode(m->tok, res.ids.v, res.ids.n, &text, &len, &cap, err);
        chat_log_push(log, "assistant", text ? text : "");
        free(text);
        fprintf(stderr, "(fed %zu new prompt tokens, context %lld; generated %zu tokens, %.2f tokens/s)\n", delta.n,
                (long long)df_session_pos(m->s), res.ids.n, res.decode_s > 0 ? res.ids.n / res.decode_s : 0.0);
    }
    if (!rc && go->profile) cli_spec_summary(m, &res);
    tok_ids_free(&delta);
    tok_ids_free(&res.ids);
    return rc;
}

static const char chat_help[] =
    "commands:\n"
    "  /help    this list\n"
    "  /reset   start a new conversation (the system prompt stays)\n"
    "  /exit    quit (or Ctrl-D)\n"
    "Ctrl-C stops the current answer. A line starting with / is a command; start it with // to send a message\n"
    "that begins with /.\n";

int cmd_chat(int argc, char **argv) {
    struct option longopts[CLI_GEN_N_LONGOPTS + 3];
    memcpy(longopts, cli_gen_longopts, sizeof cli_gen_longopts);
    struct option extra[] = {{"system", 1, 0, 's'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    memcpy(longopts + CLI_GEN_N_LONGOPTS, extra, sizeof extra);
    cli_gen_opts go;
    cli_gen_opts_default(&go);
    go.max_tokens = 512;
    const char *system = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "m:n:t:s:h", longopts, NULL)) != -1) {
        int r = cli_gen_parse(&go, c, optarg);
        if (r > 0) continue;
        if (c == 's') {
            system = optarg;
            continue;
        }
        if (r < 0) {
            fprintf(stderr, "deltafin chat --help lists the options\n");
            return 2;
        }
        fprintf(c == 'h' ? stdout : stderr, "usage: deltafin chat [-m DIR] [--system TEXT] [options]\n%s%s",
                cli_gen_usage(), c == 'h' ? chat_help : "");
        return c == 'h' ? 0 : 2;
    }
    if (cli_no_stray_args("chat", argc, argv, optind)) return 2;
    int served;
    if (cli_rank_serve(&go.eng, "chat", &served)) return served;
    cli_gen_pick_seed(&go);
    cli_sigint_block();
    df_error err = {0};
    cli_model m;
    int rc = cli_model_open(&m, &go, 1, &err);
    if (!rc && !m.fmt) {
        df_error_set(&err, DF_EINVAL, "this model folder has no chat format (its tokenizer lacks the K3 or K2 "
                     "chat tokens)");
        rc = DF_EINVAL;
    }
    chat_log log = {0};
    if (!rc && system) chat_log_push(&log, "system", system);
    if (!rc) fprintf(stderr, "chat with %s — Ctrl-C stops an answer, Ctrl-D or /exit quits, /reset starts over, "
                     "/help lists the commands\n", m.dir);
    while (!rc) {
        fputs("> ", stdout);
        if (fflush(stdout) == EOF || ferror(stdout)) break;   /* nobody can read the answers: main reports it */
        char *line = read_line();
        cli_sigint_pending();   /* a Ctrl-C typed at the prompt must not stop the next answer */
        if (!line || !strcmp(line, "/exit")) {
            free(line);
            break;
        }
        const char *msg = line[0] == '/' && line[1] == '/' ? line + 1 : line;
        if (!strcmp(line, "/reset")) {
            chat_log_clear(&log);
            if (system) chat_log_push(&log, "system", system);
            df_session_reset(m.s);
        } else if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
            fputs(chat_help, stdout);
        } else if (msg == line && line[0] == '/') {
            fprintf(stderr, "unknown command '%s' (not sent to the model); /help lists the commands, // starts a "
                    "message with /\n", line);
        } else if (*msg) {
            chat_log_push(&log, "user", msg);
            rc = chat_turn(&m, &log, &go, &err);
            if (rc == DF_EINVAL) {          /* e.g. the context is full: say so and keep the program */
                fprintf(stderr, "deltafin chat: %s\n", err.msg);
                log.n--;
                free((char *)log.v[log.n].content);
                rc = DF_OK;
            } else if (rc == DF_ECANCELLED) {     /* stopped during the prefill: the session was reset */
                fputs("[stopped; conversation restarted]\n", stdout);
                chat_log_clear(&log);
                if (system) chat_log_push(&log, "system", system);
                rc = DF_OK;
            }
        }
        free(line);
    }
    if (rc) fprintf(stderr, "deltafin chat: %s\n", err.msg);
    chat_log_clear(&log);
    free(log.v);
    cli_model_close(&m);
    return rc ? 1 : 0;
}
