#!/usr/bin/env bash
# `deltafin serve` with real clients: the official openai npm package, raw HTTP error cases, headless
# Chromium on the chat page (tests/server/*.test.mjs, against the ASan build), then a bounded load test
# against the release build. Uses models/default when its weights are there, else the tiny fixture weights
# with a small generated vocabulary. Installs tests/server/node_modules with npm when missing.
set -u
cd "$(dirname "$0")/../.."
root=$PWD
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "not ok - node and npm are needed (scripts/install-deps.sh installs them)"
    exit 1
fi
if [ ! -d tests/server/node_modules/openai ] || [ ! -d tests/server/node_modules/playwright-core ] ||
   [ ! -d tests/server/node_modules/ajv-formats ]; then
    (cd tests/server && npm ci --no-audit --no-fund >"$tmp/npm.log" 2>&1) || {
        tail -n 20 "$tmp/npm.log"
        echo "not ok - npm ci in tests/server"
        exit 1
    }
fi

if [ -f models/default/config.json ] && ls models/default/*.safetensors >/dev/null 2>&1 &&
   [ -f models/default/tiktoken.model ]; then
    model=models/default
else
    model=$tmp/model
    node tests/server/make_model.js "$model" || { echo "not ok - build the test model folder"; exit 1; }
fi

# start BIN LOG ARGS... — starts a server on a free port; sets $url and $pid
start() {
    local bin=$1 log=$2
    shift 2
    "$bin" serve -m "$model" --host 127.0.0.1 --port 0 --threads 1 "$@" 2>"$log" &
    pid=$!
    pids+=("$pid")
    url=
    for _ in $(seq 1 200); do
        url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -n 1)
        [ -n "$url" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$log"
    echo "not ok - $bin serve started"
    exit 1
}

# stop PID LOG NAME — SIGTERM, expect exit 0 and no sanitizer report
stop() {
    kill -TERM "$1"
    local rc=0
    wait "$1" || rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q 'Sanitizer' "$2"; then
        echo "ok - $3 server stops cleanly on SIGTERM (no sanitizer reports)"
    else
        tail -n 40 "$2"
        echo "not ok - $3 server exited $rc or reported a sanitizer error"
    fi
}

key=test-key-$$
start build/asan/deltafin "$tmp/asan.log" --api-key "$key" --keepalive 0.3 --max-tokens 4096
asan_url=$url asan_pid=$pid
start ./deltafin "$tmp/q1.log" --api-key "$key" --queue 1
q1_url=$url q1_pid=$pid
export DELTAFIN_KEY=$key DELTAFIN_URL=$asan_url DELTAFIN_URL2=$q1_url
for t in openai errors web tools json_schema; do
    SECONDS=0
    SCREENSHOT=$root/build/web-chat.png timeout 300 node "tests/server/$t.test.mjs" ||
        echo "not ok - tests/server/$t.test.mjs exited non-zero"
    echo "# $t.test.mjs took ${SECONDS}s"
done
stop "$asan_pid" "$tmp/asan.log" "ASan"
stop "$q1_pid" "$tmp/q1.log" "queue-1"

start ./deltafin "$tmp/load.log"
DELTAFIN_KEY= DELTAFIN_URL=$url DELTAFIN_PID=$pid timeout 300 node tests/server/load.test.mjs ||
    echo "not ok - tests/server/load.test.mjs exited non-zero"
stop "$pid" "$tmp/load.log" "release"
