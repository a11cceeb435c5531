#!/usr/bin/env bash
# test_nan_logits.sh — a model whose logits are NaN (the bundled model with its final norm's weights set to
# NaN) must fail loudly: `deltafin run` exits non-zero naming non-finite logits, and the server answers 500
# with that message (plain and streamed) instead of emitting token 0 as if it had been sampled.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/m"
cp models/default/config.json models/default/model.safetensors models/default/tiktoken.model \
    models/default/tokenizer_config.json "$tmp/m/"
python3 - "$tmp/m/model.safetensors" <<'PY' || { echo "not ok - could not patch the model"; exit 0; }
import json, struct, sys
p = sys.argv[1]
with open(p, 'r+b') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    h = json.loads(f.read(n))
    a, b = h['model.norm.weight']['data_offsets']
    f.seek(8 + n + a)
    f.write(b'\xc0\x7f' * ((b - a) // 2))   # BF16 quiet NaN
PY
out=$(build/asan/deltafin run -m "$tmp/m" -p "The jury said" -n 4 --heat off 2>"$tmp/err")
rc=$?
if [ "$rc" -ne 0 ] && grep -q "non-finite logits" "$tmp/err" && ! grep -q "Sanitizer\|runtime error" "$tmp/err"; then
    echo "ok - run on NaN logits: exit $rc, $(grep -o 'the model produced[^)]*)' "$tmp/err" | head -1)"
else
    echo "not ok - run on NaN logits: exit $rc, output '$out', $(tail -n 3 "$tmp/err")"
fi
./deltafin serve -m "$tmp/m" --host 127.0.0.1 --port 0 --threads 1 --no-prompt-cache --heat off 2>"$tmp/srv.log" &
pid=$!
url=
for _ in $(seq 1 100); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/srv.log" | head -n 1)
    [ -n "$url" ] && break
    sleep 0.1
done
code=$(curl -s -o "$tmp/r.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt":"The jury said","max_tokens":4}' "$url/v1/completions")
if [ "$code" = 500 ] && grep -q "non-finite logits" "$tmp/r.json"; then
    echo "ok - server on NaN logits: 500 naming them"
else
    echo "not ok - server on NaN logits: $code $(head -c 300 "$tmp/r.json")"
fi
curl -s -N -H 'Content-Type: application/json' -d '{"prompt":"The jury said","max_tokens":4,"stream":true}' \
    "$url/v1/completions" >"$tmp/s.txt"
if grep -q '"error".*non-finite logits' "$tmp/s.txt" && ! grep -q '"finish_reason":"stop"' "$tmp/s.txt"; then
    echo "ok - streamed answer on NaN logits: an error event, no finish"
else
    echo "not ok - streamed answer on NaN logits: $(head -c 300 "$tmp/s.txt")"
fi
kill -TERM "$pid"
wait "$pid"
pid=
