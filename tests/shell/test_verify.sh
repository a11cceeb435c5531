#!/usr/bin/env bash
# test_verify.sh — `deltafin verify`: PASS on the bundled model (and on its transformers reference given as an
# oracle), FAIL naming the fault for a changed oracle, a bad install manifest, a K3-shaped synthetic checkpoint
# with a config value changed or a tensor of the wrong shape; exit status 1 exactly when a check fails.
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
tmp=$(mktemp -d /tmp/df_verify_XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# name, expected exit status, pattern (grep -E, one per line of output that must appear), command...
expect() {
    local name=$1 want=$2; shift 2
    local pats=()
    while [ "$1" != -- ]; do pats+=("$1"); shift; done
    shift
    local out rc miss=""
    out=$("$@" 2>&1); rc=$?
    for p in "${pats[@]}"; do grep -qE -- "$p" <<<"$out" || miss="$miss [$p]"; done
    if [ "$rc" -eq "$want" ] && [ -z "$miss" ] && ! grep -q Sanitizer <<<"$out"; then echo "ok - $name"
    else echo "not ok - $name (exit $rc, want $want; missing:$miss): $(head -c 1500 <<<"$out")"; fi
}

expect "bundled model passes, no token oracle known" 0 '^PASS  files: ' '^PASS  tensors: all 1501 present' \
    '^PASS  forward: one token' '^SKIP  token oracle: none is known for this model \(kimi_linear\)' \
    '^PASS: 5 passed, 0 failed' -- $BIN verify -m models/default
expect "the bundled model's transformers reference as oracle passes" 0 \
    '^PASS  tokenizer oracle: "The jury said that" -> \[473, 4595, 555, 326\]' '^PASS  greedy oracle: all 20 ids match' \
    '^PASS: 10 passed, 0 failed' -- $BIN verify -m models/default --oracle models/default/reference.json

# A changed oracle: one greedy id and one prompt id of the first case off by one.
awk 'BEGIN{g=0;p=0} /"greedy": \[/ && !g {g=1; print; getline; sub(/260/, "261"); print; next}
         /"prompt_ids": \[/ && !p {p=1; print; getline; sub(/473/, "474"); print; next} {print}' \
    models/default/reference.json >"$tmp/oracle.json"
expect "a changed oracle fails, naming the id" 1 \
    '^FAIL  tokenizer oracle: "The jury said that" gives \[473, 4595, 555, 326\], .*oracle.json, case 0 has \[474,' \
    '^FAIL  greedy oracle: id 1 of 20 is 260, .*case 0 has 261' '^FAIL: ' \
    -- $BIN verify -m models/default --oracle "$tmp/oracle.json"
echo '{"prompt": "x", "prompt_ids": [1], "greedy": ["a"]}' >"$tmp/bad_oracle.json"
expect "a malformed oracle file is refused naming the field" 2 'bad_oracle.json: cases\[0\].greedy\[0\] is not a token id' \
    -- $BIN verify -m models/default --oracle "$tmp/bad_oracle.json"

# Install manifests: malformed, a complete shard whose hash was never checked, a size that no longer matches,
# and one that checks out.
mkdir -p "$tmp/m/.deltafin"
for f in config.json model.safetensors tiktoken.model tokenizer_config.json; do ln -s "$PWD/models/default/$f" "$tmp/m/$f"; done
size=$(stat -L -c %s models/default/model.safetensors)
sha=$(printf '%064d' 0)
echo '{"version": 1, "shards": [' >"$tmp/m/.deltafin/install.json"
expect "a malformed install manifest fails naming install.json" 1 '^FAIL  install: .*\.deltafin/install\.json' \
    -- $BIN verify -m "$tmp/m" --no-engine
echo "{\"version\":1,\"shards\":[{\"name\":\"model.safetensors\",\"size\":$size,\"state\":\"complete\",\"sha256\":\"$sha\",\"holes\":[]}]}" \
    >"$tmp/m/.deltafin/install.json"
expect "a complete shard never hash-checked fails naming it" 1 \
    '^FAIL  install: 1 of the manifest.s shards fail' 'model.safetensors is complete but its SHA-256 was never checked' \
    -- $BIN verify -m "$tmp/m" --no-engine
echo "{\"version\":1,\"shards\":[{\"name\":\"model.safetensors\",\"size\":$((size + 1)),\"state\":\"complete\",\"sha256\":\"$sha\",\"verified\":true,\"holes\":[]}]}" \
    >"$tmp/m/.deltafin/install.json"
expect "a shard whose size changed since install fails" 1 "model.safetensors is $size bytes, the manifest says $((size + 1))" \
    -- $BIN verify -m "$tmp/m" --no-engine
echo "{\"version\":1,\"shards\":[{\"name\":\"model.safetensors\",\"size\":$size,\"state\":\"complete\",\"sha256\":\"$sha\",\"verified\":true,\"holes\":[]}]}" \
    >"$tmp/m/.deltafin/install.json"
expect "a verified install passes" 0 '^PASS  install: 1 shard complete with SHA-256 verified at install' \
    '^SKIP  engine: not opened \(--no-engine\)' -- $BIN verify -m "$tmp/m" --no-engine

# The K3 test fixture has K3's tensor layout at tiny widths: its tensors match its config, its config is not K3's.
expect "a tiny kimi_k3 fixture: tensors match its config, K3 values fail" 1 '^PASS  tensors: all' \
    '^FAIL  config: Kimi K3 values: .*hidden_size is 64, K3 has 7168' '^SKIP  engine: not opened: the checkpoint failed' \
    -- $BIN verify -m tests/fixtures/k3-tiny

# A K3-shaped synthetic checkpoint: every width of K3, two layers, four experts, a 512-token vocabulary.
if ! ./deltafin synth --family k3 --layers 2 --experts 4 --vocab 512 -o "$tmp/k3" >"$tmp/synth.out" 2>&1; then
    echo "not ok - synth k3: $(tail -3 "$tmp/synth.out")"
    exit 0
fi
expect "a K3-shaped synthetic checkpoint passes; the published sizes and oracle do not apply" 0 \
    '^PASS  config: Kimi K3 values: every shape and behaviour value is the published K3' \
    '^SKIP  config: Kimi K3 sizes: a K3-shaped checkpoint with 2 layers, 4 experts' \
    '^PASS  tensors: all 80 present' '^PASS  forward: one token \(id 0\) gives 512 finite logits' \
    '^SKIP  token oracle: none is known for this model \(a K3-shaped checkpoint' -- $BIN verify -m "$tmp/k3"
cp "$tmp/k3/config.json" "$tmp/config.json"
sed -i 's/"activation_situ_beta": 4.0/"activation_situ_beta": 3.5/' "$tmp/k3/config.json"
expect "K3 synthetic with a config value changed fails naming it" 1 \
    '^FAIL  config: Kimi K3 values: 1 value differs: activation_situ_beta is 3.5, K3 has 4' '^PASS  tensors: all 80' \
    -- $BIN verify -m "$tmp/k3" --no-engine
# The same config at the published sizes (93 layers, K3's schedule, 896 experts): the sizes check passes, and the
# tensors of the two layers present no longer cover it; with top-8 instead of top-16 the sizes check fails.
k3_sizes() {   # top-k
    python3 - "$tmp/config.json" "$1" >"$tmp/k3/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); t = c["text_config"]
t["num_hidden_layers"] = 93; t["num_experts"] = 896; t["num_experts_per_token"] = int(sys.argv[2])
mla = [l for l in range(1, 94) if l % 4 == 0 or l in (92, 93)]
t["linear_attn_config"]["full_attn_layers"] = mla
t["linear_attn_config"]["kda_layers"] = [l for l in range(1, 94) if l not in mla]
t["vocab_size"] = 163840
json.dump(c, sys.stdout)
PY
}
if command -v python3 >/dev/null 2>&1; then
    k3_sizes 16
    expect "the published K3 sizes are recognised" 1 '^PASS  config: Kimi K3 sizes: 93 layers .*the published K3' \
        '^FAIL  tensors: .*problems' -- $BIN verify -m "$tmp/k3" --no-engine
    k3_sizes 8
    expect "published sizes with another top-k fail naming it" 1 \
        '^FAIL  config: Kimi K3 sizes: 1 value differs: num_experts_per_token is 8, K3 has 16' \
        -- $BIN verify -m "$tmp/k3" --no-engine
else
    echo "skip - the published K3 sizes (no python3 to rewrite the config)"
fi
cp "$tmp/config.json" "$tmp/k3/config.json"
# Layer 1's router [4, 7168] rewritten as [7168, 4] in the shard's header: the same bytes, the wrong shape.
shard=$tmp/k3/model-00002-of-000002.safetensors
hl=$(od -An -t u8 -N8 "$shard" | tr -d ' ')
dd if="$shard" of="$tmp/header" bs=1 skip=8 count="$hl" status=none
grep -c '"shape":\[4,7168\]' "$tmp/header" >/dev/null && sed -i 's/"shape":\[4,7168\]/"shape":[7168,4]/' "$tmp/header"
dd if="$tmp/header" of="$shard" bs=1 seek=8 conv=notrunc status=none
expect "K3 synthetic with a tensor of the wrong shape fails naming it" 1 \
    '^FAIL  tensors: 1 problem' 'layers\.1\.block_sparse_moe\.gate\.weight is \[7168, 4\], expected \[4, 7168\]' \
    '^SKIP  engine: not opened: the checkpoint failed' -- $BIN verify -m "$tmp/k3"
