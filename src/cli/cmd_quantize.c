/* cmd_quantize.c — `deltafin quantize`: writes the int8 spine sidecar beside a checkpoint
 * (`--spine int8`, format/int8_spine.h), and measures what it costs (`--compare`): the same tokens through
 * the checkpoint's spine and the int8 one, reporting top-1 agreement, KL(bf16 || int8) per row and the
 * perplexity of each on the tokens themselves. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cli_opts.h"
#include "deltafin.h"
#include "common/prompt.h"
#include "common/util.h"
#include "format/int8_spine.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin quantize -m DIR --spine int8 [--shard-size SIZE]\n"
               "       deltafin quantize -m DIR --compare (--prompt prompt.json | --ids FILE | --text FILE)\n"
               "                         [--window N] [--max-tokens N] [--threads N] [--json]\n"
               "  --spine int8      write per-row absmax int8 copies of the spine matrices (fp16 row scales) to\n"
               "                    DIR/" INT8_SPINE_FILE " (sharded with an index past --shard-size, default 4G)\n"
               "  --compare         run the tokens through the checkpoint's spine and the int8 one and report top-1\n"
               "                    agreement, KL(bf16 || int8) per row and perplexity (the int8 spine must exist)\n"
               "  --prompt FILE     a fixture prompt.json (prefill + decode, one batch)\n"
               "  --ids FILE        token ids as little-endian uint16 (the layout of the training scripts' *.ids)\n"
               "  --text FILE       text, tokenised with the model's tokenizer, [BOS] first\n"
               "  --window N        tokens per evaluation (default 512, at most the model's context); windows\n"
               "                    overlap by one token, so each token after the first is a target once\n"
               "  --max-tokens N    use only the first N tokens\n");
}

typedef struct cmp_stats {
    int64_t rows, agree, scored;
    double kl_sum, kl_max, nll_a, nll_b;
} cmp_stats;

/* log-softmax normaliser of a row, in double */
static double row_logsumexp(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - m);
    return m + log(s);
}

