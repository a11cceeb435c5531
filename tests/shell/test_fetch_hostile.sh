#!/usr/bin/env bash
# test_fetch_hostile.sh — a remote that serves bad values: fetch (--spine, --dry-run) and bench fetch refuse
# them with a clear error naming the file, never a crash. An index whose weight_map holds a non-string value
# (this once crashed with SIGSEGV), a shard header with overlapping tensors or non-integer offsets, and
# Content-Range answers with a wrong, zero, negative or non-numeric total. Then local files: prompt files
# that once double-freed, FIFOs and /dev/zero in place of model files, config integers past int range.
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
T=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
ok() { if [ "$1" -eq 0 ]; then echo "ok - $2"; else echo "not ok - $2"; fi; }
F=tests/fixtures/kl-mxfp4

# repositories with one bad value each, beside a good one
mk_repo() { mkdir -p "$T/root/$1"; cp "$F/config.json" "$F/model.safetensors" "$T/root/$1/"; }
mk_repo good
mk_repo idx-int && echo '{"weight_map":{"model.embed_tokens.weight":1}}' >"$T/root/idx-int/model.safetensors.index.json"
mk_repo idx-obj && echo '{"weight_map":{"a":"model.safetensors","b":{"x":1}}}' >"$T/root/idx-obj/model.safetensors.index.json"
mk_repo idx-up && echo '{"weight_map":{"a":"../good/model.safetensors"}}' >"$T/root/idx-up/model.safetensors.index.json"
mk_repo hdr-overlap; mk_repo hdr-real; mk_repo hdr-past
python3 - "$T/root" <<'PY'
import json, struct, sys
root = sys.argv[1]
def shard(name, header, data_len):
    h = json.dumps(header).encode()
    with open(f"{root}/{name}/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(data_len))
shard("hdr-overlap", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, 24)
shard("hdr-real", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16]}}, 16)
shard("hdr-past", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8)
PY
python3 tests/remote/server.py --root "$T/root" --port-file "$T/port" >"$T/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 400); do [ -s "$T/port" ] && break; sleep 0.05; done
H="http://127.0.0.1:$(cat "$T/port")"
U=$H/org/m/resolve/main

refused() {   # name, expected message, command...: non-zero exit without a signal, the message, no sanitizer report
    local name=$1 want=$2; shift 2
    timeout 60 "$@" >"$T/out" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$want" "$T/out" && ! grep -q "Sanitizer\|runtime error" "$T/out"
    ok $? "$name (exit $rc: $(grep -m1 -o "deltafin[^:]*: .\{0,120\}" "$T/out"))"
}
for r in idx-int idx-obj idx-up; do
    refused "$r: fetch --spine refuses the index" "weight_map\['[a-z._]*'\] must be a shard file name" \
        "$BIN" fetch --from "$U/$r" -m "$T/m-$r" --spine
    [ ! -e "$T/m-$r/model.safetensors.index.json" ]
    ok $? "$r: the bad index is not kept on disk"
    refused "$r: fetch --dry-run refuses the index" "must be a shard file name" \
        "$BIN" fetch --from "$U/$r" -m "$T/d-$r" --dry-run
    refused "$r: bench fetch refuses the index" "must be a shard file name" \
        "$BIN" bench fetch --from "$U/$r" --experts 1
done
refused "a fetched header with overlapping tensors is refused" "overlaps" \
    "$BIN" fetch --from "$U/hdr-overlap" -m "$T/m-ov" --spine
refused "a fetched header with non-integer offsets is refused" "data_offsets must be two non-negative integers" \
    "$BIN" fetch --from "$U/hdr-real" -m "$T/m-real" --dry-run
refused "a fetched header with offsets past the remote file is refused" "outside the data region" \
    "$BIN" bench fetch --from "$U/hdr-past"

