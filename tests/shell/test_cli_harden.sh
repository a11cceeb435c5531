#!/usr/bin/env bash
# test_cli_harden.sh — the CLI under the ASan + UBSan build where results meet the outside: every command
# that writes results fails (non-zero, with a message) when standard output cannot take them — a full disk
# (/dev/full) or a closed pipe — instead of exiting 0 with the output lost; number options take exactly their
# bounds as written; `chat` runs its first turns without a sanitizer report.
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=models/default

# commands that write results to stdout, each once into a full disk and once into a closed pipe
cmds=(
    "--version"
    "--help"
    "run -m $model -p The_jury_said -n 40"
    "run -m $model --tokens 473,4595,555 -n 20"
    "tokenize -m $model --text The_jury_said_that_the_city_was_in_good_hands"
    "detokenize -m $model --ids [473,4595,555,326]"
    "info -m $model"
)
full_ok=0 pipe_ok=0
for c in "${cmds[@]}"; do
    # shellcheck disable=SC2086
    $BIN $c >/dev/full 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] && grep -q "writing the output failed" "$tmp/err" && ! grep -q "Sanitizer\|runtime error" "$tmp/err"; then
        full_ok=$((full_ok + 1))
    else
        echo "# deltafin $c >/dev/full: exit $rc: $(tail -n 3 "$tmp/err")"
    fi
    # the reader is gone before the first write: the write fails with EPIPE
    rm -f "$tmp/fifo"
    mkfifo "$tmp/fifo"
    (exec 0<"$tmp/fifo"; exit 0) &
    reader=$!
    # shellcheck disable=SC2086
    (sleep 0.3; exec $BIN $c) >"$tmp/fifo" 2>"$tmp/err2"
    rc=$?
    wait "$reader"
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q "writing the output failed" "$tmp/err2"; then
        pipe_ok=$((pipe_ok + 1))
    else
        echo "# deltafin $c into a closed pipe: exit $rc: $(tail -n 3 "$tmp/err2")"
    fi
done
[ "$full_ok" -eq ${#cmds[@]} ] && echo "ok - ${#cmds[@]} commands into /dev/full: non-zero exit and a message" ||
    echo "not ok - $full_ok/${#cmds[@]} commands into /dev/full failed with a message"
[ "$pipe_ok" -eq ${#cmds[@]} ] && echo "ok - ${#cmds[@]} commands into a closed pipe: non-zero exit (not a signal) and a message" ||
    echo "not ok - $pipe_ok/${#cmds[@]} commands into a closed pipe failed with a message"

# bounds as written are accepted, values past them refused
good=0 n_good=0 bad=0 n_bad=0
for a in "--top-p 0" "--top-p 1" "--top-p 0.1" "--top-p 1.0" "--top-p 1e0" "--min-p 0" "--min-p 1" "--min-p 0.10" \
         "--temp 0" "--temp 100" "--temp 100.000" "--temp 0.1"; do
    n_good=$((n_good + 1))
    # shellcheck disable=SC2086
    if $BIN run -m $model --tokens 473,4595 -n 1 --seed 1 $a >/dev/null 2>"$tmp/err"; then good=$((good + 1))
    else echo "# $a refused: $(tail -n 1 "$tmp/err")"; fi
done
for a in "--top-p 1.0000001" "--top-p -0.0000001" "--min-p 1.00001" "--temp 100.0001" "--temp -1e-9" "--top-p nan" \
         "--top-p 0.5x"; do
    n_bad=$((n_bad + 1))
    # shellcheck disable=SC2086
    $BIN run -m $model --tokens 473 -n 1 $a >/dev/null 2>"$tmp/err"
    rc=$?
    if [ "$rc" -eq 2 ] && grep -q "expected a number from" "$tmp/err"; then bad=$((bad + 1))
    else echo "# $a: exit $rc $(tail -n 1 "$tmp/err")"; fi
done
[ "$good" -eq "$n_good" ] && echo "ok - $n_good number options at or inside their bounds accepted (0.1, 1.0, 100.000, ...)" ||
    echo "not ok - $good/$n_good number options at their bounds accepted"
[ "$bad" -eq "$n_bad" ] && echo "ok - $n_bad number options past their bounds refused (usage error naming the range)" ||
    echo "not ok - $bad/$n_bad out-of-range numbers refused"

# chat under the sanitizers: first turn, a second one, a command, the end
printf 'The jury said\nand then\n/help\n/exit\n' | $BIN chat -m $model -n 6 >"$tmp/chat.out" 2>"$tmp/chat.err"
rc=$?
if [ "$rc" -eq 0 ] && ! grep -q "runtime error\|Sanitizer" "$tmp/chat.err" && [ "$(grep -c "generated" "$tmp/chat.err")" -eq 2 ]; then
    echo "ok - chat (ASan + UBSan): two turns and a command, no sanitizer report"
else
    tail -n 20 "$tmp/chat.err"
    echo "not ok - chat under the sanitizers exited $rc"
fi
