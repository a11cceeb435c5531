#!/usr/bin/env bash
# test_mpi_netns.sh — scripts/mpi-netns.sh end to end on a fixture: 2 ranks in their own namespaces, memory cgroups
# and throttled loop devices give logits byte-identical to one plain process, so does 1 rank (whose temporary
# placement is removed again); the links and each rank's own disk carried the run; a link cut in the middle of a
# run is an error naming the rank behind it; a failing command fails the script; after every run no namespace,
# link, loop device, cgroup or work folder is left. Skipped where the machine cannot (not root, no cgroup v1 blkio,
# no namespaces, loop devices or tbf), or with DELTAFIN_TEST_NETNS=0.
set -u
cd "$(dirname "$0")/../.." || exit 1
bin=./deltafin
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }
skip() { echo "skip - mpi-netns: $*"; exit 0; }
[ "${DELTAFIN_TEST_NETNS:-1}" = 0 ] && skip "DELTAFIN_TEST_NETNS=0"
[ "$(id -u)" = 0 ] || skip "not root"
command -v mpirun >/dev/null && ldd "$bin" 2>/dev/null | grep -q libmpi || skip "no mpirun, or $bin without MPI"
for t in ip tc losetup mkfs.ext4 nsenter flock lsblk; do command -v "$t" >/dev/null || skip "no $t"; done
[ -d /sys/fs/cgroup/blkio ] || skip "no cgroup v1 blkio"
probe=dfprobe$$
if ! ip netns add "$probe" 2>/dev/null; then skip "cannot make a network namespace"; fi
ip netns exec "$probe" ip link add dfpa type veth peer name dfpb 2>/dev/null &&
    ip netns exec "$probe" tc qdisc add dev dfpa root tbf rate 1gbit burst 1mb latency 50ms 2>/dev/null
have_tbf=$?
ip netns del "$probe"
[ "$have_tbf" = 0 ] || skip "no veth or tbf"
losetup -f >/dev/null 2>&1 || skip "no free loop device"

dir=$(mktemp -d /tmp/df_netns_XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp -r tests/fixtures/kl-mxfp4 "$dir/m"
m=$dir/m
prompt=tests/fixtures/kl-mxfp4/prompt.json
"$bin" logits -m "$m" --prompt "$prompt" -o "$dir/ref.f32" --cache-slots 3 -t 1 2>/dev/null || bad "reference logits"

# another run of the script holds the machine-wide names: wait for it (at most a minute)
netns() {
    for _ in $(seq 1 30); do
        WORK=$dir/w TIMEOUT=60 IMAGE_GB=1 timeout 120 scripts/mpi-netns.sh "$@" 2>"$dir/err"
        local rc=$?
        grep -q "another mpi-netns.sh run holds" "$dir/err" || return "$rc"
        sleep 2
    done
    return 1
}
left() {   # what a run could leave behind
    ip netns list | grep -E '^dfr[0-9]' || true
    ip link show dfbr0 2>/dev/null | head -1
    losetup -a | grep -F "$dir/w" || true
    ls -d /sys/fs/cgroup/blkio/dfrank* 2>/dev/null || true
    [ -e "$dir/w" ] && echo "$dir/w"
}

if netns "$m" 2 1gbit 2 50 -- logits --prompt "$prompt" -o "$dir/two.f32" --cache-slots 3 -t 1 &&
    cmp -s "$dir/ref.f32" "$dir/two.f32"; then
    ok "mpi-netns: 2 ranks in namespaces, cgroups and throttled loop devices give one process's logits"
else
    bad "mpi-netns: 2 ranks: $(tail -12 "$dir/err")"
fi
l1=$(awk '/^mpi-netns: rank 1: link/ { print $7, $16 }' "$dir/err")
if [ -n "$l1" ] && [ "${l1% *}" -gt 0 ] && [ "${l1#* }" -gt 0 ]; then
    ok "mpi-netns: rank 1's link and its own throttled disk carried the run ($l1 bytes)"
else
    bad "mpi-netns: rank 1's link or disk carried nothing: $(grep '^mpi-netns:' "$dir/err")"
fi
[ -z "$(left)" ] && ok "mpi-netns: nothing left after a run" || bad "mpi-netns: left after a run: $(left)"

if netns "$m" 1 10gbit 2 50 -- logits --prompt "$prompt" -o "$dir/one.f32" --cache-slots 3 -t 1 &&
   cmp -s "$dir/ref.f32" "$dir/one.f32" && [ ! -e "$m/.deltafin/placement" ]; then
    ok "mpi-netns: 1 rank gives the same logits and its placement is removed"
else
    bad "mpi-netns: 1 rank: $(tail -3 "$dir/err"); placement: $(ls "$m/.deltafin")"
fi

# a cut link: rank 1's end of the bridge taken down in the middle of a run
DELAY_US=5000 netns "$m" 2 1gbit 2 50 -- run --tokens 1,2,3 -n 400 -t 1 --heat off >"$dir/cut.out" &
cut=$!
for _ in $(seq 300); do [ -e "$dir/w/rank1.pid" ] && break; sleep 0.1; done
sleep 2
ip link set dfv1 down 2>/dev/null
t0=$SECONDS
for _ in $(seq 200); do grep -q "has sent nothing" "$dir/err" 2>/dev/null && break; sleep 0.1; done
dt=$((SECONDS - t0))
ip link set dfv1 up 2>/dev/null   # the link back, so that mpirun hears its daemon and ends the job now
wait "$cut"
rc=$?
[ "$rc" != 0 ] && grep -q "rank 1 (.*) has sent nothing for" "$dir/err" && [ "$dt" -le 10 ] &&
    ok "mpi-netns: a link cut mid-run: an error naming rank 1 after ${dt} s" ||
    bad "mpi-netns: cut link (rc $rc, ${dt} s): $(grep -v '^mpi-netns:' "$dir/err" | tail -5)"
[ -z "$(left)" ] && ok "mpi-netns: nothing left after a cut link" || bad "mpi-netns: left after a cut link: $(left)"

if netns "$m" 2 10gbit 2 50 -- logits --no-such-option; then
    bad "mpi-netns: a failing command passed"
else
    ok "mpi-netns: a failing command fails the script"
fi
[ -z "$(left)" ] && ok "mpi-netns: nothing left after a failure" || bad "mpi-netns: left after a failure: $(left)"
