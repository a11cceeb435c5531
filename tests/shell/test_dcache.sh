#!/usr/bin/env bash
# test_dcache.sh — the expert disk cache never serves what it did not verify: an entry with flipped bytes is
# refused without --remote, fetched again with it, and never copied into a shard by fetch --all; a cache
# that cannot take more (full disk, reserve, size cap) does not fail the request; temp files another host
# or container is writing (held by a lock) survive cleanup while abandoned ones go.
set -u
cd "$(dirname "$0")/../.."
BIN=${DELTAFIN_BIN:-build/asan/deltafin}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
T=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; [ -n "${KEEP:-}" ] || rm -rf "$T"; }
trap cleanup EXIT
ok() { if [ "$1" -eq 0 ]; then echo "ok - $2"; else echo "not ok - $2"; fi; }
F=kl-mxfp4
python3 tests/remote/server.py --root tests/fixtures --port-file "$T/port" >"$T/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 400); do [ -s "$T/port" ] && break; sleep 0.05; done
U="http://127.0.0.1:$(cat "$T/port")/org/m/resolve/main/$F"
logits() { ./deltafin logits --prompt "tests/fixtures/$F/prompt.json" -m "$1" -o "$2" "${@:3}" 2>"$2.err"; }
flip() {   # entry file: flips one byte in the middle of its data (not the trailer)
    python3 - "$1" <<'PY'
import os, sys
p = sys.argv[1]
n = os.path.getsize(p)
with open(p, "r+b") as f:
    pos = (n - 16) // 2 + 17
    f.seek(pos); b = f.read(1); f.seek(pos); f.write(bytes([b[0] ^ 0x55]))
PY
}
logits tests/fixtures/$F "$T/ref.f32" || echo "not ok - reference logits"

"$BIN" fetch --from "$U" -m "$T/m" --layers 1-3 >/dev/null 2>&1
C=$T/m/.deltafin/cache/model.safetensors
E=$(ls "$C" | sort -t- -k1n | sed -n 5p)
cp "$C/$E" "$T/good-entry"
flip "$C/$E"
logits "$T/m" "$T/a.f32"
rc=$?
[ $rc -ne 0 ] && grep -q "corrupt (checksum mismatch).*--remote" "$T/a.f32.err"
ok $? "a corrupt cache entry without --remote: a clear error, no logits ($(grep -o 'cached .*corrupt[^;]*' "$T/a.f32.err" | head -1))"
logits "$T/m" "$T/b.f32" --remote "$U" && cmp -s "$T/b.f32" "$T/ref.f32" && grep -q "fetching it again" "$T/b.f32.err"
ok $? "with --remote the corrupt entry is fetched again: logits identical to the local install"
cmp -s "$C/$E" "$T/good-entry" && logits "$T/m" "$T/c.f32" && cmp -s "$T/c.f32" "$T/ref.f32"
ok $? "the refetched entry replaced the corrupt one (byte-identical; later runs need no --remote)"

flip "$C/$E"
"$BIN" fetch --from "$U" -m "$T/m" --all >"$T/all.out" 2>&1
rc=$?
[ $rc -eq 0 ] && cmp -s "$T/m/model.safetensors" "tests/fixtures/$F/model.safetensors" && grep -q "corrupt" "$T/all.out"
ok $? "fetch --all does not copy a corrupt entry into the shard: it fetches that span again (shard byte-identical)"

# a cache that cannot take the bytes: the request still succeeds, one warning
"$BIN" fetch --from "$U" -m "$T/r" --spine >/dev/null 2>&1
DELTAFIN_CACHE_RESERVE_GB=100000000 logits "$T/r" "$T/r.f32" --remote "$U"
rc=$?
[ $rc -eq 0 ] && cmp -s "$T/r.f32" "$T/ref.f32" && [ "$(grep -c "serving without caching" "$T/r.f32.err")" -eq 1 ] \
    && [ -z "$(ls -A "$T/r/.deltafin/cache/model.safetensors" 2>/dev/null)" ]
