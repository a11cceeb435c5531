/* cmd_run.c — `deltafin run`: a continuation of a text prompt (-p, or -f FILE / stdin) streamed as it is
 * generated (or, with --tokens, of a token-id prompt printed as ids), then the speed. --chat wraps the prompt
 * as one user turn of the model's chat format and prints the reasoning part apart from the answer. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_gen.h"
#include "common/util.h"

static int parse_ids(const char *s, tok_ids *out) {
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return -1;
        tok_ids_push(out, (int32_t)v);
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return out->n ? 0 : -1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin run [-m DIR] (-p TEXT | -f FILE | --tokens 1,2,3) [options]\n"
               "  -p, --prompt TEXT   text prompt (raw completion; with --chat, one user message)\n"
               "  -f, --file FILE     read the prompt from FILE (- = standard input); one final newline is dropped\n"
               "  --tokens IDS        token-id prompt; the continuation is printed as ids\n"
               "  --chat              use the model's chat format and show its reasoning apart\n"
               "  --stats-json FILE   write the decode counters (tokens, passes, drafted, bytes...) as JSON\n%s",
            cli_gen_usage());
}

/* Builds the prompt ids: text encoded raw, a chat turn, or the ids given. */
/* The prompt text of -f: the whole file, or standard input for "-", without one final newline. */
static char *run_read_prompt(const char *path, size_t *len, df_error *err) {
    char *text;
    if (strcmp(path, "-")) {
        text = df_read_file(path, len, err);
    } else {
        size_t cap = 1 << 16;
        text = xmalloc(cap);
        *len = 0;
        size_t got;
        while ((got = fread(text + *len, 1, cap - *len - 1, stdin)) > 0)
            if ((*len += got) + 1 == cap) text = xrealloc(text, cap *= 2);
        if (ferror(stdin)) {
            free(text);
            df_error_set(err, DF_EIO, "-f -: cannot read standard input");
            return NULL;
        }
        text[*len] = 0;
    }
    if (text && *len && text[*len - 1] == '\n') text[--*len] = 0;
    if (text && *len && text[*len - 1] == '\r') text[--*len] = 0;
    if (text && !*len) {
        free(text);
        df_error_set(err, DF_EINVAL, "-f %s: the prompt is empty", path);
        return NULL;
    }
    return text;
}

static int run_prompt(cli_model *m, const char *text, size_t len, const char *ids, int chat, tok_ids *out,
                      df_error *err) {
    if (ids) {
        if (parse_ids(ids, out)) {
            df_error_set(err, DF_EINVAL, "--tokens needs a comma-separated list of token ids");
            return DF_EINVAL;
        }
        return DF_OK;
    }
    if (!chat) return tokenizer_encode(m->tok, text, len, 0, out, err);
    if (!m->fmt) {
        df_error_set(err, DF_EINVAL, "--chat: this model folder has no chat format (its tokenizer lacks the "
                     "K3 or K2 chat tokens)");
        return DF_EINVAL;
    }
    chat_message msg = {"user", text, NULL};
    chat_opts co;
    chat_opts_default(&co);
    co.thinking = m->fmt == CHAT_K3;
    return chat_render(m->tok, m->fmt, &msg, 1, &co, out, err);
}

