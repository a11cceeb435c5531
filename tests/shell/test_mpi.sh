#!/usr/bin/env bash
# test_mpi.sh — expert parallelism over MPI ranks on this machine (mpirun --oversubscribe): every fixture's logits
# byte-identical to one process with 1, 2, 3 and 4 ranks; a rank plan by `deltafin place --ranks` (each rank reads
# its own folder) identical too and shown by info; a rank whose folder lacks its experts, a stopped rank and a
# killed rank are errors naming the rank within 10 s; the server reports its ranks in /props, answers an in-flight
# request with an error once a rank stops, and /health says which. With the spine split over the ranks (by layers,
# --spine-split on, or auto under a budget too small for all of it) every fixture is byte-identical too, each rank
# holding only its layers' matrices; ranks that disagree on splitting are refused naming the rank. Look-ahead
# guesses reach every rank, which reads ahead of its own share.
set -u
cd "$(dirname "$0")/../.."
bin=./deltafin
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }
if ! command -v mpirun >/dev/null || ! ldd "$bin" 2>/dev/null | grep -q libmpi; then
    echo "skip - mpi: no mpirun, or $bin was built without MPI"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DELTAFIN_RANK_TIMEOUT=3
mpi() { timeout 60 mpirun --oversubscribe --bind-to none -np "$@"; }
dir=$(mktemp -d /tmp/df_mpi_XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT

# every fixture, 1 to 4 ranks (experts dealt e mod N from the model folder), one expert slot per rank at most a few;
# then with the spine split over the ranks by layers: the same bits, since each projection runs the same kernel on
# the same matrix, only on the rank holding it
for f in tests/fixtures/*/; do
    f=${f%/}
    name=$(basename "$f")
    $bin logits -m "$f" --prompt "$f/prompt.json" -o "$dir/ref.f32" --cache-slots 3 -t 1 2>"$dir/err" ||
        { bad "$name: reference: $(head -c 200 "$dir/err")"; continue; }
    same=""
    for n in 1 2 3 4; do
        if mpi "$n" $bin logits -m "$f" --prompt "$f/prompt.json" -o "$dir/n.f32" --cache-slots 3 -t 1 \
            >"$dir/out" 2>&1 && cmp -s "$dir/ref.f32" "$dir/n.f32"; then
            same="$same $n"
        else
            bad "$name with $n ranks: $(tail -c 300 "$dir/out")"
        fi
    done
    [ "$same" = " 1 2 3 4" ] && ok "$name: logits byte-identical to one process with 1, 2, 3 and 4 ranks"
    same=""
    for n in 2 4; do
        mpi "$n" $bin logits -m "$f" --prompt "$f/prompt.json" -o "$dir/n.f32" --cache-slots 3 -t 1 --spine-split on \
            >"$dir/out" 2>&1 && cmp -s "$dir/ref.f32" "$dir/n.f32" && same="$same $n" ||
            bad "$name, spine split over $n ranks: $(tail -c 300 "$dir/out")"
    done
    [ "$same" = " 2 4" ] && ok "$name: spine split over 2 and 4 ranks: logits byte-identical to one process"
done
# auto: a Kimi-Linear-shaped synthetic (real widths, 380 MiB of spine) under a 400 MiB budget, which one process
# can only stream its spine in: two ranks split it, each holding about half, with the same logits
$bin synth --family kimi-linear --layers 3 --experts 4 --vocab 512 -o "$dir/syn" >/dev/null 2>&1
pr=tests/fixtures/kl-bf16/prompt.json
$bin logits -m "$dir/syn" --prompt $pr -o "$dir/ref.f32" --mem 400M -t 1 2>"$dir/err" || bad "synth reference: $(tail -c 200 "$dir/err")"
mpi 2 $bin info -m "$dir/syn" --mem 400M >"$dir/out" 2>&1
spine() { grep "rank $1 on" "$dir/out" | sed -n 's/.*spine \([0-9.]*\) MiB.*/\1/p'; }
s0=$(spine 0) s1=$(spine 1)
grep -q "spine split by layers over the ranks" "$dir/out" && [ -n "$s0" ] && [ -n "$s1" ] &&
    [ "$(echo "$s0 < 300 && $s1 < 300 && $s0 + $s1 > 370" | bc)" = 1 ] &&
    ok "auto: under 400 MiB two ranks split the spine ($s0 + $s1 MiB)" || bad "auto split: $(grep -A3 '^ranks' "$dir/out" | head -c 500)"
mpi 2 $bin logits -m "$dir/syn" --prompt $pr -o "$dir/n.f32" --mem 400M -t 1 >"$dir/out" 2>&1 && cmp -s "$dir/ref.f32" "$dir/n.f32" &&
    ok "auto split: logits byte-identical to one process streaming its spine" || bad "auto split logits: $(tail -c 300 "$dir/out")"
timeout 60 mpirun --oversubscribe --bind-to none -np 1 $bin logits -m "$dir/syn" --prompt $pr -o "$dir/n.f32" --mem 400M -t 1 : \
    -np 1 $bin logits -m "$dir/syn" --prompt $pr -o "$dir/n.f32" --mem 400M -t 1 --spine-split off >"$dir/out" 2>&1 &&
    bad "ranks disagreeing on the spine split were accepted" ||
    { grep -q "rank 1 does not split the spine over the ranks and rank 0 does" "$dir/out" &&
        ok "ranks disagreeing on the split: $(grep -m1 'split the spine' "$dir/out" | head -c 150)" ||
        bad "split mismatch: $(head -c 400 "$dir/out")"; }
# look-ahead over the ranks: rank 0 sends its guess of each MoE layer's experts before the attention, and each
# rank reads ahead of its own share; the logits stay the same
mpi 2 $bin bench -m "$dir/syn" -n 6 --prompt 4 --cache-slots 1 -t 1 --lookahead=on --heat off --probe-gb 0.05 \
    --reruns 0 --spine-split off --json >"$dir/out" 2>"$dir/err"
la=$(tail -1 "$dir/out" | python3 -c "import json,sys; print(json.load(sys.stdin)['rank_lookahead_loads_per_token'][1])" 2>/dev/null)
[ -n "$la" ] && [ "$(echo "$la > 0" | bc)" = 1 ] && ok "look-ahead over 2 ranks: rank 1 read $la guessed experts per token" ||
    bad "look-ahead over ranks: $(tail -c 300 "$dir/out") $(tail -c 200 "$dir/err")"
$bin logits -m "$dir/syn" --prompt $pr -o "$dir/ref.f32" --cache-slots 1 -t 1 --lookahead=on 2>/dev/null
mpi 2 $bin logits -m "$dir/syn" --prompt $pr -o "$dir/n.f32" --cache-slots 1 -t 1 --lookahead=on >"$dir/out" 2>&1 &&
    cmp -s "$dir/ref.f32" "$dir/n.f32" && ok "look-ahead over 2 ranks: logits byte-identical to one process" ||
    bad "look-ahead over ranks, logits: $(tail -c 300 "$dir/out")"
rm -rf "$dir/syn"

# a rank plan: each rank's experts in its own folder; heat from a run first, so the plan spreads by it
m=$dir/m
mkdir "$m"
f=tests/fixtures/k3-tiny
ln -s "$PWD/$f"/{config.json,model.safetensors} "$m/"
$bin logits -m "$m" --prompt "$f/prompt.json" -o "$dir/ref.f32" --heat on 2>/dev/null
if $bin place -m "$m" --ranks 3 --to "$dir/r0,$dir/r1,$dir/r2" >"$dir/out" 2>&1 && [ -s "$m/.deltafin/ranks" ] &&
    [ -s "$dir/r2/deltafin-experts.bin" ]; then
    ok "place --ranks 3: $(tail -1 "$dir/out")"
else
    bad "place --ranks 3: $(tail -3 "$dir/out")"
fi
mpi 3 $bin logits -m "$m" --prompt "$f/prompt.json" -o "$dir/p.f32" >"$dir/out" 2>&1 && cmp -s "$dir/ref.f32" "$dir/p.f32" &&
    ok "3 ranks on the rank plan: logits identical" || bad "3 ranks on the rank plan: $(tail -c 300 "$dir/out")"
mpi 3 $bin info -m "$m" >"$dir/out" 2>&1
grep -q "^ranks: 3 (expert parallel" "$dir/out" && grep -q "rank 2 on .* reads $dir/r2" "$dir/out" &&
    ok "info shows the ranks: $(grep 'rank 1 on' "$dir/out" | head -c 150)" || bad "info: $(tail -c 400 "$dir/out")"
# a rank reads only its own folder: rank 1's folder moved away and a copy without its data is an error naming it
mv "$dir/r1" "$dir/r1x"
t0=$SECONDS
if mpi 3 $bin logits -m "$m" --prompt "$f/prompt.json" -o "$dir/x.f32" >"$dir/out" 2>&1; then
    bad "a rank without its folder was not noticed"
else
    grep -q "rank 1 .*expert folder $dir/r1 lacks expert" "$dir/out" && [ $((SECONDS - t0)) -le 10 ] &&
        ok "a rank whose folder lacks its experts: $(grep -m1 lacks "$dir/out" | head -c 160)" ||
        bad "missing folder: $(head -c 400 "$dir/out")"
fi
mv "$dir/r1x" "$dir/r1"
truncate -s 4096 "$dir/r2/deltafin-experts.bin"
mpi 3 $bin logits -m "$m" --prompt "$f/prompt.json" -o "$dir/x.f32" >"$dir/out" 2>&1 && bad "a short folder accepted" ||
    { grep -q "rank 2 .*$dir/r2/deltafin-experts.bin holds 4096 bytes" "$dir/out" &&
        ok "a rank with a short expert file: named" || bad "short file: $(head -c 400 "$dir/out")"; }
# a plan for another rank count
mpi 2 $bin logits -m "$m" --prompt "$f/prompt.json" -o "$dir/x.f32" >"$dir/out" 2>&1 && bad "a 3-rank plan ran on 2" ||
    { grep -q "the plan is for 3 ranks, the job has 2" "$dir/out" && ok "a plan for 3 ranks refused on 2" ||
        bad "rank count: $(head -c 300 "$dir/out")"; }
rm -f "$m/.deltafin/ranks"

# rank_of PATTERN RANK: the pid of our process of that command line with that MPI rank
rank_of() {
    for p in $(pgrep -f "$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p" && return
    done
}
# a long run slowed by the delay injector, so that a rank can be stopped or killed in the middle
long() { DELTAFIN_NET_DELAY_US=2000 mpi "$@" $bin run -m models/default --tokens 1,2,3 -n 480 -t 1 --heat off; }
long 2 >"$dir/o" 2>"$dir/e" &
job=$!
pids+=($job)
for _ in $(seq 50); do w=$(rank_of "run -m models/default --tokens 1,2,3 -n 480" 1); [ -n "$w" ] && break; sleep 0.1; done
sleep 1
t0=$(date +%s.%N)
[ -n "$w" ] && kill -STOP "$w"
wait $job
rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$rc" != 0 ] && grep -q "rank 1 (.*) has sent nothing for" "$dir/e" && [ "$(echo "$dt < 10" | bc)" = 1 ] &&
    ok "a stopped rank: error after $dt s: $(grep -m1 'has sent nothing' "$dir/e" | head -c 140)" ||
    bad "stopped rank (rc $rc, $dt s): $(head -c 400 "$dir/e")"
long 3 >"$dir/o" 2>"$dir/e" &
job=$!
pids+=($job)
for _ in $(seq 50); do w=$(rank_of "run -m models/default --tokens 1,2,3 -n 480" 2); [ -n "$w" ] && break; sleep 0.1; done
sleep 1
t0=$(date +%s.%N)
[ -n "$w" ] && kill -9 "$w"
wait $job
rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$rc" != 0 ] && grep -q "rank 2" "$dir/e" && [ "$(echo "$dt < 10" | bc)" = 1 ] &&
    ok "a killed rank: the job ends after $dt s naming rank 2" || bad "killed rank (rc $rc, $dt s): $(head -c 400 "$dir/e")"

# the server: /props lists the ranks; a stopped rank fails the request in flight and /health names it
port=$((20000 + RANDOM % 20000))
DELTAFIN_NET_DELAY_US=2000 timeout 120 mpirun --enable-recovery --oversubscribe --bind-to none -np 2 \
    $bin serve -m models/default --port "$port" -t 1 --heat off --no-prompt-cache >"$dir/so" 2>"$dir/se" &
srvjob=$!
pids+=($srvjob)
python3 - "$port" "$dir" <<'EOF'
import json, sys, time, urllib.request, urllib.error, threading, os, subprocess
port, d = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"
def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=30) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read() or b"{}")
def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read() or b"{}")
for _ in range(300):
    try:
        st, props = get("/props"); break
    except Exception: time.sleep(0.1)