ok $? "free-space reserve not met: logits still identical, warned once, nothing cached"
# (the logits go through a pipe, which the file-size limit does not cover)
(trap '' XFSZ; ulimit -f 2; exec ./deltafin logits --prompt "tests/fixtures/$F/prompt.json" -m "$T/r" -o /dev/stdout \
    --remote "$U") 2>"$T/d.err" | cat >"$T/d.f32"
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] && cmp -s "$T/d.f32" "$T/ref.f32" && [ "$(grep -c "disk full.*serving without caching" "$T/d.err")" -eq 1 ]
ok $? "disk full while caching: the request succeeds with the fetched bytes, warned once"
DELTAFIN_CACHE_MAX_GB=0.00002 logits "$T/r" "$T/cap.f32" --remote "$U"
rc=$?
used=$(find "$T/r/.deltafin/cache" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
n=$(find "$T/r/.deltafin/cache" -type f | wc -l)
[ $rc -eq 0 ] && cmp -s "$T/cap.f32" "$T/ref.f32" && [ "$used" -le 20000 ] && [ "$n" -ge 1 ]
ok $? "size cap of 20 kB: logits identical, the cache holds $n entries, $used bytes (least recently used evicted)"

# temp files: one held by a live writer (lock) stays even though the pid in its name is dead; unheld ones go
D=$T/r/.deltafin/cache/model.safetensors
mkdir -p "$D"
: >"$D/.tmp-999999-held"; : >"$D/.tmp-$$-abandoned"
flock "$D/.tmp-999999-held" sleep 60 &
PIDS+=($!)
sleep 0.3
"$BIN" info -m "$T/r" >/dev/null 2>&1
"$BIN" fetch --from "$U" -m "$T/r" --layers 1 >/dev/null 2>&1
[ -e "$D/.tmp-999999-held" ] && [ ! -e "$D/.tmp-$$-abandoned" ]
ok $? "cleanup keeps a temp file another process holds (its pid means nothing here) and removes an abandoned one"

# fetch --all checks whole shards against the SHA-256 the hub publishes (ETag / X-Linked-Etag of LFS files)
sha=$(sha256sum "tests/fixtures/$F/model.safetensors" | cut -c1-64)
"$BIN" fetch --from "$U" -m "$T/v" --all >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "\"sha256\":\"$sha\",\"verified\":true" "$T/v/.deltafin/install.json"
ok $? "fetch --all verifies the shard against the ETag SHA-256 and records it verified"
"$BIN" info -m "$T/v" 2>&1 | grep -q "^local: shards: 1 complete (1 checked against the remote's SHA-256)"
ok $? "info says the complete shard was checked against the remote's SHA-256"
python3 tests/remote/server.py --root tests/fixtures --port-file "$T/rport" --redirect >"$T/rserver.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 400); do [ -s "$T/rport" ] && break; sleep 0.05; done
RU="http://127.0.0.1:$(cat "$T/rport")/org/m/resolve/main/$F"
"$BIN" fetch --from "$RU" -m "$T/v2" --all >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "\"sha256\":\"$sha\",\"verified\":true" "$T/v2/.deltafin/install.json"
ok $? "through a hub-style redirect the hash comes from X-Linked-Etag, and the shard verifies"
H=${U%/org/*}
curl -s "$H/_fault?mode=etag&count=1&match=$F/model.safetensors&arg=$(printf '0%.0s' $(seq 64))" >/dev/null
"$BIN" fetch --from "$U" -m "$T/v3" --all >"$T/v3.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "SHA-256 after fetch --all is $sha, the remote publishes 0000" "$T/v3.out" \
    && grep -q '"state":"pending"' "$T/v3/.deltafin/install.json"
ok $? "a shard that does not match the published SHA-256 is not marked complete: reset to pending, clear error"
"$BIN" fetch --from "$U" -m "$T/v3" --all >/dev/null 2>&1 && cmp -s "$T/v3/model.safetensors" "tests/fixtures/$F/model.safetensors" \
    && grep -q '"verified":true' "$T/v3/.deltafin/install.json"
ok $? "the rerun fetches it again and verifies"

# a server maps a shard; fetch replaces that shard with one of another size: the mapping stays readable
"$BIN" fetch --from "$U" -m "$T/sb" --spine >/dev/null 2>&1
python3 - "$T/sb" <<'PY'
import json, sys
p = sys.argv[1] + "/.deltafin/install.json"
m = json.load(open(p))
m["shards"][0]["state"] = "pending"          # an interrupted install whose file is the wrong size
json.dump(m, open(p, "w"))
with open(sys.argv[1] + "/model.safetensors", "ab") as f:
    f.write(bytes(1 << 20))
PY
python3 - "$T/sb/model.safetensors" "$BIN" "$U" "$T/sb" <<'PY' >"$T/sb.out" 2>&1
import mmap, subprocess, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
n = len(m)
rc = subprocess.call([sys.argv[2], "fetch", "--from", sys.argv[3], "-m", sys.argv[4], "--spine"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
tail = m[n - 4096:n]                          # SIGBUS here if the file was shrunk in place
print("read", len(tail), "rc", rc)
PY
rc=$?
[ $rc -eq 0 ] && grep -q "read 4096 rc 0" "$T/sb.out" && [ "$(stat -c %s "$T/sb/model.safetensors")" -eq "$(stat -c %s "tests/fixtures/$F/model.safetensors")" ]
ok $? "fetch resizing a shard a process maps: a new file is renamed over it, the mapping never faults (SIGBUS)"
