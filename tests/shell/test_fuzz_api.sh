#!/usr/bin/env bash
# Fuzzes the Anthropic Messages and OpenAI Responses request parsers with libFuzzer (clang
# -fsanitize=fuzzer) for a bounded time. FUZZ_SECONDS overrides the default 10 s.
set -u
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-10}
out=build/fuzz
mkdir -p "$out/corpus-api"
bin=$out/fuzz_api_parse
srcs="tests/fuzz/fuzz_api_parse.c src/api/api_messages.c src/api/api_responses.c src/api/api_common.c
      src/server/request.c src/server/tools_request.c src/sample/grammar.c src/sample/grammar_schema.c
      src/sample/grammar_run.c src/sample/stop.c src/sample/sample.c src/common/util.c"
if ! clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc $(pkg-config --cflags jansson libmicrohttpd) \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -o "$bin" $srcs \
        $(pkg-config --libs jansson) -lm -pthread >"$out/build-api.log" 2>&1; then
    cat "$out/build-api.log"
    echo "not ok - Messages/Responses fuzz target builds with clang -fsanitize=fuzzer"
    exit 1
fi
echo "ok - Messages/Responses fuzz target builds with clang -fsanitize=fuzzer"
cp tests/fuzz/corpus-api/* "$out/corpus-api/"
if ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$secs" -max_len=4096 -timeout=5 -rss_limit_mb=2048 \
        -print_final_stats=1 "$out/corpus-api" >"$out/fuzz-api.log" 2>&1; then
    runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$out/fuzz-api.log" | grep -o '[0-9]*$')
    echo "ok - Messages and Responses request parsers survive ${secs}s of fuzzing (${runs:-?} inputs)"
else
    tail -n 40 "$out/fuzz-api.log"
    echo "not ok - Messages/Responses parser fuzzing found a failure (see $out/fuzz-api.log)"
    exit 1
fi
