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

# the server: the same greedy text with and without drafts (alone, two slots at once, streamed token by
# token), and usage and /metrics count the drafts
start_server() {   # LOG ARGS...: starts deltafin serve, sets pid and url
    local log=$1
    shift
    $BIN serve -m models/default --host 127.0.0.1 --port 0 --threads 1 --no-prompt-cache "$@" 2>"$log" &
    pid=$!
    url=
    for _ in $(seq 1 200); do
        url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -n 1)
        [ -n "$url" ] && break
        sleep 0.1
    done
}
stop_server() {
    kill "$pid"
    wait "$pid" 2>/dev/null
    pid=
}
complete() {   # PROMPT [stream]: a greedy completion of 24 tokens
    python3 - "$url" "$1" "${2:-}" <<'EOF'
import json, sys, urllib.request
body = {"prompt": sys.argv[2], "max_tokens": 24, "temperature": 0}
if sys.argv[3]: body["stream"] = True
req = urllib.request.Request(sys.argv[1] + "/v1/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=300).read().decode())
EOF
}
text_of() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['choices'][0]['text'])" "$1"; }
prompt2='def f(x): return x + 1
def g(x): return x + 2
def h(x): return x +'

start_server "$tmp/serve_off.log" --spec off
off1=$(text_of "$(complete "$prompt")")
off2=$(text_of "$(complete "$prompt2")")
stop_server

start_server "$tmp/serve.log" --spec draft --draft models/draft
resp=$(complete "$prompt")
complete "$prompt" >"$tmp/c1.json" &
c1=$!
complete "$prompt2" >"$tmp/c2.json"
wait "$c1"
complete "$prompt" stream >"$tmp/stream.txt"
metrics=$(curl -s "$url/metrics")
stop_server
on1=$(text_of "$resp")
if [ -n "$off1" ] && [ "$on1" = "$off1" ] && [ "$(text_of "$(cat "$tmp/c1.json")")" = "$off1" ] &&
    [ "$(text_of "$(cat "$tmp/c2.json")")" = "$off2" ]; then
    echo "ok - serve --spec draft: the same greedy text as --spec off, alone and with two slots busy"
else
    echo "not ok - serve --spec draft text: '$on1' / $(cat "$tmp/c1.json" "$tmp/c2.json") vs '$off1' / '$off2'"
fi
if python3 - "$tmp/stream.txt" "$off1" <<'EOF'
import json, sys
chunks = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: {")]
texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
assert "".join(texts) == sys.argv[2], texts
# one chunk per token, even when a pass accepts several drafts
assert sum(1 for t in texts if t) >= 20, texts
EOF
then
    echo "ok - serve --spec draft: streamed deltas arrive token by token with the same text"
else
    echo "not ok - serve --spec draft streaming: $(cat "$tmp/stream.txt")"
fi
if python3 -c "
import json, sys
u = json.loads(sys.argv[1])['usage']
d = u['completion_tokens_details']
assert u['completion_tokens'] == 24 and d['accepted_prediction_tokens'] > 0, u
assert d['rejected_prediction_tokens'] >= 0, u
" "$resp" && grep -q '^deltafin_drafted_tokens_total [1-9]' <<<"$metrics" &&
    grep -q '^deltafin_accepted_tokens_total [1-9]' <<<"$metrics" &&
    python3 -c "
import re, sys
m = dict(re.findall(r'^(deltafin_\w+) (\S+)$', sys.argv[1], re.M))
p, g = float(m['deltafin_decode_passes_total']), float(m['deltafin_generated_tokens_total'])
assert 0 < p < g - 4, (p, g)   # four answers, each one token from its prompt's pass; drafts cut the rest
" "$metrics"; then
    echo "ok - serve --spec draft: usage and /metrics report drafted and accepted tokens, fewer passes than tokens"
else
    echo "not ok - serve speculation counters: $resp / $(grep -i 'draft\|accept\|passes\|generated' <<<"$metrics")" \
        "/ $(cat "$tmp/serve.log")"
fi
