#!/usr/bin/env bash
# Bad checkpoints and bad prompts through the CLI (ASan build): a clear message naming the file/tensor,
# a non-zero exit, and never a crash (exit codes >= 128 would be signals; ASan reports exit 1 with a trace,
# which the "no sanitizer report" check catches).
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
FIX=tests/fixtures/k3-tiny
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_fail() {   # name, pattern, command...
    local name=$1 pat=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pat" <<<"$out" && ! grep -q "Sanitizer" <<<"$out"; then
        echo "ok - $name"
    else
        echo "not ok - $name (exit $rc): $(head -c 400 <<<"$out")"
    fi
}

copy_fixture() { rm -rf "$tmp/m"; cp -r "$FIX" "$tmp/m"; }

copy_fixture
size=$(stat -c %s "$tmp/m/model.safetensors")
truncate -s $((size / 2)) "$tmp/m/model.safetensors"
expect_fail "truncated shard names the file" "model.safetensors" $BIN info -m "$tmp/m"

copy_fixture
echo '{"model_type": "kimi_k3", "text_config": ' >"$tmp/m/config.json"
expect_fail "bad config JSON names config.json" "config.json" $BIN info -m "$tmp/m"

copy_fixture
printf '{"weight_map": {"language_model.lm_head.weight": "model-00002-of-00002.safetensors"}}' \
    >"$tmp/m/model.safetensors.index.json"
mv "$tmp/m/model.safetensors" "$tmp/m/model-00001-of-00002.safetensors"
expect_fail "index naming a missing shard names it" "model-00002-of-00002.safetensors" $BIN info -m "$tmp/m"

expect_fail "missing folder" "nonexistent" $BIN info -m "$tmp/nonexistent"

copy_fixture
echo '{"prefill": [1, 2, 99999], "decode": []}' >"$tmp/p.json"
expect_fail "token id outside the vocabulary" "outside the vocabulary" \
    $BIN logits -m "$tmp/m" --prompt "$tmp/p.json" -o "$tmp/out.f32"

echo '{"prefill": [1, 2, "x"]}' >"$tmp/p.json"
expect_fail "prompt with a non-integer id names the field" "prefill\[2\]" \
    $BIN logits -m "$tmp/m" --prompt "$tmp/p.json" -o "$tmp/out.f32"

# A tensor with the wrong shape: rewrite one header entry's shape (same byte count) with Python-free sed.
copy_fixture
hdr_fix() {   # swap the shape of the first q_a_proj weight [24,64] -> [48,32]: same bytes, wrong shape
    /usr/bin/env LC_ALL=C sed -i '0,/q_a_proj.weight":{"dtype":"F32","shape":\[24,64\]/s//q_a_proj.weight":{"dtype":"F32","shape":[48,32]/' "$1"
}
hdr_fix "$tmp/m/model.safetensors"
if cmp -s "$tmp/m/model.safetensors" "$FIX/model.safetensors"; then
    echo "not ok - could not rewrite the q_a_proj shape in the fixture header"
else
    expect_fail "tensor with the wrong shape is named" "q_a_proj.weight" $BIN logits -m "$tmp/m" \
        --prompt "$FIX/prompt.json" -o "$tmp/out.f32"
fi

# An MXFP4 scale byte 0xFF (NaN in the MX spec) in one expert: found when that expert is loaded.
copy_fixture
python3 - "$tmp/m/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for name, info in h.items():
    if name.endswith(".weight_scale") and ".experts." in name:
        b[8 + n + info["data_offsets"][0]] = 0xFF
open(p, "wb").write(bytes(b))
PY
expect_fail "MXFP4 scale 0xFF names the tensor" "weight_scale" $BIN logits -m "$tmp/m" \
    --prompt "$FIX/prompt.json" -o "$tmp/out.f32"
if $BIN info -m "$tmp/m" >/dev/null 2>&1; then
    echo "ok - a NaN scale is not scanned for at open (info succeeds)"
else
    echo "not ok - info failed on a model whose only fault is one expert's NaN scale"
fi

# Flags: a bad value names the flag, the accepted range and the value; stray arguments are refused.
expect_usage() {   # name, pattern, command...: exit 2 and the message
    local name=$1 pat=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pat" <<<"$out" && ! grep -q "Sanitizer" <<<"$out"; then
        echo "ok - $name"
    else
        echo "not ok - $name (exit $rc): $(head -c 400 <<<"$out")"
    fi
}
expect_usage "-n 0 names the flag and its range" "-n/--max-tokens: expected an integer from 1 to 16777216, got '0'" \
    $BIN run -m "$FIX" --tokens 1,2 -n 0