else:
    print("not ok - server did not start"); sys.exit(0)
ok = st == 200 and props.get("n_ranks") == 2 and len(props["ranks"]) == 2 and props["ranks"][1]["experts_held"] > 0
print(("ok" if ok else "not ok") + f" - /props: {props.get('n_ranks')} ranks, rank 1 holds "
      f"{props.get('ranks', [{}, {}])[1].get('experts_held')} experts")
st, r = post({"prompt": "The old man", "max_tokens": 4, "temperature": 0})
print(("ok" if st == 200 else "not ok") + f" - a completion over 2 ranks: {st}")
res = {}
def slow(): res["r"] = post({"prompt": "The old man", "max_tokens": 400, "temperature": 0})
t = threading.Thread(target=slow); t.start()
time.sleep(1.0)
out = subprocess.run(["pgrep", "-f", f"serve -m models/default --port {port}"], capture_output=True, text=True).stdout.split()
worker = [p for p in out if "OMPI_COMM_WORLD_RANK=1" in open(f"/proc/{p}/environ", "rb").read().decode(errors="replace").split("\0")]
t0 = time.time()
if worker: os.kill(int(worker[0]), 19)
t.join(30)
st, body = res.get("r", (0, {}))
dt = time.time() - t0
msg = json.dumps(body)[:200]
print(("ok" if st >= 500 and "rank 1" in msg and dt < 10 else "not ok") + f" - in-flight request after a stopped rank: {st} in {dt:.1f} s: {msg}")
st, h = get("/health")
print(("ok" if st == 503 and "rank 1" in h.get("error", "") else "not ok") + f" - /health: {st} {json.dumps(h)[:160]}")
if worker: os.kill(int(worker[0]), 9)
EOF
kill "$srvjob" 2>/dev/null
wait "$srvjob" 2>/dev/null
# the job made again serves as before: nothing it needs was lost on disk (heat, plan, prompt cache)
timeout 120 mpirun --enable-recovery --oversubscribe --bind-to none -np 2 \
    $bin serve -m models/default --port $((port + 1)) -t 1 --heat off --no-prompt-cache >"$dir/so" 2>"$dir/se" &
srvjob=$!
pids+=($srvjob)
python3 - $((port + 1)) <<'EOF'
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(300):
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200: break
    except Exception: time.sleep(0.1)
req = urllib.request.Request(base + "/v1/completions", json.dumps({"prompt": "The old man", "max_tokens": 4,
                             "temperature": 0}).encode(), {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r: st = r.status
except Exception as e: st = str(e)
print(("ok" if st == 200 else "not ok") + f" - the 2-rank server started again after the lost rank answers: {st}")
EOF
kill "$srvjob" 2>/dev/null
wait "$srvjob" 2>/dev/null
true
