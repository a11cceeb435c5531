#!/usr/bin/env bash
# test_fetch.sh — `deltafin fetch` and streaming from a partial install, against the test server
# (tests/remote/server.py, 127.0.0.1 only) serving tests/fixtures in the hub layout: logits identical to a
# local install for every fixture, a clear error instead of zeros without --remote, --dry-run / --min-free /
# --layers / --all, kill -9 mid-fetch then a rerun that completes byte-exact, a permanent fault, a disk-full
# cache write, and a hub-style redirect costing one extra request per file, not per expert.
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
REL=./deltafin   # the fixture loop's logits runs (ASan start-up costs ~1 s per process here)
# tmpfs when there is one: the cache's fsyncs cost nothing there (and O_DIRECT falls back to buffered reads)
T=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
ok() { if [ "$1" -eq 0 ]; then echo "ok - $2"; else echo "not ok - $2"; fi; }

start_server() {   # name, extra args...: runs in this shell so cleanup can stop it
    local name=$1; shift
    python3 tests/remote/server.py --root tests/fixtures --port-file "$T/$name.port" "$@" >"$T/$name.log" 2>&1 &
    PIDS+=($!)
}
wait_server() { for _ in $(seq 400); do [ -s "$T/$1.port" ] && break; sleep 0.05; done; echo "http://127.0.0.1:$(cat "$T/$1.port")"; }
start_server main
start_server redir --redirect
H=$(wait_server main)
U=$H/org/m/resolve/main
ctl() { curl -s "$H/$1" >/dev/null; }
stat() { curl -s "$H/_stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
# The last progress line of a fetch's stderr (in $last) reports as many bytes done as planned, at 100%.
progress_full() {
    last=$(grep '^fetch: ' "$1" | tail -n 1)
    [[ "$last" =~ ^fetch:\ ([0-9]+)\ of\ ([0-9]+)\ bytes\ \(100%\) ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]
}
logits() { "${LBIN:-$BIN}" logits --prompt "tests/fixtures/$1/prompt.json" -o "$3" -m "$2" "${@:4}" 2>"$3.err"; }

echo "# t=$SECONDS"
# 1. every fixture: spine only, then logits streaming the experts equal the local install's
for d in tests/fixtures/*/; do
    f=$(basename "$d")
    [ -f "$d/prompt.json" ] || continue
    "$BIN" fetch --from "$U/$f" -m "$T/$f" --spine >"$T/$f.fetch" 2>&1
    rc=$?
    LBIN=$REL logits "$f" "$d" "$T/$f.local.f32"
    LBIN=$REL logits "$f" "$T/$f" "$T/$f.remote.f32" --remote "$U/$f"
    rc2=$?
    cmp -s "$T/$f.local.f32" "$T/$f.remote.f32"
    ok $((rc + rc2 + $?)) "$f: spine fetch + streamed experts give logits identical to the local install"
done

echo "# t=$SECONDS"
# 2. a partial install without --remote: a clear error naming the expert, never zeros
F=kl-mxfp4
"$BIN" fetch --from "$U/$F" -m "$T/p" --spine >/dev/null 2>&1
"$BIN" info -m "$T/p" >"$T/info.out" 2>&1
grep -q "^local: .*GiB of shards on disk" "$T/info.out" && ! grep -q "(100.0%)" "$T/info.out"
ok $? "info says how much of a partial install is local"
logits $F "$T/p" "$T/p.f32"
rc=$?
[ $rc -ne 0 ] && grep -q "expert .* of layer .* is not on local disk.*--remote" "$T/p.f32.err"
ok $? "partial install without --remote: error names the expert and suggests --remote"
want=$($REL run -m "tests/fixtures/$F" --tokens 1,2,3 -n 4 2>/dev/null)
got=$("$BIN" run -m "$T/p" --tokens 1,2,3 -n 4 2>"$T/p.run.err")
[ -n "$want" ] && [ "$got" = "$want" ] && grep -q "partial install: missing experts stream from $U/$F" "$T/p.run.err"
ok $? "run on a partial install streams from the source fetch recorded ($got vs $want)"

echo "# t=$SECONDS"
# 3. --dry-run writes nothing; --min-free refuses
"$BIN" fetch --from "$U/$F" -m "$T/dry" --dry-run >"$T/dry.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "^would fetch: .*spine of 1 to fetch" "$T/dry.out" && grep -q "^disk: needs" "$T/dry.out" \
    && [ ! -e "$T/dry/model.safetensors" ]
ok $? "--dry-run prints the plan and the disk it needs, writes nothing"
"$BIN" fetch --from "$U/$F" -m "$T/full" --min-free 1000000 >"$T/mf.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "less than --min-free" "$T/mf.out" && [ ! -e "$T/full/model.safetensors" ]
ok $? "--min-free refuses to start when the disk would be left too empty"

echo "# t=$SECONDS"
# 4. --layers caches just those layers' experts; --all completes the shard byte for byte
ctl _reset
"$BIN" fetch --from "$U/$F" -m "$T/l" --layers 2 >/dev/null 2>&1
n2=$(ls "$T/l/.deltafin/cache/model.safetensors" | wc -l)
"$BIN" fetch --from "$U/$F" -m "$T/l" --layers 1-3 >/dev/null 2>&1
n=$(ls "$T/l/.deltafin/cache/model.safetensors" | wc -l)
[ "$n2" -eq 8 ] && [ "$n" -eq 24 ]
ok $? "--layers 2 caches that layer's 8 experts, --layers 1-3 the other 16 ($n2, $n)"
logits $F "$T/l" "$T/l.f32" && cmp -s "$T/l.f32" "$T/$F.local.f32"
ok $? "every expert cached: logits without --remote identical"
"$BIN" fetch --from "$U/$F" -m "$T/l" --all >/dev/null 2>"$T/l.all.err"
rc=$?
progress_full "$T/l.all.err"
ok $? "--all with every expert already cached: progress ends at exactly 100% ($last)"
"$BIN" fetch --from "$U/$F" -m "$T/l2" --layers 2 >/dev/null 2>&1
"$BIN" fetch --from "$U/$F" -m "$T/l2" --all >/dev/null 2>"$T/l2.all.err"
progress_full "$T/l2.all.err" && [ "${BASH_REMATCH[2]}" -gt 0 ] \
    && cmp -s "$T/l2/model.safetensors" "tests/fixtures/$F/model.safetensors"
ok $? "--all with one layer's experts cached: progress counts only what is downloaded ($last)"
cmp -s "$T/l/model.safetensors" "tests/fixtures/$F/model.safetensors" && [ $rc -eq 0 ] \
    && grep -q '"state":"complete"' "$T/l/.deltafin/install.json" && [ ! -e "$T/l/.deltafin/cache/model.safetensors" ]
ok $? "--all: shard identical to the original, marked complete, cache entries dropped"

echo "# t=$SECONDS"
# 5. kill -9 in the middle of --all (slow server), rerun: complete and byte-exact, no temp files
ctl "_fault?mode=slow&count=1000&arg=0.15&match=$F/model.safetensors"
"$BIN" fetch --from "$U/$F" -m "$T/k" --all --jobs 2 >/dev/null 2>&1 &
kp=$!
sleep 1
kill -9 $kp 2>/dev/null
wait $kp 2>/dev/null
ctl _reset
st=$(grep -o '"state":"[a-z]*"' "$T/k/.deltafin/install.json" 2>/dev/null)
"$BIN" fetch --from "$U/$F" -m "$T/k" --all >/dev/null 2>"$T/k.err"
rc=$?
cmp -s "$T/k/model.safetensors" "tests/fixtures/$F/model.safetensors" && [ $rc -eq 0 ] \
    && [ -z "$(find "$T/k" -name '.tmp-*')" ] && [ "$st" != '"state":"complete"' ]
ok $? "kill -9 during fetch --all (state then: ${st:-none}), rerun completes byte-exact"
progress_full "$T/k.err"
ok $? "the rerun's progress counts only what it downloads ($last)"
ctl "_fault?mode=slow&count=1000&arg=0.2&match=$F/model.safetensors"
"$BIN" fetch --from "$U/$F" -m "$T/k2" --layers 1-3 --jobs 2 >/dev/null 2>&1 &
kp=$!
sleep 1.2
kill -9 $kp 2>/dev/null
wait $kp 2>/dev/null
ctl _reset
"$BIN" fetch --from "$U/$F" -m "$T/k2" --layers 1-3 >/dev/null 2>&1 && logits $F "$T/k2" "$T/k2.f32" \
    && cmp -s "$T/k2.f32" "$T/$F.local.f32" && [ -z "$(find "$T/k2" -name '.tmp-*')" ]
ok $? "kill -9 during fetch --layers, rerun: consistent cache, identical logits"

echo "# t=$SECONDS"
# 6. a permanent fault stops with the URL named; a disk-full cache write leaves no entry
ctl "_fault?mode=200&count=1&match=$F/model.safetensors"
"$BIN" fetch --from "$U/$F" -m "$T/f" --spine >"$T/f.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "instead of 206" "$T/f.out" && grep -q "$U/$F/model.safetensors" "$T/f.out"
ok $? "server ignoring ranges: fetch fails naming the URL"
ctl _reset
"$BIN" fetch --from "$U/$F" -m "$T/f" --spine >/dev/null 2>&1
ok $? "rerun after the fault completes"
(trap '' XFSZ; ulimit -f 4; exec "$BIN" fetch --from "$U/$F" -m "$T/f" --layers 1) >"$T/df.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "disk full" "$T/df.out" && [ -z "$(ls -A "$T/f/.deltafin/cache/model.safetensors" 2>/dev/null)" ]
ok $? "disk full while caching an expert: clear error, no partial entry"
logits $F "$T/f" "$T/f.f32" --remote "$U/$F" && cmp -s "$T/f.f32" "$T/$F.local.f32"
ok $? "after the disk-full failure the install still streams correctly"

echo "# t=$SECONDS"
# 7. hub-style redirects: followed, and remembered per file (one request per expert afterwards)
R=$(wait_server redir)
"$BIN" fetch --from "$R/org/m/resolve/main/$F" -m "$T/r" --spine >/dev/null 2>&1
curl -s "$R/_reset" >/dev/null
logits $F "$T/r" "$T/r.f32" --remote "$R/org/m/resolve/main/$F"
rc=$?
reqs=$(curl -s "$R/_stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['range_requests'])")
cmp -s "$T/r.f32" "$T/$F.local.f32" && [ $rc -eq 0 ] && [ "$reqs" -le 32 ]
ok $? "redirected repository: identical logits, $reqs range requests for 24 experts (at most the first parallel batch of 8 goes through the redirect)"
