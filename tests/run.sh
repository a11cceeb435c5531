#!/usr/bin/env bash
# Runs every unit test binary (ASan+UBSan build) and every shell test; counts "ok"/"not ok" lines, and as
# skipped (not passed) the checks that cannot run here: "ok - NAME # SKIP reason" or "skip - NAME".
# The last line is "N passed, N failed", followed by ", N skipped" when N > 0, then how many test programs ran.
# --fast (`make check`): the unit tests of the plain -O1 build (build/check/tests) and the quick CLI shell
# tests against ./deltafin; no sanitizers, browser, server, fuzz, qemu or clang rebuild.
# DF_TEST_JOBS=N runs N test programs at a time (default 2), the slowest unit tests started first; results print
# in the order the programs started. With --fast the quick shell tests join them; the full suite's shell tests
# (servers, fuzzers, emulators) run one at a time after the unit tests.
set -u
cd "$(dirname "$0")/.."
units=build/asan/tests
shells=(tests/shell/test_*.sh)
jobs=${DF_TEST_JOBS:-2}
if [ "${1:-}" = --fast ]; then
    units=build/check/tests
    shells=(tests/shell/test_cli_errors.sh tests/shell/test_chat_cli.sh tests/shell/test_tokenize.sh
            tests/shell/test_layout.sh)
    export DELTAFIN_BIN=./deltafin DF=./deltafin
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0 fail=0 skip=0 programs=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Counts one finished program's log: name, log, exit status, seconds.
report() {
    local name=$1 log=$2 rc=$3 secs=$4 p f s
    s=$(grep -cE '^ok - .*# SKIP|^skip - ' "$log")
    p=$(($(grep -c '^ok - ' "$log") - $(grep -c '^ok - .*# SKIP' "$log")))
    f=$(grep -c '^not ok - ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $name exited $rc" >>"$log"; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then f=1; echo "not ok - $name ran no check" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s)); programs=$((programs + 1))
    printf '%-40s %4d passed %3d failed%s  (%ds)\n' "$name" "$p" "$f" "$( [ "$s" -gt 0 ] && echo " $s skipped")" "$secs"
    if [ "$s" -ne 0 ]; then grep -E '^ok - .*# SKIP|^skip - ' "$log" | sed 's/^/    /'; fi
    if [ "$f" -ne 0 ]; then grep -v '^ok - ' "$log" | tail -n 40 | sed 's/^/    /'; fi
}

# Starts program i (its command in cmd_i) in the background; it leaves $out/i.log, i.rc and i.secs.
launch() {
    local i=$1
    ( t0=$SECONDS; eval "${cmds[$i]}" >"$out/$i.log" 2>&1; rc=$?; echo $((SECONDS - t0)) >"$out/$i.secs"
      echo $rc >"$out/$i.rc" ) &
}

names=() cmds=()
# The slowest unit tests first, so that running several at a time does not end waiting on one of them.
slow=(test_spec test_scratch test_snapshot test_batch test_overlap test_stream)
ordered=()
if [ "$jobs" -gt 1 ]; then for n in "${slow[@]}"; do [ -x "$units/$n" ] && ordered+=("$units/$n"); done; fi
for t in "$units"/test_*; do
    [ -x "$t" ] || continue
    case " ${ordered[*]:-} " in *" $t "*) ;; *) ordered+=("$t") ;; esac
done
for t in "${ordered[@]}"; do names+=("$(basename "$t")"); cmds+=("\"$t\""); done
pooled_shells=0
if [ "${1:-}" = --fast ]; then
    for t in "${shells[@]}"; do [ -f "$t" ] && names+=("$(basename "$t")") && cmds+=("bash \"$t\""); done
    pooled_shells=1
fi
n_units=${#names[@]}
next=0 shown=0 running=0
while [ "$shown" -lt "$n_units" ]; do
    while [ "$next" -lt "$n_units" ] && [ "$running" -lt "$jobs" ]; do launch "$next"; next=$((next + 1)); running=$((running + 1)); done
    wait -n 2>/dev/null || true
    running=0
    for ((i = shown; i < next; i++)); do [ -f "$out/$i.rc" ] || running=$((running + 1)); done
    while [ "$shown" -lt "$next" ] && [ -f "$out/$shown.rc" ]; do
        report "${names[$shown]}" "$out/$shown.log" "$(cat "$out/$shown.rc")" "$(cat "$out/$shown.secs")"
        shown=$((shown + 1))
    done
done
wait
[ "$pooled_shells" -eq 1 ] && shells=()
for t in "${shells[@]}"; do
    [ -f "$t" ] || continue
    t0=$SECONDS
    bash "$t" >"$out/shell.log" 2>&1
    report "$(basename "$t")" "$out/shell.log" $? $((SECONDS - t0))
done
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
echo "($programs test programs, $jobs at a time)"
[ "$fail" -eq 0 ]
