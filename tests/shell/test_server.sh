#!/usr/bin/env bash
# `deltafin serve` with real clients: the official openai npm package, raw HTTP error cases, headless
# Chromium on the chat page, ollama-js on the ollama API, the AI SDK and LangChain on chat completions
# (tests/server/*.test.mjs, against the ASan build), then a bounded load test, 120 slow connections, and
# slots/queue/churn/slow-client tests against the release build, on the bundled model (models/default; a
# checkout without it fails here rather than testing some other model). Installs tests/server/node_modules
# with npm when missing.
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
if [ ! -d tests/server/node_modules/openai/resources/responses ] || [ ! -d tests/server/node_modules/playwright-core ] ||
   [ ! -d tests/server/node_modules/ajv-formats ] || [ ! -d tests/server/node_modules/@anthropic-ai/sdk ] ||
   [ ! -d tests/server/node_modules/ollama ] || [ ! -d tests/server/node_modules/ai ] ||
   [ ! -d tests/server/node_modules/@ai-sdk/openai-compatible ] || [ ! -d tests/server/node_modules/@langchain/openai ]; then
    (cd tests/server && npm ci --no-audit --no-fund >"$tmp/npm.log" 2>&1) || {
        tail -n 20 "$tmp/npm.log"
        echo "not ok - npm ci in tests/server"
        exit 1
    }
fi

