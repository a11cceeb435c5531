#!/usr/bin/env bash
# test_stream_synth.sh — `deltafin synth` writes a checkpoint the engine accepts (info check, run), and
# `deltafin bench` on it gives the same greedy tokens whether the spine is resident or streamed and the
# expert cache holds everything or 1 slot; the JSON report carries the fields the issue names and the
# prefill reads each needed expert once. Uses a small Kimi-Linear synth (real hidden size, 3 layers, 4 experts).
set -u
cd "$(dirname "$0")/../.."
bin=./deltafin
dir=$(mktemp -d /tmp/df_synth_XXXXXX)
trap 'rm -rf "$dir"' EXIT
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }

if $bin synth --family kimi-linear --layers 3 --experts 4 --vocab 512 -o "$dir/m" >"$dir/out" 2>&1; then
    ok "synth kimi-linear 3 layers x 4 experts"
else
    bad "synth failed: $(tail -3 "$dir/out")"; exit 0
fi
[ "$(find "$dir/m" -name 'model-*.safetensors' | wc -l)" = 3 ] && ok "one shard per layer" || bad "shard count"
if $bin info -m "$dir/m" >"$dir/info" 2>&1 && grep -q "every tensor present" "$dir/info" && grep -q "problems: none" "$dir/info" &&
   ! grep -q "^unknown:" "$dir/info"; then
    ok "info: tensors check out, every name is in the tensor-name table, no problems"
else
    bad "info: $(grep -iE 'problem|error' "$dir/info" | head -3)"
fi
run_ids=$($bin run -m "$dir/m" --tokens 1,2,3 -n 3 2>/dev/null)
[ -n "$run_ids" ] && ok "run on the synth checkpoint: $run_ids" || bad "run on the synth checkpoint"

# MXFP4 experts (the 48B-shaped benchmark checkpoint's format): loads, checks out, and runs the same tokens
# through a 1-slot cache with a streamed spine and look-ahead on as with everything resident
if $bin synth --family kimi-linear --layers 3 --experts 6 --experts-per-token 2 --vocab 512 --expert-dtype mxfp4 -o "$dir/mx" >"$dir/mx.out" 2>&1 &&
   grep -q "MXFP4 experts" "$dir/mx.out"; then
    ok "synth kimi-linear --expert-dtype mxfp4"
else
    bad "synth mxfp4: $(tail -2 "$dir/mx.out")"
fi
if $bin info -m "$dir/mx" >"$dir/mx.info" 2>&1 && grep -q "every tensor present" "$dir/mx.info" &&
   grep -q "w1 MXFP4" "$dir/mx.info" && grep -q "bytes per expert: 3.59 MiB (3760128 bytes)" "$dir/mx.info"; then
    ok "info: mxfp4 experts of 3,760,128 bytes (Kimi-Linear 48B shapes), every tensor present"
else
    bad "info mxfp4: $(grep -iE 'matrices|bytes per expert|problem|error' "$dir/mx.info" | head -4)"
fi
mx_a=$($bin run -m "$dir/mx" --tokens 1,2,3 -n 4 2>/dev/null)
mx_b=$($bin run -m "$dir/mx" --tokens 1,2,3 -n 4 --cache-slots 1 --spine-stream --lookahead=on 2>/dev/null)
[ -n "$mx_a" ] && [ "$mx_a" = "$mx_b" ] && ok "mxfp4 synth runs, same tokens resident and through 1 slot: $mx_a" ||
    bad "mxfp4 synth run: '$mx_a' vs '$mx_b'"

$bin bench -m "$dir/m" -n 3 --prompt 6 --probe-gb 0.05 --json >"$dir/a.json" 2>"$dir/a.err" || bad "bench default: $(cat "$dir/a.err")"
$bin bench -m "$dir/m" -n 3 --prompt 6 --probe-gb 0.05 --json --spine-stream --cache-slots 1 >"$dir/b.json" 2>"$dir/b.err" ||
    bad "bench streamed: $(cat "$dir/b.err")"
$bin bench -m "$dir/m" -n 3 --prompt 6 --probe-gb 0.05 --json --spine-stream --cache-slots 2 --buffered-io >"$dir/c.json" 2>"$dir/c.err" ||
    bad "bench buffered: $(cat "$dir/c.err")"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
a, b, c = (json.load(open(f"{d}/{x}.json")) for x in "abc")
need = ["s_per_token", "io_floor_s_per_token", "compute_s_per_token", "floor_ratio", "disk_bytes_per_token", "disk_gbps",
        "cache_hit_rate", "rss_peak_bytes", "lookahead_layers"]
miss = [k for k in need if k not in a] + [k for k in ["spine_read", "expert_read", "spine_compute", "attention", "lm_head",
        "expert_compute", "other"] if k not in a.get("breakdown", {})]
print(("ok - " if not miss else "not ok - ") + "bench --json has the issue's fields" + (f" (missing {miss})" if miss else ""))
fl = max(a["io_floor_s_per_token"], a["compute_s_per_token"])
ok = all(x["compute_reruns"] == 3 and x["rerun_logits_identical"] for x in (a, b, c)) and a["compute_rerun_disk_bytes"] == 0 \
    and a["compute_s_per_token"] > 0 and abs(a["floor_ratio"] - a["s_per_token"] / fl) < 1e-3 * a["floor_ratio"] + 1e-4
print(("ok - " if ok else "not ok - ") + f"compute-only re-runs: same logits as the timed token, nothing read when resident "
      f"({a['compute_rerun_disk_bytes']} B), floor_ratio = s/token / max(floor, compute) = {a['floor_ratio']}")
def best_ok(x):   # the floor's rate is the probe's best or the engine's own in-flight rate, whichever is higher
    eng = x["disk_bytes_per_token"] / (x["disk_busy_share"] * x["s_per_token"]) / 1e9 if x["engine_gbps"] else 0
    return abs(x["disk_gbps"] - max(x["probe_gbps"], x["engine_gbps"])) < 1e-3 and abs(x["engine_gbps"] - eng) <= 0.02 * eng
print(("ok - " if all(best_ok(x) for x in (a, b, c)) else "not ok - ") + "disk_gbps = max(probe's best, engine's in-flight rate): "
      + ", ".join(f"{x['disk_gbps']} = max({x['probe_gbps']}, {x['engine_gbps']})" for x in (a, b, c)))
probe = [x["pattern"] for x in a["disk_probe"]]
print(("ok - " if any("expert reads" in x for x in probe) else "not ok - ") + "the disk probe includes the engine's own expert reads")
same = a["generated"] == b["generated"] == c["generated"]
print(("ok - " if same else "not ok - ") + f"same greedy tokens resident / streamed 1 slot / buffered 2 slots: {a['generated']} {b['generated']} {c['generated']}")
print(("ok - " if b["streamed_layers"] == 3 and b["disk_bytes_per_token"] > 0 and a["disk_bytes_per_token"] == 0 else "not ok - ")
      + f"streamed run reads from disk every token ({b['disk_bytes_per_token']:.0f} B), resident run does not ({a['disk_bytes_per_token']:.0f} B)")
print(("ok - " if a["prefill_expert_reads"] <= a["prefill_unique_experts"] and b["prefill_expert_reads"] == b["prefill_unique_experts"] else "not ok - ")
      + f"prefill reads each needed expert once per layer ({b['prefill_expert_reads']} reads for {b['prefill_unique_experts']} unique)")
PY
