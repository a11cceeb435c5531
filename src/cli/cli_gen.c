/* cli_gen.c — shared plumbing of the text commands (see cli_gen.h). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"
#include "cli_gen.h"
#include "cli_opts.h"
#include "common/util.h"
#include "install/dcache.h"

const struct option cli_gen_longopts[CLI_GEN_N_LONGOPTS + 1] = {
    {"model", 1, 0, 'm'}, {"threads", 1, 0, 't'}, {"temp", 1, 0, 1001}, {"top-p", 1, 0, 1002},
    {"top-k", 1, 0, 1003}, {"seed", 1, 0, 1004}, {"min-p", 1, 0, 1005}, {"profile", 0, 0, 1006},
    {"max-tokens", 1, 0, 'n'}, CLI_STORAGE_LONGOPTS, CLI_SPEC_LONGOPTS, {0, 0, 0, 0}};

const char *cli_gen_usage(void) {
    return "  -m, --model DIR     model folder (default: $DELTAFIN_MODEL, else the bundled model next to the\n"
           "                      executable, in PREFIX/share/deltafin after make install, or ./models/default)\n"
           "  -n, --max-tokens N  tokens to generate (default 128)\n"
           "  -t, --threads N     compute threads (default: all cores)\n"
           "  --temp T            temperature 0-100, 0 = greedy (default 0)\n"
           "  --top-p P --top-k K --min-p P   sampling filters (default off)\n"
           "  --seed S            sampling seed 0-2147483647 (default: random when --temp > 0, and printed)\n"
           "  --profile           print the per-phase time of each token\n"
           "speculative decoding:\n" CLI_SPEC_USAGE
           "storage options:\n" CLI_STORAGE_USAGE;
}

void cli_gen_opts_default(cli_gen_opts *o) {
    memset(o, 0, sizeof *o);
    df_engine_opts_default(&o->eng);
    o->eng.heat = DF_HEAT_ON;
    o->eng.ctx_tokens = CLI_DEFAULT_CTX;
    sample_params_default(&o->sp);
    o->sp.temperature = 0.0f;
    o->max_tokens = 128;
    spec_opts_default(&o->spec);
}

int cli_gen_parse(cli_gen_opts *o, int opt, const char *arg) {
    long v;
    int r;
    switch (opt) {
    case 'm': o->eng.model_dir = arg; return 1;
    case 't':
        if ((r = cli_parse_int("-t/--threads", arg, 1, 1024, &v)) > 0) o->eng.n_threads = (int)v;
        return r;
    case 'n':
        if ((r = cli_parse_int("-n/--max-tokens", arg, 1, 1 << 24, &v)) > 0) o->max_tokens = (int)v;
        return r;
    case 1001: return cli_parse_float("--temp", arg, "0", "100", &o->sp.temperature);
    case 1002: return cli_parse_float("--top-p", arg, "0", "1", &o->sp.top_p);
    case 1003:
        if ((r = cli_parse_int("--top-k", arg, 0, 1 << 24, &v)) > 0) o->sp.top_k = (int)v;
        return r;
    case 1004:
        if ((r = cli_parse_int("--seed", arg, 0, CLI_SEED_MAX, &v)) > 0) o->sp.seed = (uint64_t)v, o->seed_set = 1;
        return r;
    case 1005: return cli_parse_float("--min-p", arg, "0", "1", &o->sp.min_p);
    case 1006: o->profile = 1; return 1;
    default: {
        int r = cli_storage_opt(opt, arg, &o->eng);
        return r ? r : cli_spec_opt(opt, arg, &o->spec);
    }
    }
}

void cli_gen_pick_seed(cli_gen_opts *o) {
    if (o->seed_set || o->sp.temperature <= 0) return;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)(df_now() * 1e9) ^ (uint64_t)getpid();
    o->sp.seed = r % ((uint64_t)CLI_SEED_MAX + 1);
    fprintf(stderr, "seed %llu (--seed %llu repeats this output)\n", (unsigned long long)o->sp.seed,
            (unsigned long long)o->sp.seed);
}

/* A partial install (deltafin fetch --spine / --layers) streams its missing experts from the repository it
 * was fetched from, as recorded in its manifest, unless --remote names another. */
static void use_recorded_source(df_engine_opts *eo, char **owned) {
    dc_manifest man;
    int found = 0;
    df_error err = {0};
    if (eo->remote_url || dc_manifest_load(eo->model_dir, &man, &found, &err) || !found) return;
    int partial = 0;
    for (int i = 0; i < man.n; i++) partial |= man.shards[i].state != DC_COMPLETE;
    if (partial && man.source) {
        *owned = xstrdup(man.source);
        eo->remote_url = *owned;
        fprintf(stderr, "partial install: missing experts stream from %s (recorded by deltafin fetch; --remote "
                "overrides)\n", *owned);
    }
    dc_manifest_free(&man);
}

