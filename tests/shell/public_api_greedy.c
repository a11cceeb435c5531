/* public_api_greedy.c — a program that uses the installed library through <deltafin.h> alone: opens a model,
 * evaluates a prompt of token ids and decodes greedily, printing the chosen ids comma-separated. Built against
 * `make install`'s archive by test_public_lib.sh. */
#include <deltafin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const df_error *err) {
    fprintf(stderr, "public_api_greedy: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: public_api_greedy MODEL_DIR ID,ID,... N\n");
        return 2;
    }
    int32_t prompt[256];
    int n_prompt = 0;
    for (char *p = argv[2]; *p && n_prompt < 256; p += *p == ',') prompt[n_prompt++] = (int32_t)strtol(p, &p, 10);
    int n_gen = atoi(argv[3]);
    df_engine_opts opts;
    df_engine_opts_default(&opts);
    opts.model_dir = argv[1];
    df_error err = {0};
    df_engine *eng = NULL;
    df_session *s = NULL;
    if (df_engine_open(&eng, &opts, &err)) return fail("open", &err);
    if (df_session_init(&s, eng, &err)) return fail("session", &err);
    int vocab = df_engine_info(eng)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    if (!logits || df_session_eval(s, prompt, n_prompt, logits, 0, &err)) return fail("prompt", &err);
    for (int i = 0; i < n_gen; i++) {
        int32_t best = 0;
        for (int32_t t = 1; t < vocab; t++)
            if (logits[t] > logits[best]) best = t;
        printf("%s%d", i ? "," : "", (int)best);
        if (df_session_eval(s, &best, 1, logits, 0, &err)) return fail("decode", &err);
    }
    printf("\n");
    free(logits);
    df_session_free(s);
    df_engine_free(eng);
    return 0;
}