model=models/default
if [ ! -f $model/config.json ] || ! ls $model/*.safetensors >/dev/null 2>&1 || [ ! -f $model/tiktoken.model ]; then
    echo "not ok - the bundled model $model (config, weights, tiktoken.model) is missing from this checkout"
    exit 1
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
printf '%s\n' "$key" >"$tmp/key"
start build/asan/deltafin "$tmp/asan.log" --api-key-file "$tmp/key" --keepalive 0.3 --max-tokens 4096 --parallel 2 \
    --prompt-cache "$tmp/kv-asan"
asan_url=$url asan_pid=$pid
DELTAFIN_API_KEY=$key start ./deltafin "$tmp/q1.log" --queue 1 --parallel 1 --strict --no-prompt-cache
q1_url=$url q1_pid=$pid
if ps -o args= -p "$asan_pid" "$q1_pid" | grep -q -- "$key"; then
    echo "not ok - the API key shows in the process list"
else
    echo "ok - --api-key-file and DELTAFIN_API_KEY keep the key out of the process list"
fi
export DELTAFIN_KEY=$key DELTAFIN_URL=$asan_url DELTAFIN_URL2=$q1_url
for t in openai errors web tools json_schema harden_req ollama clients anthropic responses; do
    SECONDS=0
    SCREENSHOT=$root/build/web-chat.png timeout 300 node "tests/server/$t.test.mjs" ||
        echo "not ok - tests/server/$t.test.mjs exited non-zero"
    echo "# $t.test.mjs took ${SECONDS}s"
done
stop "$asan_pid" "$tmp/asan.log" "ASan"
stop "$q1_pid" "$tmp/q1.log" "queue-1"

# reasoning, and the agent CLIs (tests/server/agents.test.mjs): copies of the bundled model (links to its
# weights) whose tokenizer names two reserved tokens <think> and </think>, and with a 4,096-token context
agent_model() {   # DIR THINK
    mkdir -p "$1"
    ln -s "$root/$model/model.safetensors" "$root/$model/tiktoken.model" "$1/"
    sed 's/"model_max_length": 512/"model_max_length": 4096/' $model/config.json >"$1/config.json"
    if [ "$2" = think ]; then
        sed 's/<|reserved_token_5906|>/<think>/; s/<|reserved_token_5907|>/<\/think>/' $model/tokenizer_config.json
    else
        cat $model/tokenizer_config.json
    fi | sed 's/"model_max_length": 512/"model_max_length": 4096/' >"$1/tokenizer_config.json"
}
agent_model "$tmp/think-model" think
agent_model "$tmp/long-model" plain
model=$tmp/think-model start ./deltafin "$tmp/think.log" --no-prompt-cache
think_url=$url think_pid=$pid
model=$tmp/long-model start ./deltafin "$tmp/long.log" --no-prompt-cache --parallel 1 --threads 2 --max-tokens 64
long_url=$url long_pid=$pid
SECONDS=0
DELTAFIN_URL_THINK=$think_url DELTAFIN_URL_LONG=$long_url timeout 500 node tests/server/agents.test.mjs ||
    echo "not ok - tests/server/agents.test.mjs exited non-zero"
echo "# agents.test.mjs took ${SECONDS}s"
stop "$think_pid" "$tmp/think.log" "thinking-model"
stop "$long_pid" "$tmp/long.log" "long-context"

start ./deltafin "$tmp/load.log" --prompt-cache "$tmp/kv-load" --allowed-host allowed.example
DELTAFIN_KEY= DELTAFIN_URL=$url DELTAFIN_PID=$pid timeout 300 node tests/server/load.test.mjs ||
    echo "not ok - tests/server/load.test.mjs exited non-zero"
# without a key: the Host check, and /tokenize's peak memory measured on the release build
DELTAFIN_KEY= DELTAFIN_URL=$url DELTAFIN_URL_NOKEY=$url DELTAFIN_PID=$pid TOKENIZE_MIB=6 timeout 300 \
    node tests/server/harden_req.test.mjs || echo "not ok - tests/server/harden_req.test.mjs (release) exited non-zero"
stop "$pid" "$tmp/load.log" "release"

# 120 slow connections from one address against the default connection limits and read timeout
start ./deltafin "$tmp/conns.log" --no-prompt-cache
DELTAFIN_KEY= DELTAFIN_URL=$url timeout 120 node tests/server/conns.test.mjs ||
    echo "not ok - tests/server/conns.test.mjs exited non-zero"
stop "$pid" "$tmp/conns.log" "connections"

# slots, queue, churn and the connection guards (release build: timing-sensitive parts stay quick)
start ./deltafin "$tmp/slots.log" --api-key "$key" --parallel 2 --queue 2 --read-timeout 2 --max-conns-per-client 8 \
    --alias gpt-4o-mini --cors http://allowed.example --no-prompt-cache
slots_url=$url slots_pid=$pid
start ./deltafin "$tmp/q0.log" --api-key "$key" --parallel 1 --queue 0 --no-prompt-cache
q0_url=$url q0_pid=$pid
start ./deltafin "$tmp/mem.log" --api-key "$key" --parallel 2 --slot-mem 1700K --no-prompt-cache --spec off
mem_url=$url mem_pid=$pid
# speculation's share (rollback record, verify rows' logits) counts too: the same slot memory no longer holds
# two empty slots with --spec ngram
if ./deltafin serve -m "$model" --port 0 --parallel 2 --slot-mem 1700K --spec ngram >"$tmp/memspec.log" 2>&1; then
    echo "not ok - --slot-mem counts speculation's memory (the server started)"
elif grep -q 'needs .* MiB of conversation state before any token; the slot memory is 1 MiB' "$tmp/memspec.log"; then
    echo "ok - --slot-mem counts speculation's memory: 1700K refused for two slots with --spec ngram"
else
    cat "$tmp/memspec.log"
    echo "not ok - --slot-mem counts speculation's memory (unexpected message)"
fi
SECONDS=0
DELTAFIN_URL=$slots_url DELTAFIN_URL0=$q0_url DELTAFIN_URLM=$mem_url DELTAFIN_PID=$slots_pid timeout 300 \
    node tests/server/slots.test.mjs ||
    echo "not ok - tests/server/slots.test.mjs exited non-zero"
echo "# slots.test.mjs took ${SECONDS}s"
if grep -q '"POST /v1/chat/completions" 200 prompt=[0-9]* cached=[0-9]* restored=[0-9]* completion=[0-9]* ttft_ms=' \
    "$tmp/slots.log"; then
    echo "ok - one access-log line per request (method, path, status, tokens, times)"
else
    echo "not ok - access-log lines"
fi
stop "$slots_pid" "$tmp/slots.log" "slots"
stop "$q0_pid" "$tmp/q0.log" "queue-0"
stop "$mem_pid" "$tmp/mem.log" "slot-memory"

# the prompt cache across restarts: saved, restored with the same answer, a damaged entry refused
kv=$tmp/kv-restart
phase() {   # PHASE
    start ./deltafin "$tmp/pc-$1.log" --parallel 1 --prompt-cache "$kv"
    DELTAFIN_KEY= DELTAFIN_URL=$url RESULT=$tmp/pc-cold.json timeout 120 node tests/server/pcache.test.mjs "$1" ||
        echo "not ok - tests/server/pcache.test.mjs $1 exited non-zero"
    stop "$pid" "$tmp/pc-$1.log" "prompt-cache $1"
    grep -o 'restored=[0-9]* completion=[0-9]* ttft_ms=[0-9]*' "$tmp/pc-$1.log" | sed "s/^/# $1: /"
}
phase cold
if [ "$(cat "$tmp/pc-cold.json" 2>/dev/null)" != skip ]; then
    phase warm
    for f in "$kv"/*.kv; do
        size=$(stat -c %s "$f")
        printf '\xff\xff\xff\xff' | dd of="$f" bs=1 seek=$((size / 2)) conv=notrunc status=none
    done
    phase damaged
fi