int cli_model_open(cli_model *m, const cli_gen_opts *o, int need_tokenizer, df_error *err) {
    memset(m, 0, sizeof *m);
    df_engine_opts eo = o->eng;
    if (!eo.model_dir) eo.model_dir = cli_default_model(m->dir_buf, sizeof m->dir_buf);
    m->dir = eo.model_dir;
    use_recorded_source(&eo, &m->remote);
    int rc = df_engine_open(&m->eng, &eo, err);
    if (!rc && df_engine_heat_note(m->eng)[0]) fprintf(stderr, "deltafin: warning: %s\n", df_engine_heat_note(m->eng));
    if (!rc) rc = df_session_init(&m->s, m->eng, err);
    if (!rc && o->spec.mode != SPEC_OFF) {
        spec_opts so = o->spec;
        so.n_threads = eo.n_threads;
        rc = spec_init(&m->spec, &so, m->eng, err);
    }
    if (rc) return rc;
    m->n_vocab = df_engine_info(m->eng)->vocab_size;
    m->logits = xmalloc((size_t)m->n_vocab * sizeof(float));
    df_error terr = {0};
    if (tokenizer_load_dir(&m->tok, eo.model_dir, &terr)) {
        m->tok = NULL;
        if (need_tokenizer) {
            *err = terr;
            return terr.code;
        }
    } else if (chat_detect_format(m->tok, &m->fmt, &terr)) {
        m->fmt = 0;
    }
    return DF_OK;
}

void cli_model_close(cli_model *m) {
    free(m->logits);
    spec_free(m->spec);
    free(m->remote);
    tokenizer_free(m->tok);
    df_session_free(m->s);
    df_engine_free(m->eng);
    memset(m, 0, sizeof *m);
}