int cmd_run(int argc, char **argv) {
    struct option longopts[CLI_GEN_N_LONGOPTS + 7];
    memcpy(longopts, cli_gen_longopts, sizeof cli_gen_longopts);
    struct option extra[] = {{"prompt", 1, 0, 'p'}, {"file", 1, 0, 'f'}, {"tokens", 1, 0, 2001},
                             {"chat", 0, 0, 2002}, {"help", 0, 0, 'h'}, {"stats-json", 1, 0, 2003}, {0, 0, 0, 0}};
    memcpy(longopts + CLI_GEN_N_LONGOPTS, extra, sizeof extra);
    cli_gen_opts go;
    cli_gen_opts_default(&go);
    const char *text = NULL, *ids = NULL, *file = NULL, *stats_json = NULL;
    int chat = 0, c;
    while ((c = getopt_long(argc, argv, "m:n:t:p:f:h", longopts, NULL)) != -1) {
        int r = cli_gen_parse(&go, c, optarg);
        if (r > 0) continue;
        if (c == 'p') text = optarg;
        else if (c == 'f') file = optarg;
        else if (c == 2001) ids = optarg;
        else if (c == 2002) chat = 1;
        else if (c == 2003) stats_json = optarg;
        else if (c == 'h') return usage(stdout), 0;
        else {
            if (r < 0) fprintf(stderr, "deltafin run --help lists the options\n");
            else usage(stderr);
            return 2;
        }
    }
    if (cli_no_stray_args("run", argc, argv, optind)) return 2;
    if (!!text + !!ids + !!file != 1) {
        fprintf(stderr, "deltafin run: give exactly one prompt: -p TEXT, -f FILE (- for standard input) or --tokens "
                "IDS\n");
        usage(stderr);
        return 2;
    }
    if (ids && chat) {
        fprintf(stderr, "deltafin run: --chat needs a text prompt (-p or -f), not --tokens\n");
        return 2;
    }
    int served;
    if (cli_rank_serve(&go.eng, "run", &served)) return served;
    cli_gen_pick_seed(&go);
    df_error err = {0};
    size_t text_len = text ? strlen(text) : 0;
    char *file_text = file ? run_read_prompt(file, &text_len, &err) : NULL;   /* Ctrl-C still ends a stdin wait */
    if (file_text) text = file_text;
    int rc = file && !file_text ? err.code : DF_OK;
    cli_sigint_block();
    cli_model m = {0};
    tok_ids prompt = {0};
    gen_result res = {0};
    if (!rc) rc = cli_model_open(&m, &go, !ids, &err);
    if (!rc) rc = run_prompt(&m, text, text_len, ids, chat, &prompt, &err);
    if (!rc) rc = cli_prompt_fits(&m, prompt.n, &err);
    double t0 = df_now(), t1 = t0;
    cli_stream out = {.m = &m, .ids_only = ids != NULL, .profile = go.profile};
    if (!rc) df_engine_profile(m.eng, &out.prof);   /* token 0's profile line then covers the prefill */
    if (!rc) rc = cli_prefill(&m, prompt.v, (int)prompt.n, &err);
    df_stats st0 = {0}, st1 = {0};
    if (!rc) df_engine_stats(m.eng, &st0);
    if (!rc) {
        t1 = df_now();
        int64_t room = df_engine_info(m.eng)->max_context - df_session_pos(m.s) + 1;   /* the last is not fed */
        gen_config gc = {.tok = ids ? NULL : m.tok, .chat = chat, .fmt = m.fmt, .in_reasoning = chat && m.fmt == CHAT_K3,
                         .max_tokens = go.max_tokens < room ? go.max_tokens : (int)room,
                         .eos_id = df_engine_info(m.eng)->eos_id, .sp = go.sp, .spec = m.spec};
        rc = gen_run(m.s, &gc, m.logits, m.n_vocab, cli_stream_event, &out, &res, &err);
        if (rc == DF_ECANCELLED) rc = DF_OK;
        df_engine_stats(m.eng, &st1);
        cli_stream_end(&out);
        if (res.ids.n) fputs("\n", stdout);
        fflush(stdout);
        if (!rc) cli_context_notice(&m, &res, go.max_tokens, gc.max_tokens);
    }
    if (rc) {
        fprintf(stderr, "deltafin run: %s\n", err.msg);
    } else {
        fprintf(stderr, "prefill %zu tokens in %.2f s (%.1f tokens/s); generated %zu tokens in %.2f s (%.2f tokens/s)\n",
                prompt.n, t1 - t0, prompt.n / (t1 - t0 + 1e-9), res.ids.n, res.decode_s,
                res.decode_s > 0 ? res.ids.n / res.decode_s : 0.0);
        if (go.profile) cli_lookahead_line(m.eng, stderr);
        if (go.profile || m.spec) cli_spec_summary(&m, &res);
        if (stats_json && cli_write_stats_json(stats_json, &res, &st0, &st1, &err)) {
            fprintf(stderr, "deltafin run: %s\n", err.msg);
            rc = DF_EIO;
        }
    }
    tok_ids_free(&res.ids);
    tok_ids_free(&prompt);
    free(file_text);
    cli_model_close(&m);
    return rc ? 1 : 0;
}