ctl() { curl -s "$H/$1" >/dev/null; }
for cr in "bytes 0-0/0" "bytes 0-0/-5" "bytes 0-0/abc" "bytes -1-0/100" "bytes 0-0/*" \
          "bytes 0-0/99999999999999999999999"; do
    ctl _reset
    ctl "_fault?mode=crange&count=1&match=good/model.safetensors&arg=$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$cr")"
    refused "Content-Range '$cr' for the shard size is refused" "Content-Range" \
        "$BIN" fetch --from "$U/good" -m "$T/m-cr" --dry-run
done
# four shards each claiming 2^62 bytes: 2^64 in all, which once wrapped to 0 and passed the disk check
mkdir -p "$T/root/sat" && cp "$F/config.json" "$T/root/sat/"
for k in 1 2 3 4; do
    cp "$F/model.safetensors" "$T/root/sat/s$k.safetensors"
    ctl "_fault?mode=crange&count=1&match=sat/s$k.safetensors&arg=bytes%200-0/4611686018427387904"
done
echo '{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s3.safetensors","d":"s4.safetensors"}}' \
    >"$T/root/sat/model.safetensors.index.json"
refused "shard sizes summing past 2^64 do not wrap around the --min-free check" "not starting" \
    "$BIN" fetch --from "$U/sat" -m "$T/m-sat" --all --dry-run
ctl _reset
"$BIN" fetch --from "$U/good" -m "$T/m-good" --spine >"$T/out" 2>&1
ok $? "the same server's good repository still fetches"

# local files: the prompt files that once aborted with "double free", a FIFO or /dev/zero in place of model
# files (once a hang or unbounded memory), config integers past int range
P=$T/prompts
mkdir -p "$P"
mkdir -p "$T/q" && cp "$F/config.json" "$F/model.safetensors" "$T/q/" && "$BIN" quantize -m "$T/q" --spine int8 >/dev/null 2>&1
i=0
for p in '{"prefill":[],"decode":[]}' '{"prefill":[1],"decode":"x"}' '{"prefill":[1],"decode":[-1]}'; do
    i=$((i + 1))
    echo "$p" >"$P/$i.json"
    refused "logits refuses prompt $p" "prompt\|prefill\|decode" \
        "$BIN" logits -m "$F" --prompt "$P/$i.json" -o "$T/x.f32"
    refused "quantize --compare refuses prompt $p" "prompt\|prefill\|decode" \
        "$BIN" quantize -m "$T/q" --compare --prompt "$P/$i.json"
done
mk_local() { rm -rf "$T/l-$1"; mkdir -p "$T/l-$1"; cp "$F/config.json" "$F/model.safetensors" "$T/l-$1/"; }
mk_local fifo-shard && rm "$T/l-fifo-shard/model.safetensors" && mkfifo "$T/l-fifo-shard/model.safetensors"
refused "a FIFO in place of the shard is refused at once" "not a regular file" "$BIN" info -m "$T/l-fifo-shard"
mk_local fifo-config && rm "$T/l-fifo-config/config.json" && mkfifo "$T/l-fifo-config/config.json"
refused "a FIFO in place of config.json is refused at once" "not a regular file" "$BIN" info -m "$T/l-fifo-config"
mk_local zero-config && ln -sf /dev/zero "$T/l-zero-config/config.json"
refused "config.json pointing at /dev/zero is refused" "not a regular file" "$BIN" info -m "$T/l-zero-config"
for kv in "num_hidden_layers -1" "num_hidden_layers 2147483648" "hidden_size 4294967297"; do
    set -- $kv
    mk_local cfg
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c[sys.argv[2]]=int(sys.argv[3]); json.dump(c,open(sys.argv[1],'w'))" \
        "$T/l-cfg/config.json" "$1" "$2"
    refused "config $1 = $2 is refused" "$1" "$BIN" info -m "$T/l-cfg"
done
for f in tokenizer_config.json tiktoken.model; do
    rm -rf "$T/tk" && mkdir -p "$T/tk" && cp tests/tokenizer/tiny_k3/* "$T/tk/" && rm "$T/tk/$f" && mkfifo "$T/tk/$f"
    refused "a FIFO in place of $f is refused at once" "not a regular file" "$BIN" tokenize -m "$T/tk" --text hi
done