void cli_sigint_block(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

int cli_sigint_pending(void) {
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    if (sigpending(&pend) || !sigismember(&pend, SIGINT)) return 0;
    struct timespec zero = {0, 0};
    sigtimedwait(&set, NULL, &zero);
    return 1;
}

typedef struct {
    int show;
    int n_tokens;
    double t0;
} prefill_progress;

static int prefill_step(void *ctx, int layer, int n_layers) {
    prefill_progress *p = ctx;
    if (p->show)
        fprintf(stderr, "\r\033[Kprefill %d tokens: layer %d/%d (%.1f s)", p->n_tokens, layer + 1, n_layers,
                df_now() - p->t0);
    return cli_sigint_pending();
}

int cli_prefill(cli_model *m, const int32_t *ids, int n, df_error *err) {
    prefill_progress p = {isatty(STDERR_FILENO) && n >= 64, n, df_now()};
    df_session_set_step_callback(m->s, prefill_step, &p);
    int rc = df_session_eval(m->s, ids, n, m->logits, 0, err);
    df_session_set_step_callback(m->s, NULL, NULL);
    if (p.show) fprintf(stderr, "\r\033[K");
    return rc;
}

int cli_prompt_fits(cli_model *m, size_t n_prompt, df_error *err) {
    int64_t ctx = df_engine_info(m->eng)->max_context;
    if ((int64_t)n_prompt + df_session_pos(m->s) <= ctx) return DF_OK;
    return df_error_set(err, DF_EINVAL, "the prompt is %zu tokens%s, more than the context of %lld tokens (--ctx, up "
                        "to the model's)", n_prompt, df_session_pos(m->s) ? " on top of the conversation so far" : "",
                        (long long)ctx),
           DF_EINVAL;
}

void cli_context_notice(cli_model *m, const gen_result *res, int asked, int allowed) {
    if (allowed < asked && res->finish == GEN_FINISH_LENGTH && (int)res->ids.n >= allowed)
        fprintf(stderr, "[stopped at the context limit: the context of %lld tokens is full (--ctx, up to the model's)]\n",
                (long long)df_engine_info(m->eng)->max_context);
}

void cli_profile_line(cli_model *m, int index, df_profile *prev) {
    df_profile now;
    df_engine_profile(m->eng, &now);
    fprintf(stderr, "[token %d] %.1f ms: spine read %.1f, expert read %.1f, attention %.1f, expert compute %.1f, "
            "spine compute %.1f, lm_head %.1f\n", index, (now.total - prev->total) * 1e3,
            (now.spine_read - prev->spine_read) * 1e3, (now.expert_read - prev->expert_read) * 1e3,
            (now.attention - prev->attention) * 1e3, (now.expert_compute - prev->expert_compute) * 1e3,
            (now.spine_compute - prev->spine_compute) * 1e3, (now.lm_head - prev->lm_head) * 1e3);
    *prev = now;
}

void cli_lookahead_precision(FILE *f, const df_layer_lookahead *la, int n, int json) {
    if (json) fputc('[', f);
    for (int rank = 0, k = 0; rank < DF_LOOKAHEAD_RANKS; rank++) {
        uint64_t g = 0, rec = 0;
        for (int l = 0; l < n; l++) g += la[l].guessed_rank[rank], rec += la[l].recalled_rank[rank];
        if (!g) continue;
        if (json) fprintf(f, "%s%.4f", k++ ? "," : "", (double)rec / (double)g);
        else fprintf(f, "%s%.0f%%", k++ ? " " : "", 100.0 * (double)rec / (double)g);
    }
    if (json) fputc(']', f);
}

int cli_lookahead_layers(FILE *f, const df_layer_lookahead *la, int n, const char *when) {
    int any = 0;
    for (int l = 0; l < n; l++) {
        if (!la[l].requests && !la[l].loads) continue;
        if (!any++) fprintf(f, "recall per layer (*N = its N surest guesses read %s, * = all):", when);
        fprintf(f, "%s L%d %.0f%%", any > 1 ? "," : "", l,
                la[l].requests ? 100.0 * (double)la[l].recalled / (double)la[l].requests : 0.0);
        if (la[l].read_ranks >= DF_LOOKAHEAD_RANKS) fputc('*', f);
        else if (la[l].read_ranks) fprintf(f, "*%d", la[l].read_ranks);
    }
    return any;
}

void cli_lookahead_line(df_engine *eng, FILE *f) {
    int n = df_engine_info(eng)->n_layers, any = 0;
    df_layer_lookahead *la = xcalloc((size_t)n + 1, sizeof *la);
    for (int l = 0; l < n; l++) {
        df_engine_lookahead_layer(eng, l, &la[l]);
        any |= la[l].requests || la[l].loads;
    }
    if (any) {
        fputs("look-ahead ", f);
        cli_lookahead_layers(f, la, n, "now");
        fputc('\n', f);
    }
    free(la);
}

int cli_stream_event(void *ctx, const gen_event *ev) {
    cli_stream *o = ctx;
    if (o->ids_only) {
        printf("%s%d", o->n_tok ? "," : "", ev->id);
    } else {
        if (ev->reasoning_len) {
            if (!o->reasoning_open) fputs("\033[2m", stdout);
            o->reasoning_open = 1;
            fwrite(ev->reasoning, 1, ev->reasoning_len, stdout);
        }
        if (ev->content_len) {
            if (o->reasoning_open) fputs("\033[0m\n", stdout);
            o->reasoning_open = 0;
            fwrite(ev->content, 1, ev->content_len, stdout);
        }
    }
    /* output that cannot be written ends the generation; main reports the error */
    if (fflush(stdout) == EOF || ferror(stdout)) return 1;
    if (o->profile) cli_profile_line(o->m, o->n_tok, &o->prof);
    o->n_tok++;
    return cli_sigint_pending();
}

void cli_stream_end(cli_stream *o) {
    if (o->reasoning_open) fputs("\033[0m", stdout);
    o->reasoning_open = 0;
}

void cli_spec_summary(const cli_model *m, const gen_result *res) {
    if (!m->spec || !res->passes) return;
    double n = (double)res->ids.n;
    fprintf(stderr, "speculation %s: %d passes after the prompt for %zu tokens (%.2f tokens/pass, %.2f passes/token); "
            "drafted %d, accepted %d (%.0f%%)\n", spec_mode_name(spec_get_mode(m->spec)), res->passes, res->ids.n,
            n / res->passes, res->passes / n, res->drafted, res->accepted,
            res->drafted ? 100.0 * res->accepted / res->drafted : 0.0);
}

int cli_write_stats_json(const char *path, const gen_result *res, const df_stats *a, const df_stats *b,
                         df_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) {
        df_error_set(err, DF_EIO, "--stats-json %s: %s", path, strerror(errno));
        return DF_EIO;
    }
    double n = (double)DF_MAX(res->ids.n, (size_t)1);
    uint64_t disk = b->disk_bytes - a->disk_bytes;
    fprintf(f, "{\"tokens\":%zu,\"passes\":%d,\"tokens_per_pass\":%.4f,\"drafted\":%d,\"accepted\":%d,"
            "\"decode_s\":%.6f,\"s_per_token\":%.6f,\"disk_bytes\":%llu,\"disk_bytes_per_token\":%.1f,"
            "\"expert_bytes_per_token\":%.1f,\"spine_bytes_per_token\":%.1f}\n",
            res->ids.n, res->passes, res->passes ? (double)res->ids.n / res->passes : 0.0, res->drafted,
            res->accepted, res->decode_s, res->decode_s / n, (unsigned long long)disk, disk / n,
            (b->expert_disk_bytes - a->expert_disk_bytes) / n, (b->spine_disk_bytes - a->spine_disk_bytes) / n);
    if (fclose(f)) {
        df_error_set(err, DF_EIO, "--stats-json %s: %s", path, strerror(errno));
        return DF_EIO;
    }
    return DF_OK;
}
