#!/usr/bin/env bash
# Speculative decoding through the command line on the bundled model: run gives the same text with
# --spec off, ngram, draft (models/draft) and auto; --stats-json and bench --json carry the counters;
# bad flag values are usage errors; the server reports drafted/accepted in usage and /metrics.
set -u
cd "$(dirname "$0")/../.."
BIN=./deltafin
tmp=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; fi; rm -rf "$tmp"' EXIT

prompt='1. the house on the hill 2. the road to the river 3. the house on the hill 4. the road to the river 5. the'
ref=$($BIN run -p "$prompt" -n 40 --spec off 2>/dev/null)
for m in ngram draft auto; do
    out=$($BIN run -p "$prompt" -n 40 --spec $m --draft models/draft --stats-json "$tmp/$m.json" 2>"$tmp/$m.err")
    if [ "$?" -eq 0 ] && [ -n "$ref" ] && [ "$out" = "$ref" ]; then
        echo "ok - run --spec $m: the same text as --spec off"
    else
        echo "not ok - run --spec $m: '$out' vs '$ref' ($(cat "$tmp/$m.err"))"
    fi
done

check_json() {   # FILE NAME: one JSON object with the counters, consistent with each other
    python3 - "$1" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).read())
need = ["tokens", "passes", "tokens_per_pass", "drafted", "accepted", "disk_bytes_per_token"]
missing = [k for k in need if k not in d]
assert not missing, missing
assert d["passes"] >= 1 and abs(d["tokens_per_pass"] - d["tokens"] / d["passes"]) < 1e-3, d
assert 0 <= d["accepted"] <= d["drafted"], d
EOF
}
if check_json "$tmp/draft.json" && python3 -c "import json,sys; d=json.load(open('$tmp/draft.json')); sys.exit(not (d['drafted'] > 0 and d['passes'] < d['tokens']))"; then
    echo "ok - run --stats-json: counters present and consistent; the draft model cut the passes ($(cat "$tmp/draft.json" | head -c 120))"
else
    echo "not ok - run --stats-json: $(cat "$tmp/draft.json")"
fi
grep -q "speculation draft: .* passes" "$tmp/draft.err" && echo "ok - run prints passes per token" ||
    echo "not ok - run printed no speculation summary: $(cat "$tmp/draft.err")"

$BIN run -p x --spec fast >/dev/null 2>"$tmp/e1"; rc1=$?
$BIN run -p x --draft-max 0 >/dev/null 2>"$tmp/e2"; rc2=$?
$BIN run -p x --spec draft >/dev/null 2>"$tmp/e3"; rc3=$?
$BIN run -p x --spec draft --draft tests/fixtures/kl-fp32 >/dev/null 2>"$tmp/e4"; rc4=$?
if [ $rc1 -eq 2 ] && grep -q "expected off, ngram, draft or auto" "$tmp/e1" && [ $rc2 -eq 2 ] && [ $rc3 -ne 0 ] &&
    grep -q "needs a draft model" "$tmp/e3" && [ $rc4 -ne 0 ] && grep -q "vocabulary" "$tmp/e4"; then
    echo "ok - bad --spec, --draft-max, a missing or mismatched draft model: clear errors"
else
    echo "not ok - spec flag errors: $rc1 $rc2 $rc3 $rc4 $(cat "$tmp"/e[1-4])"
fi

if $BIN bench -m models/default --prompts bench/spec_prompts.jsonl --kind repetitive -n 8 --spec ngram \
    --probe-gb 0.01 --json >"$tmp/bench.json" 2>"$tmp/bench.err" && check_json "$tmp/bench.json" &&
    python3 -c "import json,sys; d=json.load(open('$tmp/bench.json')); sys.exit(not (d['spec']=='ngram' and d['tokens']==64 and 's_per_token' in d))"; then
    echo "ok - bench --spec ngram --prompts --json: one line with the counters"
else
    echo "not ok - bench --spec: $(cat "$tmp/bench.json" "$tmp/bench.err")"
fi

# the server: usage and /metrics
$BIN serve -m models/default --host 127.0.0.1 --port 0 --threads 1 --spec draft --draft models/draft \
    2>"$tmp/serve.log" &
pid=$!
url=
for _ in $(seq 1 200); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/serve.log" | head -n 1)
    [ -n "$url" ] && break
    sleep 0.1
done
resp=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$prompt\", \"max_tokens\": 24, \"temperature\": 0}")
metrics=$(curl -s "$url/metrics")
if python3 -c "
import json, sys
u = json.loads(sys.argv[1])['usage']
d = u['completion_tokens_details']
assert u['completion_tokens'] == 24 and d['accepted_prediction_tokens'] > 0, u
" "$resp" && grep -q '^deltafin_drafted_tokens_total [1-9]' <<<"$metrics" &&
    grep -q '^deltafin_accepted_tokens_total [1-9]' <<<"$metrics" && grep -q '^deltafin_decode_passes_total' <<<"$metrics"; then
    echo "ok - serve --spec draft: usage and /metrics report drafted and accepted tokens"
else
    echo "not ok - serve speculation counters: $resp / $(grep -i draft <<<"$metrics") / $(cat "$tmp/serve.log")"
fi
kill "$pid"
wait "$pid" 2>/dev/null
pid=
