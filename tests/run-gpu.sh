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
# Tests of the CPU's storage path (expert reads, look-ahead, the host arena, lm_head tiles, parts that fail to
# read): a GPU engine holds every weight in device memory and reads nothing per pass, so they stay CPU tests.
cpu_only=" test_overlap test_io test_scratch test_tiles "
first="test_gpu test_parity test_default_model test_batch test_session test_snapshot test_rollback test_spec test_session_file"
default=$(for t in $first; do echo build/check/tests/$t; done; for t in build/check/tests/test_*; do
    case " $first " in *" $(basename "$t") "*) ;; *) echo "$t" ;; esac; done)
tests=${GPU_TESTS:-$default}
for t in $tests; do
    [ -x "$t" ] || continue
    case "$cpu_only" in *" $(basename "$t") "*) echo "$(basename "$t"): CPU storage path, not run here"; continue ;; esac
    run_one "$(basename "$t")" "$t"
done
run_one server_smoke bash tests/shell/gpu_server_smoke.sh
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
