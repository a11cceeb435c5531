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
