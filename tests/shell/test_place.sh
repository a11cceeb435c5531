#!/usr/bin/env bash
# test_place.sh — `deltafin place` spreads the bundled model's experts over two folders: logits identical to the
# unplaced model, the share of each folder follows --weights, the folders are really read (a missing one is an
# error naming it; --expert-dirs finds them moved), an interrupted copy resumes to the same result, and the
# cache simulator and the routing trace work end to end.
set -u
cd "$(dirname "$0")/../.."
bin=./deltafin
dir=$(mktemp -d /tmp/df_place_XXXXXX)
trap 'rm -rf "$dir"' EXIT
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }
m=$dir/m
mkdir "$m"
ln -s "$PWD"/models/default/{config.json,model.safetensors,tiktoken.model,tokenizer_config.json} "$m/"
echo '{"prefill":[5888,12,400],"decode":[77,1500,9,3000,45]}' >"$dir/p.json"
$bin logits -m models/default --prompt "$dir/p.json" -o "$dir/ref.f32" --cache-slots 8 2>"$dir/err" || bad "reference: $(cat "$dir/err")"

if $bin place -m "$m" --to "$dir/A,$dir/B" --weights 3,1 >"$dir/out" 2>&1 && grep -q "224 of 224" "$dir/out"; then
    ok "place: $(tail -1 "$dir/out")"
else
    bad "place: $(tail -2 "$dir/out")"
fi
a=$(stat -c %s "$dir/A/deltafin-experts.bin" 2>/dev/null || echo 0)
b=$(stat -c %s "$dir/B/deltafin-experts.bin" 2>/dev/null || echo 0)
[ "$b" -gt 0 ] && [ "$a" -gt $((2 * b)) ] && [ "$a" -lt $((4 * b)) ] && ok "weights 3:1 give $a vs $b bytes" ||
    bad "weights 3:1 give $a vs $b bytes"
$bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/placed.f32" --cache-slots 8 2>"$dir/err" &&
    cmp -s "$dir/ref.f32" "$dir/placed.f32" && ok "placed over two folders: logits identical" ||
    bad "placed logits differ: $(cat "$dir/err")"

mv "$dir/B" "$dir/B2"
if $bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/x.f32" 2>"$dir/err"; then
    bad "a missing folder was not noticed"
else
    grep -q "expert folder $dir/B is missing" "$dir/err" && ok "missing folder named: $(head -c 120 "$dir/err")" ||
        bad "missing folder message: $(cat "$dir/err")"
fi
$bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/moved.f32" --cache-slots 8 --expert-dirs "$dir/A,$dir/B2" 2>"$dir/err" &&
    cmp -s "$dir/ref.f32" "$dir/moved.f32" && ok "--expert-dirs finds moved folders, logits identical" ||
    bad "--expert-dirs: $(cat "$dir/err")"
$bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/x.f32" --expert-dirs "$dir/A" 2>"$dir/err" &&
    bad "--expert-dirs with one folder for two accepted" || ok "--expert-dirs count checked: $(head -c 100 "$dir/err")"
mv "$dir/B2" "$dir/B"

# an interrupted copy: keep the placement up to layer 3 plus a torn line, then place again
pf=$m/.deltafin/placement
n=$(grep -n '^done 3$' "$pf" | cut -d: -f1)
head -n "$n" "$pf" >"$dir/pf" && printf 'expert 4 3 1 40' >>"$dir/pf" && cp "$dir/pf" "$pf"
if $bin place -m "$m" --to "$dir/A,$dir/B" --weights 3,1 >"$dir/out" 2>&1 && grep -q "224 of 224" "$dir/out" &&
    [ "$(grep -c '^done' "$pf")" = 8 ] && [ "$(grep -ac '^expert' "$pf")" = 224 ] &&
    [ "$(tr -cd '\000' <"$pf" | wc -c)" = 0 ]; then
    ok "interrupted placement resumed: $(tail -1 "$dir/out")"
