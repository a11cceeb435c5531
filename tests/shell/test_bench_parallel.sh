#!/usr/bin/env bash
# test_bench_parallel.sh — `deltafin bench --parallel N` on the bundled model: N streams decoded together, one
# pass per step. Checks the JSON report's fields and their arithmetic, that stream 0 gets the tokens the single
# stream gets, that --parallel 1 is the plain bench, that a pass reads the streamed spine once for all streams
# (deterministic byte counts: streamed spine, 1-slot cache, look-ahead off), and that a prefill split into
# passes (--prefill-rows) reports its passes and the same unique (layer, expert) pairs as one pass.
set -u
cd "$(dirname "$0")/../.."
bin=${DELTAFIN_BIN:-./deltafin}
dir=$(mktemp -d /tmp/df_benchpar_XXXXXX)
trap 'rm -rf "$dir"' EXIT
common=(-m models/default --probe-gb 0.01 --threads 2 --json)

run() {   # name, args...: one JSON line into $dir/name.json
    local name=$1; shift
    if $bin bench "${common[@]}" "$@" >"$dir/$name.json" 2>"$dir/$name.err"; then
        echo "ok - bench $* exits 0"
    else
        echo "not ok - bench $*: $(tail -3 "$dir/$name.err")"
    fi
}
run plain -n 5 --prompt 8
run p1 -n 5 --prompt 8 --parallel 1
run p4 -n 5 --prompt 8 --parallel 4
stream=(--spine-stream --cache-slots 1 --lookahead=off)
run s1 -n 4 --prompt 8 --parallel 1 "${stream[@]}"
run s4 -n 4 --prompt 8 --parallel 4 "${stream[@]}"
run one -n 2 --prompt 50 --parallel 3 --lookahead=off
run chunk -n 2 --prompt 50 --parallel 3 --lookahead=off --prefill-rows 16
run chunk1 -n 2 --prompt 50 --parallel 3 --lookahead=off --prefill-rows 16 --cache-slots 1

python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def load(name):
    try:
        return json.load(open(f"{d}/{name}.json"))
    except Exception as e:
        print(f"not ok - {name}.json is one JSON object ({e})")
        return None
r = {k: load(k) for k in ["plain", "p1", "p4", "s1", "s4", "one", "chunk", "chunk1"]}
def check(cond, msg):
    print(("ok - " if cond else "not ok - ") + msg)
