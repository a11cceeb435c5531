#!/usr/bin/env bash
# Runs every unit test binary (ASan+UBSan build) and every shell test; counts "ok"/"not ok" lines, and as
# skipped (not passed) the checks that cannot run here: "ok - NAME # SKIP reason" or "skip - NAME".
# The last line is "N passed, N failed", followed by ", N skipped" when N > 0.
# --fast (`make check`): the unit tests of the plain -O1 build (build/check/tests) and the quick CLI shell
# tests against ./deltafin; no sanitizers, browser, server, fuzz, qemu or clang rebuild.
set -u
cd "$(dirname "$0")/.."
units=build/asan/tests
shells=(tests/shell/test_*.sh)
if [ "${1:-}" = --fast ]; then
    units=build/check/tests
    shells=(tests/shell/test_cli_errors.sh tests/shell/test_chat_cli.sh tests/shell/test_tokenize.sh tests/shell/test_layout.sh)
    export DELTAFIN_BIN=./deltafin DF=./deltafin
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0 fail=0 skip=0
log=$(mktemp)
run_one() {   # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local p f s
    s=$(grep -cE '^ok - .*# SKIP|^skip - ' "$log")
    p=$(($(grep -c '^ok - ' "$log") - $(grep -c '^ok - .*# SKIP' "$log")))
    f=$(grep -c '^not ok - ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $name exited $rc" >>"$log"; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then f=1; echo "not ok - $name ran no check" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-40s %4d passed %3d failed%s  (%ds)\n' "$name" "$p" "$f" "$( [ "$s" -gt 0 ] && echo " $s skipped")" \
        $((SECONDS - t0))
    if [ "$s" -ne 0 ]; then grep -E '^ok - .*# SKIP|^skip - ' "$log" | sed 's/^/    /'; fi
    if [ "$f" -ne 0 ]; then grep -v '^ok - ' "$log" | tail -n 40 | sed 's/^/    /'; fi
}
for t in "$units"/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for t in "${shells[@]}"; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t")" bash "$t"
done
rm -f "$log"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
