#!/usr/bin/env bash
# Runs every unit test binary (ASan+UBSan build) and every shell test; counts "ok"/"not ok" lines.
# The last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0 fail=0
log=$(mktemp)
run_one() {   # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local p f
    p=$(grep -c '^ok - ' "$log")
    f=$(grep -c '^not ok - ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $name exited $rc" >>"$log"; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $name ran no check" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f))
    printf '%-40s %4d passed %3d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - t0))
    if [ "$f" -ne 0 ]; then grep -v '^ok - ' "$log" | tail -n 40 | sed 's/^/    /'; fi
}
for t in build/asan/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for t in tests/shell/test_*.sh; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t")" bash "$t"
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
