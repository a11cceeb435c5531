#!/usr/bin/env bash
# Fuzzes the server's request parser with libFuzzer (clang -fsanitize=fuzzer) for a bounded time.
# FUZZ_SECONDS overrides the default 20 s.
set -u
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-20}
out=build/fuzz
mkdir -p "$out/corpus"
bin=$out/fuzz_server_parse
srcs="tests/fuzz/fuzz_server_parse.c src/server/request.c src/server/guard.c src/server/tools_request.c
      src/sample/grammar.c src/sample/grammar_schema.c src/sample/grammar_run.c src/sample/stop.c src/sample/sample.c
      src/common/util.c"
if ! clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc $(pkg-config --cflags jansson) \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -o "$bin" $srcs \
        $(pkg-config --libs jansson) -lm -pthread >"$out/build.log" 2>&1; then
    cat "$out/build.log"
    echo "not ok - fuzz target builds with clang -fsanitize=fuzzer"
    exit 1
fi
echo "ok - fuzz target builds with clang -fsanitize=fuzzer"
cp tests/fuzz/corpus/* "$out/corpus/"
if ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$secs" -max_len=4096 -timeout=5 -rss_limit_mb=2048 \
        -print_final_stats=1 "$out/corpus" >"$out/fuzz.log" 2>&1; then
    runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$out/fuzz.log" | grep -o '[0-9]*$')
    echo "ok - request parser survives ${secs}s of fuzzing (${runs:-?} inputs)"
else
    tail -n 40 "$out/fuzz.log"
    echo "not ok - request parser fuzzing found a failure (see $out/fuzz.log)"
    exit 1
fi