if all(r.values()):
    p1, p4, s1, s4 = r["p1"], r["p4"], r["s1"], r["s4"]
    need = ["parallel", "aggregate_tokens_per_s", "s_per_token", "disk_bytes_per_token", "io_floor_s_per_token",
            "io_floor_s_per_pass", "disk_bytes_per_pass", "tokens_per_stream", "generated_streams", "prefill_chunks",
            "prefill_expert_reads", "prefill_unique_experts", "compute_s_per_token", "floor_ratio", "disk_gbps"]
    miss = [k for k in need if k not in p4]
    check(not miss, f"--parallel 4 --json has the fields{' (missing %s)' % miss if miss else ''}")
    check(set(r["plain"]) == set(p1) and r["plain"]["generated"] == p1["generated"] and p1["parallel"] == 1,
          "--parallel 1 reports the plain bench's fields and tokens")
    n = 5
    gs = p4["generated_streams"]
    check(p4["parallel"] == 4 and p4["tokens"] == 4 * n and p4["tokens_per_stream"] == n and len(gs) == 4
          and all(len(g) == n for g in gs) and p4["passes"] == n and p4["tokens_per_pass"] == 4,
          f"4 streams x {n} tokens: {p4['tokens']} generated tokens in {p4['passes']} passes")
    check(gs[0] == p1["generated"] == p4["generated"],
          f"stream 0 in the batch gets the single stream's tokens: {gs[0]} vs {p1['generated']}")
    check(len({tuple(g) for g in gs}) > 1, f"the streams have different prompts: {gs}")
    agg = p4["aggregate_tokens_per_s"]
    check(agg > 0 and abs(agg * p4["s_per_token"] - 4) < 0.01 * 4,
          f"aggregate tokens/s ({agg}) = streams / s per token per stream ({p4['s_per_token']})")
    for x in (p4, s4):
        check(abs(x["disk_bytes_per_pass"] - 4 * x["disk_bytes_per_token"]) <= 4 and
              abs(x["io_floor_s_per_token"] - x["disk_bytes_per_token"] / (x["disk_gbps"] * 1e9)) < 2e-6,
              f"bytes and floor per pass = 4 x per generated token ({x['disk_bytes_per_pass']} B, "
              f"{x['disk_bytes_per_token']} B)")
    check(s1["streamed_layers"] > 0 and s4["streamed_layers"] == s1["streamed_layers"]
          and 4 * s4["spine_bytes_per_token"] < 1.1 * s1["spine_bytes_per_token"],
          f"a pass reads the streamed spine once for all 4 streams: {4 * s4['spine_bytes_per_token']:.0f} B/pass "
          f"vs {s1['spine_bytes_per_token']:.0f} B/pass alone")
    check(0 < s4["disk_bytes_per_token"] <= 0.5 * s1["disk_bytes_per_token"],
          f"disk bytes per generated token, 4 streams vs 1 (1-slot cache): {s4['disk_bytes_per_token']:.0f} vs "
          f"{s1['disk_bytes_per_token']:.0f}")
    one, ch, ch1 = r["one"], r["chunk"], r["chunk1"]
    check(one["prefill_chunks"] == 1 and one["prefill_expert_reads"] == one["prefill_unique_experts"]
          == one["prefill_expert_requests"] > 0,
          f"3 prompts x 50 tokens in one pass: reads == unique pairs ({one['prefill_expert_reads']})")
    check(ch["prefill_chunks"] == 10 and ch["prefill_rows_per_pass"] == 16 and ch1["prefill_chunks"] == 10,
          f"150 prompt rows in passes of 16 rows: {ch['prefill_chunks']} passes")
    check(ch["prefill_unique_experts"] == ch1["prefill_unique_experts"] == one["prefill_unique_experts"]
          and ch["prefill_expert_requests"] > ch["prefill_unique_experts"],
          f"unique pairs counted over all passes ({ch['prefill_unique_experts']}) equal one pass's, the passes' "
          f"unions sum to more ({ch['prefill_expert_requests']})")
    check(ch1["prefill_expert_reads"] >= ch1["prefill_unique_experts"] and ch["prefill_expert_reads"] < ch1["prefill_expert_reads"],
          f"a 1-slot cache re-reads across passes ({ch1['prefill_expert_reads']} reads), a large one less "
          f"({ch['prefill_expert_reads']})")
    check(one["generated_streams"] == ch["generated_streams"] == ch1["generated_streams"],
          "prefill passes change no token")
PY

out=$($bin bench -m models/default --probe-gb 0.01 --threads 2 -n 2 --prompt 300 --parallel 2 --prefill-rows 256 2>&1)
if echo "$out" | grep -qE '^prefill: 300 tokens x 2 streams in [0-9.]+ s, 3 passes of up to 256 rows; experts read [0-9]+ \(.*\) for [0-9]+ unique \(layer, expert\) needed: reads (==|<|>) unique pairs' &&
   echo "$out" | grep -qE '^decode: 2 streams x 2 tokens, 2 passes: .* tokens/s aggregate; I/O floor .* s/pass'; then
    echo "ok - text report: prefill passes, reads and unique pairs; aggregate decode line"
else
    echo "not ok - text report: $out"
fi
err=$($bin bench -m models/default --parallel 0 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$err" | grep -q -- "--parallel" && echo "ok - --parallel 0 refused" || echo "not ok - --parallel 0: rc $rc $err"
err=$($bin bench -m models/default --parallel 2 --spec ngram 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$err" | grep -q -- "--spec" && echo "ok - --parallel with --spec refused" ||
    echo "not ok - --parallel --spec: rc $rc $err"