static int row_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Adds one row pair: a = reference (bf16 spine), b = int8; target < 0 when the row predicts nothing scored. */
static void cmp_row(cmp_stats *s, const float *a, const float *b, int V, int target) {
    double la = row_logsumexp(a, V), lb = row_logsumexp(b, V), kl = 0;
    for (int i = 0; i < V; i++) {
        double lpa = a[i] - la, lpb = b[i] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    if (kl < 0) kl = 0;   /* rounding */
    s->rows++;
    s->kl_sum += kl;
    if (kl > s->kl_max) s->kl_max = kl;
    s->agree += row_argmax(a, V) == row_argmax(b, V);
    if (target >= 0) {
        s->scored++;
        s->nll_a += la - a[target];
        s->nll_b += lb - b[target];
    }
}

static int read_ids(const char *path, int32_t **ids, int64_t *n, df_error *err) {
    size_t len;
    uint8_t *raw = (uint8_t *)df_read_file(path, &len, err);
    if (!raw) return err->code ? err->code : DF_EIO;
    if (len % 2) {
        free(raw);
        df_error_set(err, DF_EFORMAT, "%s: %zu bytes, not a whole number of uint16 ids", path, len);
        return DF_EFORMAT;
    }
    *n = (int64_t)(len / 2);
    *ids = xmalloc(sizeof **ids * (size_t)(*n + 1));
    for (int64_t i = 0; i < *n; i++) (*ids)[i] = raw[2 * i] | raw[2 * i + 1] << 8;
    free(raw);
    return DF_OK;
}

static int read_text(const char *path, const char *model, int bos, int32_t **ids, int64_t *n, df_error *err) {
    size_t len;
    char *text = df_read_file(path, &len, err);
    if (!text) return err->code ? err->code : DF_EIO;
    tokenizer *tk = NULL;
    tok_ids out = {0};
    tok_ids_push(&out, bos);
    int rc = tokenizer_load_dir(&tk, model, err);
    if (!rc) rc = tokenizer_encode(tk, text, len, 0, &out, err);
    tokenizer_free(tk);
    free(text);
    *ids = out.v;
    *n = (int64_t)out.n;
    return rc;
}

typedef struct cmp_opts {
    const char *prompt, *ids, *text;
    int window, json;
    int64_t max_tokens;
} cmp_opts;

static int compare(df_engine_opts *eo, const cmp_opts *co, df_error *err) {
    df_engine *e[2] = {0};
    df_session *s[2] = {0};
    int32_t *tok = NULL;
    int64_t n = 0;
    int rc = DF_OK, whole = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        eo->spine = k ? DF_SPINE_INT8 : DF_SPINE_BF16;
        rc = df_engine_open(&e[k], eo, err);
        if (!rc) rc = df_session_init(&s[k], e[k], err);
    }
    int V = rc ? 0 : df_engine_info(e[0])->vocab_size, bos = rc ? 0 : df_engine_info(e[0])->bos_id;
    if (!rc && co->prompt) {
        int32_t *pre = NULL, *dec = NULL;
        int np = 0, nd = 0;
        rc = prompt_read_file(co->prompt, &pre, &np, &dec, &nd, err);
        if (!rc) {
            n = np + nd;
            tok = xmalloc(sizeof *tok * (size_t)n);
            memcpy(tok, pre, sizeof *tok * (size_t)np);
            if (nd) memcpy(tok + np, dec, sizeof *tok * (size_t)nd);
            whole = 1;
        }
        free(pre);
        free(dec);
    } else if (!rc && co->ids) {
        rc = read_ids(co->ids, &tok, &n, err);
    } else if (!rc) {
        rc = read_text(co->text, eo->model_dir, bos, &tok, &n, err);
    }
    if (!rc && co->max_tokens > 0 && n > co->max_tokens) n = co->max_tokens;
    if (!rc && n < 2) rc = (df_error_set(err, DF_EINVAL, "need at least 2 tokens to compare, got %lld", (long long)n), DF_EINVAL);
    int64_t ctx = rc ? 0 : df_engine_info(e[0])->max_context;
    int W = whole ? (int)n : (int)(ctx > 1 ? DF_MIN((int64_t)co->window, ctx) : co->window);
    if (!rc && W < 2) rc = (df_error_set(err, DF_EINVAL, "--window must be at least 2"), DF_EINVAL);
    float *la = rc ? NULL : xmalloc(sizeof(float) * (size_t)W * V);
    float *lb = rc ? NULL : xmalloc(sizeof(float) * (size_t)W * V);
    cmp_stats st = {0};
    double t0 = df_now();
    /* windows of W tokens overlapping by one, so every token after the first is a target exactly once */
    for (int64_t w0 = 0; !rc && w0 + 1 < n; w0 += W - 1) {
        int len = (int)DF_MIN((int64_t)W, n - w0);
        if (whole) len = (int)n;
        for (int k = 0; k < 2 && !rc; k++) {
            df_session_reset(s[k]);
            rc = df_session_eval(s[k], tok + w0, len, k ? lb : la, 1, err);
        }
        int rows = whole ? len : len - 1;   /* the last row of a window predicts the next window's first token */
        for (int r = 0; !rc && r < rows; r++) {
            int target = r + 1 < len && tok[w0 + r + 1] != bos ? tok[w0 + r + 1] : -1;
            cmp_row(&st, la + (int64_t)r * V, lb + (int64_t)r * V, V, target);
        }
        if (whole) break;
    }
    if (!rc) {
        double ppl_a = exp(st.nll_a / (double)(st.scored ? st.scored : 1)),
               ppl_b = exp(st.nll_b / (double)(st.scored ? st.scored : 1));
        double agree = st.rows ? (double)st.agree / (double)st.rows : 0, kl_mean = st.rows ? st.kl_sum / st.rows : 0;
        if (co->json)
            printf("{\"rows\": %lld, \"top1_agreement\": %.6f, \"kl_mean\": %.6g, \"kl_max\": %.6g, \"scored\": %lld, "
                   "\"ppl_bf16\": %.4f, \"ppl_int8\": %.4f, \"ppl_change\": %.6f, \"seconds\": %.1f}\n",
                   (long long)st.rows, agree, kl_mean, st.kl_max, (long long)st.scored, ppl_a, ppl_b, ppl_b / ppl_a - 1,
                   df_now() - t0);
        else
            printf("rows: %lld\ntop-1 agreement: %.2f%% (%lld of %lld)\nKL(bf16 || int8) per row: mean %.3g, max %.3g "
                   "nats\nperplexity over %lld targets: checkpoint spine %.3f, int8 spine %.3f (%+.3f%%)\n",
                   (long long)st.rows, 100 * agree, (long long)st.agree, (long long)st.rows, kl_mean, st.kl_max,
                   (long long)st.scored, ppl_a, ppl_b, 100 * (ppl_b / ppl_a - 1));
    }
    free(la);
    free(lb);
    free(tok);
    for (int k = 0; k < 2; k++) {
        df_session_free(s[k]);
        df_engine_free(e[k]);
    }
    return rc;
}

