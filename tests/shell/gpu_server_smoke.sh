#!/usr/bin/env bash
# gpu_server_smoke.sh — run by tests/run-gpu.sh (`make test-gpu`), not by `make test`: the server on GPU
# $DELTAFIN_GPU answers a greedy completion with the same text as the CPU's `deltafin run`, and two requests at once
# (two slots in one pass) each get the text they get alone.
set -u
cd "$(dirname "$0")/../.."
port=$((20000 + RANDOM % 20000))
./deltafin serve -m models/default --gpu "${DELTAFIN_GPU:-0}" --host 127.0.0.1 --port "$port" --parallel 2 \
    --no-prompt-cache --spec off >/tmp/df_gpu_serve.$$.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f /tmp/df_gpu_serve.$$.log' EXIT
want=$(./deltafin run -m models/default --gpu off --spec off -p "The old man looked at the river and said" -n 16 2>/dev/null)
python3 - "$port" "$want" <<'PY'
import json, sys, time, threading, urllib.request
port, want = sys.argv[1], sys.argv[2]
for _ in range(150):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        break
    except Exception:
        time.sleep(0.2)
def complete(prompt, out, i):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                 headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0}).encode())
    out[i] = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]
one = [None]
complete("The old man looked at the river and said", one, 0)
ok = one[0] is not None and len(one[0].strip()) > 0 and one[0].strip()[:20] in want
print(("ok - " if ok else "not ok - ") + "the GPU server's greedy completion is the CPU's: %r vs %r" % (one[0], want[:60]))
two = [None, None]
ts = [threading.Thread(target=complete, args=(p, two, i)) for i, p in
      enumerate(["The old man looked at the river and said", "She opened the door"])]
[t.start() for t in ts]
[t.join() for t in ts]
alone = [None]
complete("She opened the door", alone, 0)
print(("ok - " if two[0] == one[0] and two[1] == alone[0] else "not ok - ") +
      "two requests decoded together get the text each gets alone: %r, %r" % (two[0], two[1]))
PY
