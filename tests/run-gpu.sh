#!/usr/bin/env bash
# run-gpu.sh — `make test-gpu`, on a machine with an NVIDIA GPU: the engine's unit tests (parity on every
# fixture, the bundled model's greedy tokens, batches, sessions, snapshots, rollback, speculation, session files,
# streaming...) with every engine they open on GPU $DELTAFIN_GPU (default 0), the GPU's own tests, and a server
# smoke test. The last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
export DELTAFIN_GPU=${DELTAFIN_GPU:-0}
export DELTAFIN_KERNEL_CACHE=${DELTAFIN_KERNEL_CACHE:-$(pwd)/build/kernel-cache}
pass=0 fail=0 skip=0
log=$(mktemp)
run_one() {   # name, command...
    local name=$1; shift
    local t0=$SECONDS
    timeout "${GPU_TEST_TIMEOUT:-300}" "$@" >"$log" 2>&1
    local rc=$?
    local p f s
    s=$(grep -cE '^ok - .*# SKIP|^skip - ' "$log")
    p=$(($(grep -c '^ok - ' "$log") - s))
    f=$(grep -c '^not ok - ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $name exited $rc" >>"$log"; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then f=1; echo "not ok - $name ran no check" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-40s %4d passed %3d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - t0))
    if [ "$f" -ne 0 ]; then grep -v '^ok - ' "$log" | tail -n 25 | sed 's/^/    /'; fi
}
first="test_gpu test_parity test_default_model test_batch test_session test_snapshot test_rollback test_spec test_session_file"
default=$(for t in $first; do echo build/check/tests/$t; done; for t in build/check/tests/test_*; do
    case " $first " in *" $(basename "$t") "*) ;; *) echo "$t" ;; esac; done)
tests=${GPU_TESTS:-$default}
for t in $tests; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# Server smoke test: one completion over HTTP from a GPU engine, greedy, equal to the CLI's greedy tokens.
smoke() {
    local port=$((20000 + RANDOM % 20000))
    ./deltafin serve -m models/default --gpu "$DELTAFIN_GPU" --port "$port" --parallel 2 --no-prompt-cache \
        >/tmp/df_gpu_serve.log 2>&1 &
    local pid=$!
    python3 - "$port" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        break
    except Exception:
        time.sleep(0.2)
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                             headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": "The old man looked at the river and said", "max_tokens": 16,
                                              "temperature": 0}).encode())
body = json.load(urllib.request.urlopen(req, timeout=60))
text = body["choices"][0]["text"]
print(("ok - " if len(text) > 0 else "not ok - ") + "server on the GPU answers a completion: %r" % text[:60])
PY
    local rc=$?
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    grep -q 'gpu\|GPU' /tmp/df_gpu_serve.log && echo "# $(grep -i gpu /tmp/df_gpu_serve.log | head -n1)"
    return $rc
}
run_one server_smoke smoke
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