expect_usage "--temp abc names the flag and its range" "--temp: expected a number from 0 to 100, got 'abc'" \
    $BIN run -m "$FIX" --tokens 1,2 --temp abc
expect_usage "--top-p 2 is out of range" "--top-p: expected a number from 0 to 1, got '2'" \
    $BIN chat -m "$FIX" --top-p 2
expect_usage "--cache-slots 12x is not a number" "--cache-slots: expected an integer from 1 to" \
    $BIN run -m "$FIX" --tokens 1,2 --cache-slots 12x
expect_usage "--seed -1 is out of range" "--seed: expected an integer from 0 to 2147483647" \
    $BIN run -m "$FIX" --tokens 1,2 --seed -1
expect_usage "run: a stray argument is refused" "unexpected argument 'old' and more" \
    $BIN run -m "$FIX" -p the old man and the river
expect_usage "info: a stray argument is refused" "unexpected argument 'extra'" $BIN info -m "$FIX" extra
expect_usage "logits: a stray argument is refused" "unexpected argument 'extra'" \
    $BIN logits -m "$FIX" --prompt "$FIX/prompt.json" -o "$tmp/out.f32" extra
expect_usage "logits -t 0 names the flag and its range" "-t/--threads: expected an integer from 1 to 1024, got '0'" \
    $BIN logits -m "$FIX" --prompt "$FIX/prompt.json" -o "$tmp/out.f32" -t 0
expect_usage "chat: a stray argument is refused" "unexpected argument 'hello'" $BIN chat -m "$FIX" hello
expect_usage "run: two prompts are refused" "exactly one prompt" $BIN run -m "$FIX" -p x --tokens 1
expect_fail "run -f of a missing file names it" "$tmp/no-such-prompt.txt" $BIN run -f "$tmp/no-such-prompt.txt"
: >"$tmp/empty.txt"
expect_fail "run -f of an empty file says so" "the prompt is empty" $BIN run -f "$tmp/empty.txt"
expect_fail "a prompt longer than the context gives both sizes" "more than the context of 4096 tokens" \
    $BIN run -m "$FIX" --tokens "$(seq -s, 1 4097 | sed 's/[0-9]*/7/g')" -n 1

out=$($BIN --version 2>&1); rc=$?
[[ $rc -eq 0 && "$out" =~ ^deltafin\ [0-9]+\.[0-9]+\.[0-9]+$ ]] && echo "ok - --version: $out" || echo "not ok - --version: $rc $out"

# The default model: $DELTAFIN_MODEL, next to the executable, PREFIX/share/deltafin after make install; a
# binary with none of them says where it looked.
root=$PWD
out=$(cd "$tmp" && DELTAFIN_MODEL="$root/$FIX" "$root/$BIN" info 2>&1)
grep -q "^model: $root/$FIX" <<<"$out" && echo "ok - DELTAFIN_MODEL is the default model" \
    || echo "not ok - DELTAFIN_MODEL: $(head -c 300 <<<"$out")"
out=$(cd "$tmp" && env -u DELTAFIN_MODEL "$root/deltafin" run --tokens 473,4595,555,326 -n 5 2>&1)
grep -q "^260,1213,1230,383,506$" <<<"$out" && echo "ok - ./deltafin run from another folder finds models/default beside it" \
    || echo "not ok - default model beside the executable: $(head -c 300 <<<"$out")"
if make -s --no-print-directory install PREFIX="$tmp/inst" >"$tmp/install.log" 2>&1; then
    out=$(cd "$tmp" && env -u DELTAFIN_MODEL "$tmp/inst/bin/deltafin" info 2>&1)
    grep -q "^model: $tmp/inst/bin/../share/deltafin/models/default" <<<"$out" && grep -q "^check: every tensor" <<<"$out" \
        && echo "ok - make install PREFIX=...: the installed binary finds the installed model" \
        || echo "not ok - installed binary's default model: $(head -c 300 <<<"$out")"
    mkdir -p "$tmp/lone" && cp "$tmp/inst/bin/deltafin" "$tmp/lone/"
    expect_fail "no default model anywhere: says where it looked" "no default model found: looked in \$DELTAFIN_MODEL" \
        env -u DELTAFIN_MODEL sh -c "cd '$tmp/lone' && ./deltafin info"
else
    echo "not ok - make install PREFIX=$tmp/inst: $(tail -c 300 "$tmp/install.log")"
fi
