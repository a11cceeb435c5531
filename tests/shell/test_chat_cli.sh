#!/usr/bin/env bash
# `deltafin run` and `deltafin chat` on the bundled model: text streams out; chat feeds only the new turn
# (no re-prefill of earlier turns); Ctrl-C stops the current answer and the program goes on.
set -u
cd "$(dirname "$0")/../.."
BIN=./deltafin
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
pid=

out=$($BIN run -p "The jury said that" -n 20 2>"$tmp/err")
if [ "$?" -eq 0 ] && grep -q "the United States" <<<"$out" && grep -q "tokens/s" "$tmp/err"; then
    echo "ok - run streams the reference continuation and reports tokens/s"
else
    echo "not ok - run: $out / $(cat "$tmp/err")"
fi

ids=$($BIN run --tokens 473,4595,555,326 -n 5 2>/dev/null)
[ "$ids" = "260,1213,1230,383,506" ] && echo "ok - run --tokens prints greedy ids" || echo "not ok - run --tokens: $ids"

$BIN run -p x --temp -1 >/dev/null 2>&1; [ $? -eq 2 ] && echo "ok - bad --temp is a usage error" || echo "not ok - bad --temp accepted"

# Two turns: the second feeds only its own tokens, and the context grows by exactly what was fed.
printf 'Hello there\nHow are you\n' | $BIN chat -n 8 >"$tmp/out" 2>"$tmp/err"
mapfile -t fed < <(sed -n 's/^(fed \([0-9]*\) new prompt tokens, context \([0-9]*\);.*/\1 \2/p' "$tmp/err")
if [ "${#fed[@]}" -eq 2 ]; then
    read -r f1 c1 <<<"${fed[0]}"; read -r f2 c2 <<<"${fed[1]}"
    # turn 2 context = turn 1 context + fed + 8 generated (+1 end-of-message when cut by the limit)
    if [ "$f2" -lt "$f1" ] && [ "$c2" -ge $((c1 + f2 + 8)) ] && [ "$c2" -le $((c1 + f2 + 9)) ]; then
        echo "ok - second chat turn fed $f2 tokens onto a context of $c1 (no re-prefill)"
    else
        echo "not ok - chat turns: ${fed[*]}"
    fi
else
    echo "not ok - chat printed no per-turn stats: $(cat "$tmp/err")"
fi

# Ctrl-C during an answer: the answer stops, the program asks for the next turn.
mkfifo "$tmp/in"
$BIN chat -n 100000 <"$tmp/in" >"$tmp/out2" 2>"$tmp/err2" &
pid=$!
exec 3>"$tmp/in"
echo "Tell me a long story" >&3
for _ in $(seq 50); do [ -s "$tmp/out2" ] && [ "$(wc -c <"$tmp/out2")" -gt 40 ] && break; sleep 0.1; done
kill -INT $pid
sleep 0.5
echo "/exit" >&3
exec 3>&-
wait $pid; rc=$?
pid=
if [ $rc -eq 0 ] && grep -q "\[stopped\]" "$tmp/out2"; then
    echo "ok - Ctrl-C stops the answer, not the program"
else
    echo "not ok - Ctrl-C: exit $rc, $(tail -c 300 "$tmp/out2") $(cat "$tmp/err2")"
fi