static int write_spine(const char *dir, uint64_t shard_bytes, df_error *err) {
    int8_write_stats ws;
    double t0 = df_now();
    int rc = int8_spine_write(dir, shard_bytes, stderr, &ws, err);
    if (rc) return rc;
    printf("int8 spine: %d matrices, %.2f MiB -> %.2f MiB (%.1f%%), %d file%s, %.1f s\n"
           "spine of the checkpoint: %.2f MiB -> %.2f MiB with the int8 copies\n",
           ws.n_quantised, ws.src_bytes / 1048576.0, ws.out_bytes / 1048576.0,
           ws.src_bytes ? 100.0 * ws.out_bytes / ws.src_bytes : 0, ws.n_files, ws.n_files > 1 ? "s" : "",
           df_now() - t0, ws.spine_bytes / 1048576.0, (ws.spine_bytes - ws.src_bytes + ws.out_bytes) / 1048576.0);
    return DF_OK;
}

enum { OPT_COMPARE = 3001, OPT_PROMPT, OPT_IDS, OPT_TEXT, OPT_WINDOW, OPT_MAXTOK, OPT_JSON, OPT_SHARD };

int cmd_quantize(int argc, char **argv) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'},         {"threads", 1, 0, 't'},        {"help", 0, 0, 'h'},
        {"compare", 0, 0, OPT_COMPARE}, {"prompt", 1, 0, OPT_PROMPT}, {"ids", 1, 0, OPT_IDS},
        {"text", 1, 0, OPT_TEXT},     {"window", 1, 0, OPT_WINDOW},  {"max-tokens", 1, 0, OPT_MAXTOK},
        {"json", 0, 0, OPT_JSON},     {"shard-size", 1, 0, OPT_SHARD}, CLI_STORAGE_LONGOPTS,
        {0, 0, 0, 0}};
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    cmp_opts co = {.window = 512};
    int do_compare = 0, c;
    uint64_t shard = 0;
    eo.spine = -1;
    while ((c = getopt_long(argc, argv, "m:t:h", lo, NULL)) != -1) {
        int s = cli_storage_opt(c, optarg, &eo);
        if (s > 0) continue;
        if (s < 0) return 2;
        switch (c) {
        case 'm': eo.model_dir = optarg; break;
        case 't': eo.n_threads = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        case OPT_COMPARE: do_compare = 1; break;
        case OPT_PROMPT: co.prompt = optarg; break;
        case OPT_IDS: co.ids = optarg; break;
        case OPT_TEXT: co.text = optarg; break;
        case OPT_WINDOW: co.window = atoi(optarg); break;
        case OPT_MAXTOK: co.max_tokens = atoll(optarg); break;
        case OPT_JSON: co.json = 1; break;
        case OPT_SHARD:
            if (cli_parse_bytes(optarg, &shard) || !shard) {
                fprintf(stderr, "deltafin quantize: --shard-size: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        default: usage(stderr); return 2;
        }
    }
    char defm[4096];
    if (!eo.model_dir) eo.model_dir = cli_default_model(defm, sizeof defm);
    int sources = !!co.prompt + !!co.ids + !!co.text;
    if (optind < argc || (do_compare ? sources != 1 || co.window < 1 : eo.spine != DF_SPINE_INT8)) {
        if (!do_compare && eo.spine == DF_SPINE_BF16)
            fprintf(stderr, "deltafin quantize: the bf16 spine is the checkpoint itself; nothing to write\n");
        usage(stderr);
        return 2;
    }
    df_error err = {0};
    int rc = do_compare ? compare(&eo, &co, &err) : write_spine(eo.model_dir, shard, &err);
    if (rc) fprintf(stderr, "deltafin quantize: %s\n", err.msg);
    return rc ? 1 : 0;
}
