#!/usr/bin/env bash
# `deltafin bench rollback --json` on the bundled model: one JSON object with the fields a speculation cost
# model reads; a rollback from the record reads no weights and takes a record of positive size; out-of-range
# options are refused naming the range.
cd "$(dirname "$0")/../.."
out=$(./deltafin bench rollback --rows 6 --accept 2 --prompt 10 --rounds 2 --threads 2 --json 2>&1)
rc=$?
[ "$rc" -eq 0 ] && echo "ok - bench rollback --json exits 0" || echo "not ok - bench rollback exited $rc: $out"
printf '%s\n' "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
need = ["rows", "accept", "prompt", "rounds", "replay_s", "replay_disk_bytes", "reeval_s", "reeval_disk_bytes",
        "record_bytes", "pass_s_record", "pass_s_no_record"]
print(("ok" if all(k in r for k in need) and r["rows"] == 6 and r["accept"] == 2 else "not ok")
      + " - all fields, options echoed")
print(("ok" if r["replay_disk_bytes"] == 0 and r["record_bytes"] > 0 and r["replay_s"] > 0 else "not ok")
      + " - replay reads no weights; the record has a size (%d bytes)" % r["record_bytes"])
' || echo "not ok - bench rollback output is not one JSON object: $out"
err=$(./deltafin bench rollback --rows 4 --accept 4 2>&1)
[ $? -eq 2 ] && printf '%s' "$err" | grep -q -- "--accept < --rows" && echo "ok - --accept >= --rows refused" ||
    echo "not ok - --accept >= --rows: $err"
