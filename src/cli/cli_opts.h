/* cli_opts.h — command-line options shared by every command that opens an engine: the storage options of
 * df_engine_opts (memory budget, expert cache, spine streaming, I/O mode). A command adds
 * CLI_STORAGE_LONGOPTS to its getopt_long table and passes unknown option codes to cli_storage_opt. */
#ifndef DF_CLI_OPTS_H
#define DF_CLI_OPTS_H

#include <stdint.h>
#include "deltafin.h"
#include "sample/spec.h"

enum { CLI_OPT_MEM = 0x1000, CLI_OPT_CACHE_SLOTS, CLI_OPT_SPINE_STREAM, CLI_OPT_BUFFERED_IO, CLI_OPT_IO_THREADS,
       CLI_OPT_REMOTE, CLI_OPT_IO, CLI_OPT_LOOKAHEAD, CLI_OPT_SPINE,
       CLI_OPT_CACHE_POLICY, CLI_OPT_TRACE_ROUTING, CLI_OPT_HEAT, CLI_OPT_EXPERT_DIRS, CLI_OPT_CTX, CLI_OPT_GPU,
       CLI_OPT_GPU_MEM, CLI_OPT_SPINE_SPLIT };

/* The context run, chat and info budget a conversation's state for when --ctx is not given. */
#define CLI_DEFAULT_CTX 4096

/* Entries in CLI_STORAGE_LONGOPTS (for tables that are sized at compile time). */
#define CLI_STORAGE_N_LONGOPTS 17

#define CLI_STORAGE_LONGOPTS                                                                                    \
    {"mem", 1, 0, CLI_OPT_MEM}, {"cache-slots", 1, 0, CLI_OPT_CACHE_SLOTS},                                     \
        {"spine-stream", 0, 0, CLI_OPT_SPINE_STREAM}, {"buffered-io", 0, 0, CLI_OPT_BUFFERED_IO},               \
        {"io-threads", 1, 0, CLI_OPT_IO_THREADS}, {"remote", 1, 0, CLI_OPT_REMOTE}, {"io", 1, 0, CLI_OPT_IO},    \
        {"lookahead", 2, 0, CLI_OPT_LOOKAHEAD}, {"spine", 1, 0, CLI_OPT_SPINE},                                  \
        {"cache-policy", 1, 0, CLI_OPT_CACHE_POLICY}, {"trace-routing", 1, 0, CLI_OPT_TRACE_ROUTING},            \
        {"heat", 1, 0, CLI_OPT_HEAT}, {"expert-dirs", 1, 0, CLI_OPT_EXPERT_DIRS}, {"ctx", 1, 0, CLI_OPT_CTX},         \
        {"gpu", 1, 0, CLI_OPT_GPU}, {"gpu-mem", 1, 0, CLI_OPT_GPU_MEM}, {"spine-split", 1, 0, CLI_OPT_SPINE_SPLIT}

#define CLI_STORAGE_USAGE                                                                                       \
    "  --mem SIZE        memory budget (spine + expert cache + buffers), e.g. 8G, 512M; bare number = GiB\n"   \
    "  --cache-slots N   exactly N expert cache slots\n"                                                       \
    "  --spine-stream    stream every layer's spine even if it fits\n"                                         \
    "  --buffered-io     buffered reads + fadvise(DONTNEED) instead of O_DIRECT\n"                              \
    "  --io-threads N    I/O threads (default 8)\n"                                                          \
    "  --io KIND         O_DIRECT reader: uring (io_uring, default) or pread (thread pool)\n"                 \
    "  --lookahead[=auto|on|off]  guess a layer's experts before its attention and read them meanwhile: auto\n" \
    "                    (default) reads the surest part of the guess while measured precision and idle disk\n" \
    "                    time say it pays; bare --lookahead = on\n"                                            \
    "  --remote URL      partial install: stream missing experts from this repository (deltafin fetch)\n"    \
    "  --spine bf16|int8 spine weights: the checkpoint's (default) or the lossy int8 copy of deltafin quantize\n"  \
    "  --cache-policy P  expert cache replacement: lfu (frequency with decay, default), lru or arc\n"         \
    "  --trace-routing FILE  append each layer's expert selection to FILE (deltafin bench cache --trace)\n"  \
    "  --heat on|off     keep expert heat in DIR/.deltafin/heat and warm the cache from it (run/chat/serve: on)\n"  \
    "  --expert-dirs A,B the folders of deltafin place, when they moved (else as the placement records them)\n"   \
    "  --ctx N           context the budget holds a conversation's state for (run, chat, info: 4096 or the\n"   \
    "                    model's if smaller); generation stops there\n"                                        \
    "  --gpu auto|off|N  run on NVIDIA GPU N (CUDA driver + NVRTC found at run time); auto (default): GPU 0 when\n" \
    "                    present and the model fits, else the CPU; info shows the plan\n"                          \
    "  --gpu-mem SIZE    GPU memory budget for weights, states and working memory (default: free less 1 GiB)\n" \
    "  --spine-split auto|on|off  under mpirun: split the spine by layers over the ranks; auto (default) when\n" \
    "                    one process would stream part of it under --mem (give every rank the same)\n"

/* An integer / a number for option `flag` in [lo, hi]: 1 and *out set, or -1 after printing an error that
 * names the flag, the accepted range and the value given. A number's bounds are decimal text ("0.1"),
 * compared exactly as the argument would be. */
int cli_parse_int(const char *flag, const char *arg, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *arg, const char *lo, const char *hi, float *out);
/* Rejects arguments left after the options (a prompt not quoted, a typo): 0 if there are none, else -1 after
 * printing "deltafin CMD: unexpected argument ...". */
int cli_no_stray_args(const char *cmd, int argc, char **argv, int optind);

/* Speculative decoding options (run, chat, serve, bench): added like CLI_STORAGE_LONGOPTS, parsed by
 * cli_spec_opt. */
enum { CLI_OPT_SPEC = 0x1600, CLI_OPT_DRAFT, CLI_OPT_DRAFT_MAX };
#define CLI_SPEC_N_LONGOPTS 3
#define CLI_SPEC_LONGOPTS                                                                                       \
    {"spec", 1, 0, CLI_OPT_SPEC}, {"draft", 1, 0, CLI_OPT_DRAFT}, {"draft-max", 1, 0, CLI_OPT_DRAFT_MAX}
#define CLI_SPEC_USAGE                                                                                          \
    "  --spec MODE       speculative decoding, lossless: off, ngram (prompt lookup), draft (--draft model) or\n" \
    "                    auto (default: drafts only while they measurably pay)\n"                               \
    "  --draft DIR       draft model with the same vocabulary (e.g. models/draft for the bundled model)\n"      \
    "  --draft-max K     most tokens drafted per pass (default 4)\n"

/* Parses "8G", "1.5GiB", "512M", "4096K", "123B"; a bare number means GiB. Returns -1 if malformed. */
int cli_parse_bytes(const char *s, uint64_t *out);
/* Applies option code c (from CLI_STORAGE_LONGOPTS) to o: 1 handled, 0 not a storage option, -1 bad value
 * (a message was printed). */
int cli_storage_opt(int c, const char *arg, df_engine_opts *o);
/* Applies option code c (from CLI_SPEC_LONGOPTS) to o, like cli_storage_opt. */
int cli_spec_opt(int c, const char *arg, spec_opts *o);

#endif
