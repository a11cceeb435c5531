/* main.c — `deltafin` entry point: dispatches to a subcommand, and fails a command whose results could not
 * all be written to standard output (a full disk, a closed pipe), since a truncated result must not look
 * like a complete one. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate a continuation of a prompt"},
    {"chat", cmd_chat, "interactive chat"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"fetch", cmd_fetch, "download a model or parts of it"},
    {"bench", cmd_bench, "benchmarks: decode, kernels, fetch"},
    {"synth", cmd_synth, "write a synthetic checkpoint with real shapes"},
    {"logits", cmd_logits, "write the logits of a token prompt"},
    {"info", cmd_info, "describe a checkpoint"},
    {"verify", cmd_verify, "check a model folder offline: shapes, install hashes, token oracle"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"quantize", cmd_quantize, "write an int8 spine"},
    {"place", cmd_place, "spread the routed experts over folders on several devices"},
    {"warm", cmd_warm, "read the hottest experts (saved heat) into the cache or disk cache"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin COMMAND [options]   (deltafin COMMAND --help for options)\n"
               "       deltafin --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
}

/* rc, or 1 after a message when something written to stdout was lost */
static int stdout_checked(const char *cmd, int rc) {
    errno = 0;
    int bad = fflush(stdout) == EOF;
    int e = errno;
    if (!bad && !ferror(stdout)) return rc;
    fprintf(stderr, "deltafin%s%s: writing the output failed (%s)\n", cmd ? " " : "", cmd ? cmd : "",
            e ? strerror(e) : "a write error");
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    /* a closed pipe is a write error to report, not a silent death by signal */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return stdout_checked(NULL, argc < 2 ? 2 : 0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("deltafin %s\n", DF_VERSION);
        return stdout_checked(NULL, 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return stdout_checked(argv[1], commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "deltafin: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
