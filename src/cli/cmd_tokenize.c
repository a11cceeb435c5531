/* cmd_tokenize.c — `deltafin tokenize` (text → JSON id array) and `deltafin detokenize` (ids → bytes), with
 * either a bare tiktoken rank file plus a pattern or a model folder's own tokenizer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/util.h"
#include "tokenizer/tokenizer.h"

typedef struct tok_args {
    const char *tiktoken, *pattern, *model, *text, *file, *jsonl, *ids;
    int special, bench;
} tok_args;

static void tok_usage(FILE *f, int detok) {
    if (detok)
        fprintf(f, "usage: deltafin detokenize (--tiktoken FILE [--pattern P] | -m DIR) [--ids '[1,2]']\n"
                   "  ids are a JSON array (from --ids or stdin); the token bytes are written to stdout\n");
    else
        fprintf(f,
                "usage: deltafin tokenize (--tiktoken FILE [--pattern kimi|cl100k|o200k|REGEX] | -m DIR)\n"
                "                         (--text T | --file F | --jsonl F) [--special] [--bench N]\n"
                "  prints the ids as one JSON array; --jsonl: one JSON string per input line, one array per\n"
                "  output line; --special: special-token strings in the text become their ids;\n"
                "  --bench N: encode N times and print the speed instead (JSON)\n"
                "  without --tiktoken or -m the default model folder is used\n");
}

static int tok_parse_args(int argc, char **argv, tok_args *a, int detok) {
    memset(a, 0, sizeof *a);
    a->pattern = TOK_PATTERN_KIMI;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            tok_usage(stdout, detok);
            return 1;
        }
        if (!strcmp(o, "--special")) {
            a->special = 1;
            continue;
        }
        const char **dst = !strcmp(o, "--tiktoken") ? &a->tiktoken
                           : !strcmp(o, "--pattern") ? &a->pattern
                           : (!strcmp(o, "-m") || !strcmp(o, "--model")) ? &a->model
                           : !detok && !strcmp(o, "--text") ? &a->text
                           : !detok && !strcmp(o, "--file") ? &a->file
                           : !detok && !strcmp(o, "--jsonl") ? &a->jsonl
                           : detok && !strcmp(o, "--ids") ? &a->ids
                                                           : NULL;
        if (!detok && !strcmp(o, "--bench") && i + 1 < argc) {
            a->bench = atoi(argv[++i]);
            if (a->bench < 1) a->bench = 1;
            continue;
        }
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "deltafin %s: bad or incomplete option '%s'\n", argv[0], o);
            tok_usage(stderr, detok);
            return 2;
        }
        *dst = argv[++i];
    }
    if (a->tiktoken && a->model) {
        fprintf(stderr, "deltafin %s: give --tiktoken or -m, not both\n", argv[0]);
        return 2;
    }
    if (!detok && !!a->text + !!a->file + !!a->jsonl != 1) {
        fprintf(stderr, "deltafin %s: give exactly one of --text, --file, --jsonl\n", argv[0]);
        tok_usage(stderr, detok);
        return 2;
    }
    return 0;
}

static tokenizer *tok_open(const tok_args *a) {
    df_error err = {0};
    tokenizer *t = NULL;
    char defm[4096];
    int rc = a->tiktoken ? tokenizer_load_tiktoken(&t, a->tiktoken, a->pattern, &err)
                         : tokenizer_load_dir(&t, a->model ? a->model : cli_default_model(defm, sizeof defm), &err);
    if (rc) {
        fprintf(stderr, "deltafin: tokenizer: %s\n", err.msg);
        return NULL;
    }
    return t;
}

static void print_ids(const tok_ids *ids) {
    putchar('[');
    for (size_t i = 0; i < ids->n; i++) printf(i ? ",%d" : "%d", (int)ids->v[i]);
    printf("]\n");
}

static int tok_encode_print(const tokenizer *t, const char *text, size_t len, int special) {
    tok_ids ids = {0};
    df_error err = {0};
    int rc = tokenizer_encode(t, text, len, special, &ids, &err);
    if (rc)
        fprintf(stderr, "deltafin tokenize: %s\n", err.msg);
    else
        print_ids(&ids);
    tok_ids_free(&ids);
    return rc ? 1 : 0;
}

static int tok_jsonl(const tokenizer *t, const char *path, int special) {
    df_error err = {0};
    size_t len;
    char *all = df_read_file(path, &len, &err);
    if (!all) {
        fprintf(stderr, "deltafin tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = 0, line = 0;
    for (char *p = all, *e; rc == 0 && p < all + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(all + len - p));
        if (!e) e = all + len;
        line++;
        if (e == p) continue;
        json_error_t je;
        json_t *s = json_loadb(p, (size_t)(e - p), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!json_is_string(s)) {
            fprintf(stderr, "deltafin tokenize: %s:%d: expected a JSON string per line\n", path, line);
            rc = 1;
        } else {
            rc = tok_encode_print(t, json_string_value(s), json_string_length(s), special);
        }
        json_decref(s);
    }
    free(all);
    return rc;
}

static int tok_bench(const tokenizer *t, const char *text, size_t len, int reps, int special) {
    double best = 1e30;
    size_t n = 0;
    for (int r = 0; r < reps; r++) {
        tok_ids ids = {0};
        df_error err = {0};
        double t0 = df_now();
        int rc = tokenizer_encode(t, text, len, special, &ids, &err);
        double dt = df_now() - t0;
        n = ids.n;
        tok_ids_free(&ids);
        if (rc) {
            fprintf(stderr, "deltafin tokenize: %s\n", err.msg);
            return 1;
        }
        if (dt < best) best = dt;
    }
    printf("{\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"mb_per_s\":%.2f}\n", len, n, best, len / best / 1e6);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int rc = tok_parse_args(argc, argv, &a, 0);
    if (rc) return rc == 1 ? 0 : rc;
    tokenizer *t = tok_open(&a);
    if (!t) return 1;
    if (a.jsonl) {
        rc = tok_jsonl(t, a.jsonl, a.special);
    } else {
        df_error err = {0};
        size_t len = a.text ? strlen(a.text) : 0;
        char *buf = a.file ? df_read_file(a.file, &len, &err) : NULL;
        const char *text = a.text ? a.text : buf;
        if (!text) {
            fprintf(stderr, "deltafin tokenize: %s\n", err.msg);
            rc = 1;
        } else {
            rc = a.bench ? tok_bench(t, text, len, a.bench, a.special) : tok_encode_print(t, text, len, a.special);
        }
        free(buf);
    }
    tokenizer_free(t);
    return rc;
}

static char *read_stdin(void) {
    size_t len = 0, cap = 4096;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += got;
        if (cap - len < 2) buf = xrealloc(buf, cap *= 2);
    }
    buf[len] = 0;
    return buf;
}

/* Parses a JSON array of integer ids. */
static int parse_ids(const char *s, tok_ids *ids) {
    json_error_t je;
    json_t *arr = json_loads(s, JSON_DECODE_ANY, &je);
    int rc = 0;
    if (!json_is_array(arr)) {
        fprintf(stderr, "deltafin detokenize: expected a JSON array of ids (%s)\n", arr ? "not an array" : je.text);
        rc = 2;
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(arr); i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            fprintf(stderr, "deltafin detokenize: element %zu is not a token id\n", i);
            rc = 2;
        } else {
            tok_ids_push(ids, (int32_t)json_integer_value(v));
        }
    }
    json_decref(arr);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    tok_args a;
    int rc = tok_parse_args(argc, argv, &a, 1);
    if (rc) return rc == 1 ? 0 : rc;
    char *in = a.ids ? NULL : read_stdin();
    tok_ids ids = {0};
    rc = parse_ids(a.ids ? a.ids : in, &ids);
    free(in);
    tokenizer *t = rc ? NULL : tok_open(&a);
    if (!rc && !t) rc = 1;
    if (t) {
        df_error err = {0};
        char *buf = NULL;
        size_t len = 0, cap = 0;
        if (tokenizer_decode(t, ids.v, ids.n, &buf, &len, &cap, &err)) {
            fprintf(stderr, "deltafin detokenize: %s\n", err.msg);
            rc = 1;
        } else {
            fwrite(buf, 1, len, stdout);
        }
        free(buf);
        tokenizer_free(t);
    }
    tok_ids_free(&ids);
    return rc;
}
