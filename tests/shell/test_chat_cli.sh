#!/usr/bin/env bash
# `deltafin run` and `deltafin chat` on the bundled model: text streams out; prompts from -f FILE and stdin;
# a random seed (printed, repeatable with --seed) when sampling; a notice when the context fills; chat feeds
# only the new turn (no re-prefill of earlier turns), keeps /commands away from the model; Ctrl-C stops the
# current answer and the program goes on; info shows the context and the tokenizer.
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

# -f FILE and -f - (standard input) give the same prompt as -p
printf 'The jury said that\n' >"$tmp/prompt.txt"
a=$($BIN run -p "The jury said that" -n 12 2>/dev/null)
b=$($BIN run -f "$tmp/prompt.txt" -n 12 2>/dev/null)
c=$($BIN run -f - -n 12 <"$tmp/prompt.txt" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && echo "ok - run -f FILE and -f - match -p" \
    || echo "not ok - -f: '$a' / '$b' / '$c'"

# sampling without --seed: a random seed, printed; --seed with it repeats the text; greedy prints none
o1=$($BIN run -p "The jury said that" -n 16 --temp 1.5 2>"$tmp/s1")
o2=$($BIN run -p "The jury said that" -n 16 --temp 1.5 2>"$tmp/s2")
s1=$(sed -n 's/^seed \([0-9]*\) (--seed .*/\1/p' "$tmp/s1")
s2=$(sed -n 's/^seed \([0-9]*\) (--seed .*/\1/p' "$tmp/s2")
o3=$($BIN run -p "The jury said that" -n 16 --temp 1.5 --seed "$s1" 2>"$tmp/s3")
if [ -n "$s1" ] && [ -n "$s2" ] && [ "$s1" != "$s2" ] && [ "$o3" = "$o1" ] && ! grep -q '^seed' "$tmp/s3" "$tmp/err"; then
    echo "ok - a random seed per sampled run ($s1, $s2), printed; --seed $s1 repeats the text"
else
    echo "not ok - seeds '$s1' '$s2', repeat same: $([ "$o3" = "$o1" ] && echo yes || echo no), $(cat "$tmp/s3")"
fi

# generation cut by the context (512 tokens) says so
$BIN run -p "The jury said that" -n 600 >/dev/null 2>"$tmp/ctx"
grep -q "stopped at the context limit: the context of 512 tokens is full" "$tmp/ctx" \
    && grep -q "generated 509 tokens" "$tmp/ctx" && echo "ok - run stopped by the context limit says so" \
    || echo "not ok - context limit notice: $(cat "$tmp/ctx")"
printf 'Hello there\n' | $BIN chat -n 1000 >/dev/null 2>"$tmp/ctx3"
grep -q "stopped at the context limit" "$tmp/ctx3" && echo "ok - a chat answer stopped by the context limit says so" \
    || echo "not ok - chat context limit notice: $(cat "$tmp/ctx3")"
# --ctx: the budget holds a conversation's state for that many tokens, and generation stops there
$BIN run -p "The jury said that" -n 100 --ctx 40 >/dev/null 2>"$tmp/ctx4"
grep -q "stopped at the context limit: the context of 40 tokens is full" "$tmp/ctx4" \
    && grep -q "generated 37 tokens" "$tmp/ctx4" && echo "ok - run --ctx 40 stops at 40 tokens and says so" \
    || echo "not ok - --ctx 40: $(cat "$tmp/ctx4")"
i16=$($BIN info --mem 100M --ctx 16 2>&1); i512=$($BIN info --mem 100M 2>&1)
b16=$(sed -n 's/^  session state: .*(\([0-9]*\) bytes) for a context of 16 tokens (--ctx)$/\1/p' <<<"$i16")
b512=$(sed -n 's/^  session state: .*(\([0-9]*\) bytes) for a context of 512 tokens (--ctx)$/\1/p' <<<"$i512")
[ -n "$b16" ] && [ -n "$b512" ] && [ "$b512" -gt "$b16" ] && grep -q "^context: 16 tokens$" <<<"$i16" \
    && echo "ok - info's plan counts the session state of its context ($b16 bytes for 16 tokens, $b512 for 512)" \
    || echo "not ok - info --ctx: $i16 / $i512"
out=$($BIN run -p "The jury" -n 4 --mem 2M 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "too small for a session of 512 tokens" <<<"$out" \
    && echo "ok - a budget that cannot hold the session's state is refused, naming it" \
    || echo "not ok - --mem 2M (exit $rc): $out"
$BIN run -p "The jury said that" -n 20 >/dev/null 2>"$tmp/ctx2"
grep -q "context limit" "$tmp/ctx2" && echo "not ok - context notice on a run that was not cut" \
    || echo "ok - no context notice when max tokens ended the run"

$BIN info >"$tmp/info" 2>&1
grep -q "^context: 512 tokens$" "$tmp/info" && grep -q "^tokenizer: present, 6144 ids; chat format: Kimi K2$" "$tmp/info" \
    && echo "ok - info shows the context length and the tokenizer" || echo "not ok - info: $(cat "$tmp/info")"
$BIN info -m tests/fixtures/k3-tiny >"$tmp/info2" 2>&1
grep -q "^context: 4096 tokens$" "$tmp/info2" && grep -q "^tokenizer: none" "$tmp/info2" \
    && echo "ok - info says when a folder has no tokenizer" || echo "not ok - info without tokenizer: $(cat "$tmp/info2")"

# /help and unknown /commands never reach the model: only the one real message is fed
printf '/help\n/frobnicate\nHello there\n' | $BIN chat -n 4 >"$tmp/cmd.out" 2>"$tmp/cmd.err"
rc=$?
if [ $rc -eq 0 ] && grep -q "/reset" "$tmp/cmd.out" && grep -q "unknown command '/frobnicate'" "$tmp/cmd.err" &&
   [ "$(grep -c '^(fed ' "$tmp/cmd.err")" -eq 1 ]; then
    echo "ok - chat: /help lists the commands, an unknown /command is reported and not sent"
else
    echo "not ok - chat commands (exit $rc): $(cat "$tmp/cmd.out" "$tmp/cmd.err" | head -c 600)"
fi

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
