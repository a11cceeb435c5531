/* cli_opts.c — the storage options shared by engine-opening commands, and the checked number parsing every
 * command uses so that a bad value is reported with its flag and accepted range (see cli_opts.h). */
#include "cli_opts.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cli_parse_int(const char *flag, const char *arg, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "deltafin: %s: expected an integer from %ld to %ld, got '%s'\n", flag, lo, hi, arg);
        return -1;
    }
    *out = v;
    return 1;
}

/* The bounds are decimal text parsed like the argument, so a value written as its bound ("0.1" against
 * "0.1") compares equal whatever binary fraction both round to; a bound held in a float would not. */
int cli_parse_float(const char *flag, const char *arg, const char *lo, const char *hi, float *out) {
    char *end;
    double v = strtod(arg, &end), l = strtod(lo, NULL), h = strtod(hi, NULL);
    if (end == arg || *end || !(v >= l && v <= h)) {
        fprintf(stderr, "deltafin: %s: expected a number from %s to %s, got '%s'\n", flag, lo, hi, arg);
        return -1;
    }
    *out = (float)v;
    return 1;
}

int cli_no_stray_args(const char *cmd, int argc, char **argv, int optind) {
    if (optind >= argc) return 0;
    fprintf(stderr, "deltafin %s: unexpected argument '%s'%s (deltafin %s --help lists the options)\n", cmd,
            argv[optind], argc - optind > 1 ? " and more" : "", cmd);
    return -1;
}

int cli_parse_bytes(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    while (isspace((unsigned char)*end)) end++;
    double mul = 1ull << 30;
    switch (toupper((unsigned char)*end)) {
    case 'T': mul = 1ull << 40; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'K': mul = 1ull << 10; end++; break;
    case 'B': mul = 1; break;
    case 0: break;
    default: return -1;
    }
    if (*end && strcasecmp(end, "B") && strcasecmp(end, "iB")) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

int cli_storage_opt(int c, const char *arg, df_engine_opts *o) {
    long v;
    switch (c) {
    case CLI_OPT_MEM:
        if (cli_parse_bytes(arg, &o->mem_budget) || !o->mem_budget) {
            fprintf(stderr, "deltafin: --mem: bad size '%s' (examples: 8G, 512M)\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_CACHE_SLOTS:
        if (cli_parse_int("--cache-slots", arg, 1, 1L << 24, &v) < 0) return -1;
        o->cache_slots = (int)v;
        return 1;
    case CLI_OPT_SPINE_STREAM: o->spine_stream = 1; return 1;
    case CLI_OPT_BUFFERED_IO: o->buffered_io = 1; return 1;
    case CLI_OPT_IO_THREADS:
        if (cli_parse_int("--io-threads", arg, 1, 256, &v) < 0) return -1;
        o->io_threads = (int)v;
        return 1;
    case CLI_OPT_REMOTE: o->remote_url = arg; return 1;
    case CLI_OPT_SPINE:
        if (!strcmp(arg, "bf16")) o->spine = DF_SPINE_BF16;
        else if (!strcmp(arg, "int8")) o->spine = DF_SPINE_INT8;
        else {
            fprintf(stderr, "deltafin: --spine: expected bf16 or int8, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_IO:
        if (!strcmp(arg, "pread")) o->io_kind = 1;
        else if (!strcmp(arg, "uring")) o->io_kind = 2;
        else {
            fprintf(stderr, "deltafin: --io: expected pread or uring, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_CACHE_POLICY:
        if (!strcmp(arg, "lru")) o->cache_policy = DF_CACHE_LRU;
        else if (!strcmp(arg, "lfu")) o->cache_policy = DF_CACHE_LFU;
        else if (!strcmp(arg, "arc")) o->cache_policy = DF_CACHE_ARC;
        else {
            fprintf(stderr, "deltafin: --cache-policy: expected lfu, lru or arc, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_TRACE_ROUTING: o->trace_routing = arg; return 1;
    case CLI_OPT_EXPERT_DIRS: o->expert_dirs = arg; return 1;
    case CLI_OPT_CTX:
        if (cli_parse_int("--ctx", arg, 1, 1L << 30, &v) < 0) return -1;
        o->ctx_tokens = v;
        return 1;
    case CLI_OPT_GPU:
        if (strcmp(arg, "auto") && strcmp(arg, "off") && strspn(arg, "0123456789") != strlen(arg)) {
            fprintf(stderr, "deltafin: --gpu: expected auto, off or a device number, got '%s'\n", arg);
            return -1;
        }
        if (!*arg) {
            fprintf(stderr, "deltafin: --gpu: expected auto, off or a device number, got ''\n");
            return -1;
        }
        o->gpu = arg;
        return 1;
    case CLI_OPT_GPU_MEM:
        if (cli_parse_bytes(arg, &o->gpu_mem) || !o->gpu_mem) {
            fprintf(stderr, "deltafin: --gpu-mem: bad size '%s' (examples: 40G, 512M)\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_HEAT:
        if (!strcmp(arg, "on")) o->heat = DF_HEAT_ON;
        else if (!strcmp(arg, "off")) o->heat = DF_HEAT_OFF;
        else {
            fprintf(stderr, "deltafin: --heat: expected on or off, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_SPINE_SPLIT:
        if (!strcmp(arg, "auto")) o->spine_split = DF_SPINE_SPLIT_AUTO;
        else if (!strcmp(arg, "on")) o->spine_split = DF_SPINE_SPLIT_ON;
        else if (!strcmp(arg, "off")) o->spine_split = DF_SPINE_SPLIT_OFF;
        else {
            fprintf(stderr, "deltafin: --spine-split: expected auto, on or off, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case CLI_OPT_LOOKAHEAD:
        if (!arg || !strcmp(arg, "on")) o->lookahead = DF_LOOKAHEAD_ON;
        else if (!strcmp(arg, "off")) o->lookahead = DF_LOOKAHEAD_OFF;
        else if (!strcmp(arg, "auto")) o->lookahead = DF_LOOKAHEAD_AUTO;
        else {
            fprintf(stderr, "deltafin: --lookahead: expected auto, on or off, got '%s'\n", arg);
            return -1;
        }
        return 1;
    default: return 0;
    }
}

int cli_spec_opt(int c, const char *arg, spec_opts *o) {
    long v;
    int r;
    switch (c) {
    case CLI_OPT_SPEC:
        if ((v = spec_parse_mode(arg)) < 0) {
            fprintf(stderr, "deltafin: --spec: expected off, ngram, draft or auto, got '%s'\n", arg);
            return -1;
        }
        o->mode = (spec_mode)v;
        return 1;
    case CLI_OPT_DRAFT: o->draft_dir = arg; return 1;
    case CLI_OPT_DRAFT_MAX:
        if ((r = cli_parse_int("--draft-max", arg, 1, SPEC_DRAFT_MAX_LIMIT, &v)) > 0) o->draft_max = (int)v;
        return r;
    default: return 0;
    }
}
