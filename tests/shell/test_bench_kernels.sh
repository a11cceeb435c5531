#!/usr/bin/env bash
# `deltafin bench kernels --quick --json`: one JSON object per line with the fields docs/PERFORMANCE.md
# relies on, a positive bandwidth and ratio = weight_gbps / mem_gbps; `bench` without `kernels` goes to
# the decode benchmark's entry point.
cd "$(dirname "$0")/../.."
out=$(./deltafin bench kernels --quick --json --threads 2 2>&1)
rc=$?
[ "$rc" -eq 0 ] && echo "ok - bench kernels --quick --json exits 0" || echo "not ok - bench kernels exited $rc: $out"
printf '%s\n' "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
mem = [r for r in rows if r["kernel"] == "memread"]
mm = [r for r in rows if r["kernel"] in ("matvec", "matmul")]
need = ["kernel", "dtype", "isa", "rows", "cols", "batch", "weight_gbps", "mem_gbps", "ratio"]
print(("ok" if len(mem) == 1 and mem[0]["mem_gbps"] > 0 else "not ok") + " - memory bandwidth line")
print(("ok" if len(mm) >= 12 and all(all(k in r for k in need) for r in mm) else "not ok")
      + " - %d kernel lines with all fields" % len(mm))
print(("ok" if all(abs(r["ratio"] - r["weight_gbps"] / r["mem_gbps"]) < 1e-3 and r["weight_gbps"] > 0 for r in mm)
       else "not ok") + " - ratio = weight_gbps / mem_gbps")
print(("ok" if {r["dtype"] for r in mm} >= {"MXFP4", "BF16", "I8"} and {r["batch"] for r in mm} == {1, 16}
       else "not ok") + " - MXFP4, BF16 and I8 at batch 1 and 16")
' || echo "not ok - bench kernels output is not JSON lines"
./deltafin bench --threads 2 >/dev/null 2>&1
[ $? -eq 2 ] && echo "ok - plain bench reaches the decode benchmark hook" || echo "not ok - plain bench"