else
    bad "resume: $(tail -2 "$dir/out")"
fi
$bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/resumed.f32" --cache-slots 8 2>"$dir/err" &&
    cmp -s "$dir/ref.f32" "$dir/resumed.f32" && ok "after resuming: logits identical" || bad "after resuming: $(cat "$dir/err")"
$bin place -m "$m" --to "$dir/C" >"$dir/out" 2>&1 && bad "placing into other folders over a placement accepted" ||
    ok "other folders refused: $(tail -1 "$dir/out" | head -c 100)"

# folders that resolve to one file, and data files that are no plain file of their own, are refused before
# anything is written: the model keeps working unplaced
m2=$dir/m2
mkdir "$m2" "$dir/D"
ln -s "$PWD"/models/default/{config.json,model.safetensors,tiktoken.model,tokenizer_config.json} "$m2/"
ln -s "$dir/D" "$dir/Dlink"
mkdir -p "$dir/L" "$dir/F"
ln -s "$PWD/models/default/model.safetensors" "$dir/L/deltafin-experts.bin"
mkfifo "$dir/F/deltafin-experts.bin"
n_bad=0
for to in "$dir/D,$dir/D" "$dir/D,$dir/./D" "$dir/D,$dir/Dlink" "$dir/D,$dir/D/" "$dir/E,$dir/D,$dir/../${dir##*/}/D" \
          "$dir/L" "$dir/D,$dir/F"; do
    if timeout 60 $bin place -m "$m2" --to "$to" >"$dir/out" 2>&1; then
        bad "place --to $to accepted"; n_bad=$((n_bad + 1))
    elif [ -e "$m2/.deltafin/placement" ] || ! grep -q "same folder\|not a regular file" "$dir/out"; then
        bad "place --to $to: $(tail -1 "$dir/out") (placement written: $([ -e "$m2/.deltafin/placement" ] && echo yes))"
        n_bad=$((n_bad + 1))
    fi
done
[ "$n_bad" = 0 ] && ok "7 folder lists naming one folder twice (A,A ./A, a symlink, a trailing /, ..) or a data file that is a link or FIFO: refused, nothing written" ||
    bad "$n_bad folder lists accepted or refused unclearly"
$bin logits -m "$m2" --prompt "$dir/p.json" -o "$dir/m2.f32" --cache-slots 8 2>"$dir/err" &&
    cmp -s "$dir/ref.f32" "$dir/m2.f32" && ok "after the refusals the model runs unplaced, logits identical" ||
    bad "after the refusals: $(cat "$dir/err")"
$bin logits -m "$m" --prompt "$dir/p.json" -o "$dir/x.f32" --expert-dirs "$dir/A,$dir/A" 2>"$dir/err" &&
    bad "--expert-dirs naming one folder twice accepted: $(cat "$dir/err")" ||
    { grep -q "same folder" "$dir/err" && ok "--expert-dirs A,A refused: $(head -c 120 "$dir/err")" ||
      bad "--expert-dirs A,A: $(cat "$dir/err")"; }

# routing trace and cache simulator end to end
$bin run -m models/default -p "The house" -n 20 --heat off --trace-routing "$dir/t.trace" >/dev/null 2>&1
$bin bench cache --trace "$dir/t.trace" --sizes 10,50 --json >"$dir/bc.json" 2>"$dir/err" &&
    python3 -c "
import json,sys
d=json.load(open('$dir/bc.json'))
r=d['rows']
assert d['requests']>0 and len(r)==2
for x in r: assert x['belady']>=max(x['lru'],x['lfu'],x['arc'],x['reuse'])-1e-9
" && ok "bench cache on a recorded trace: belady bounds every policy" || bad "bench cache: $(cat "$dir/err")"
$bin bench cache --trace "$dir/p.json" >/dev/null 2>"$dir/err" && bad "a non-trace accepted" ||
    ok "bench cache refuses a non-trace: $(head -c 100 "$dir/err")"
