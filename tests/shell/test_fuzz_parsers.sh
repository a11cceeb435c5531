#!/usr/bin/env bash
# test_fuzz_parsers.sh — libFuzzer (clang -fsanitize=fuzzer, ASan+UBSan) on the parsers that take outside
# input besides the server's requests: safetensors headers (as fetch gets them from a remote), config.json,
# the index's weight_map, the chat renderer with its output splitter, the prompt cache's file names and token
# files (what `serve` reads from its cache folder at every start), and the JSON-schema compiler of constrained
# output (a request's response_format or tool parameters). Each runs FUZZ_SECONDS (default 6)
# from its committed seed corpus (tests/fuzz/corpus-NAME: the fixtures' real files and the reproductions of
# past crashes); a binary is rebuilt only when a source is newer. New inputs found stay in build/fuzz.
set -u
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-6}
out=build/fuzz
mkdir -p "$out"
common="src/common/util.c src/common/json_file.c src/common/tensor.c"
storage="src/format/safetensors.c src/install/fetch_plan.c src/install/remote.c src/format/tensor_names.c"
declare -A SRCS=(
    [safetensors]="$storage $common"
    [config]="src/model/config.c $common"
    [index]="$storage $common"
    [chat]="$(echo src/tokenizer/*.c) $common"
    [prompt-cache]="src/server/prompt_cache_file.c $common"
    [schema]="src/sample/grammar.c src/sample/grammar_run.c src/sample/grammar_schema.c $common"
)
CFL="-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc $(pkg-config --cflags jansson libcurl libpcre2-8)"
LIBS="$(pkg-config --libs jansson libcurl libpcre2-8) -lm -pthread"
for name in safetensors config index chat prompt-cache schema; do
    bin=$out/fuzz_${name//-/_}
    srcs="tests/fuzz/fuzz_${name//-/_}.c ${SRCS[$name]}"
    newer=$( [ -x "$bin" ] && find $srcs src/*/*.h include -newer "$bin" 2>/dev/null | head -1 || echo build)
    if [ -n "$newer" ] && ! clang $CFL -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
            -o "$bin" $srcs $LIBS >"$out/build_$name.log" 2>&1; then
        cat "$out/build_$name.log"
        echo "not ok - fuzz_$name builds with clang -fsanitize=fuzzer"
        continue
    fi
    mkdir -p "$out/corpus-$name"
    cp tests/fuzz/corpus-$name/* "$out/corpus-$name/"
    log=$out/fuzz_$name.log
    if ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$secs" -max_len=8192 -timeout=5 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus-$name" >"$log" 2>&1; then
        runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
        echo "ok - fuzz_$name: ${secs}s, ${runs:-?} inputs, no crash, leak or hang"
    else
        grep -a -A30 "ERROR\|runtime error\|deadly signal\|timeout" "$log" | head -40
        echo "not ok - fuzz_$name found a failure (see $log; the input is saved there as crash-*/timeout-*)"
    fi
done
