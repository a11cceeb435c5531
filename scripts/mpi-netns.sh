#!/usr/bin/env bash
# mpi-netns.sh — N emulated machines on this one: each MPI rank in a network namespace of its own (veth pairs on a
# bridge, both directions rate-limited with tbf), in a memory cgroup of its own (scripts/with-mem-limit.sh), reading
# its experts from a loop device of its own throttled with blkio; link latency comes from the comm layer's delay
# injector (DELTAFIN_NET_DELAY_US), since these kernels lack netem. Needs root, iproute2, losetup, mkfs.ext4,
# cgroup v1 blkio and an Open MPI mpirun.
#
#   sudo scripts/mpi-netns.sh MODEL_DIR N RATE MEM_GB DISK_MB_S -- bench -n 8 --json ...
#
# RATE: tbf rate per link (1gbit, 10gbit). The script places MODEL_DIR's experts for N ranks (deltafin place
# --ranks N, by its saved heat; for N = 1 a plain placement, put back as it was on exit) on the N loop devices,
# starts `mpirun -np N` over the namespaces and runs the deltafin command given with `-m MODEL_DIR --expert-dirs`
# (the mount points) appended. WORK (default /var/tmp/df-netns) holds the images; DELAY_US (default 50) the emulated
# latency; IMAGE_GB (default: the model folder's size x 1.2 / N + 2) each image's size (sparse); TIMEOUT (default
# 1800) bounds the mpirun, in seconds. Everything made here (namespaces, veths, bridge, mounts, loop devices, their
# images, the blkio and memory cgroups) is removed on exit, failure and signals included. One run at a time.
set -eu
[ $# -ge 7 ] && [ "$6" = "--" ] || { sed -n '2,17p' "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: needs root (namespaces, loop devices, cgroups)" >&2; exit 2; }
for t in ip tc losetup mkfs.ext4 mpirun lsblk nsenter timeout flock; do
    command -v "$t" >/dev/null || { echo "$0: $t not found" >&2; exit 2; }
done
model=$(realpath "$1") n=$2 rate=$3 mem=$4 mbps=$5
shift 6
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${BIN:-$here/../deltafin}")
work=${WORK:-/var/tmp/df-netns}
delay=${DELAY_US:-50}
limit=${TIMEOUT:-1800}
net=10.77.0
cgb=/sys/fs/cgroup/blkio
mkdir -p "$work"
# the names below (dfbr0, dfrR, dfvR, dfrankR) are machine-wide: one run at a time, and the cleanup is only ours
exec 9>/run/lock/deltafin-mpi-netns.lock
flock -n 9 || { echo "$0: another mpi-netns.sh run holds /run/lock/deltafin-mpi-netns.lock" >&2; exit 1; }
devs=()
placed=
cleanup() {
    # mpirun may return before its ranks are gone (orted daemonizes): wait for this run's blkio cgroups to empty,
    # then kill what is left in them, so that the mounts, loop devices and cgroups can go
    for i in $(seq 1 30); do
        left=$(cat "$cgb"/dfrank*/cgroup.procs 2>/dev/null || true)
        [ -z "$left" ] && break
        if [ "$i" -ge 20 ]; then kill -KILL $left 2>/dev/null || true; fi
        sleep 0.5
    done
    for r in $(seq 0 $((n - 1))); do
        ip netns del "dfr$r" 2>/dev/null || true
        ip link del "dfv$r" 2>/dev/null || true
        umount "$work/mnt$r" 2>/dev/null || true
        rmdir "$work/mnt$r" 2>/dev/null || true
        rmdir "$cgb/dfrank$r" 2>/dev/null || true
        # with-mem-limit.sh names its cgroup after its pid, which rank.sh recorded (a killed rank leaves it)
        if [ -f "$work/rank$r.pid" ]; then
            for cg in /sys/fs/cgroup/memory/*/deltafin-mem-"$(cat "$work/rank$r.pid")" \
                      /sys/fs/cgroup/memory/*/*/deltafin-mem-"$(cat "$work/rank$r.pid")"; do
                [ -d "$cg" ] && { rmdir "$cg" 2>/dev/null || true; }
            done
            rm -f "$work/rank$r.pid"
        fi
    done
    for d in "${devs[@]}"; do losetup -d "$d" 2>/dev/null || true; done
    # a loop device left by an earlier run killed with SIGKILL
    for r in $(seq 0 $((n - 1))); do
        for d in $(losetup -j "$work/disk$r.img" -O NAME -n 2>/dev/null); do losetup -d "$d" 2>/dev/null || true; done
    done
    for r in $(seq 0 $((n - 1))); do rm -f "$work/disk$r.img"; done
    ip link del dfbr0 2>/dev/null || true
    rm -f "$work/agent.sh" "$work/rank.sh" "$work/hosts"
    rm -rf "$work"/tmp[0-9]*
    if [ -n "$placed" ]; then
        if [ -f "$work/placement.saved" ]; then mv -f "$work/placement.saved" "$model/.deltafin/placement"
        else rm -f "$model/.deltafin/placement"; fi
        placed=
    fi
}
# a signal stops the job first (timeout passes it to mpirun, which ends its ranks), then cleans up
job=
stop() { [ -z "$job" ] || { kill -TERM "$job" 2>/dev/null; wait "$job" 2>/dev/null; job=; }; }
trap 'cleanup; rmdir "$work" 2>/dev/null || true' EXIT
trap 'stop; exit 130' INT TERM HUP
cleanup

# disks: one throttled loop device per rank holding that rank's folder
experts=$(du -sbL "$model" | cut -f1)
size=${IMAGE_GB:-$((experts * 12 / 10 / n / 1000000000 + 2))}
folders=""
for r in $(seq 0 $((n - 1))); do
    truncate -s "${size}G" "$work/disk$r.img"
    d=$(losetup --find --show --direct-io=on "$work/disk$r.img")
    devs+=("$d")
    mkfs.ext4 -q -F "$d"
    mkdir -p "$work/mnt$r"
    mount "$d" "$work/mnt$r"
    mkdir -p "$cgb/dfrank$r"
    echo "$(lsblk -dno MAJ:MIN "$d" | tr -d ' ') $((mbps * 1000000))" >"$cgb/dfrank$r/blkio.throttle.read_bps_device"
    folders="$folders${folders:+,}$work/mnt$r/experts"
done
if [ "$n" -gt 1 ]; then
    "$bin" place -m "$model" --ranks "$n" --to "$folders" >&2
else
    # one process takes no rank plan: a plain placement in MODEL_DIR, put back as it was on exit
    [ -f "$model/.deltafin/placement" ] && cp -p "$model/.deltafin/placement" "$work/placement.saved"
    placed=1
    "$bin" place -m "$model" --to "$folders" >&2
fi

# network: a bridge, one namespace per rank, tbf on both ends of each veth
ip link add dfbr0 type bridge
ip addr add "$net.1/24" dev dfbr0
ip link set dfbr0 up
hosts="$work/hosts"
: >"$hosts"
for r in $(seq 0 $((n - 1))); do
    ip netns add "dfr$r"
    ip link add "dfv$r" type veth peer name eth0 netns "dfr$r"
    ip link set "dfv$r" master dfbr0 up
    ip netns exec "dfr$r" ip addr add "$net.$((10 + r))/24" dev eth0
    ip netns exec "dfr$r" ip link set eth0 up
    ip netns exec "dfr$r" ip link set lo up
    tc qdisc add dev "dfv$r" root tbf rate "$rate" burst 1mb latency 50ms
    ip netns exec "dfr$r" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 50ms
    echo "$net.$((10 + r)) slots=1" >>"$hosts"
done

# mpirun reaches a "host" by entering its namespace (the rsh agent), and each rank enters its cgroups. nsenter
# rather than `ip netns exec`: the latter mounts a fresh /sys, which hides /sys/fs/cgroup from the rank. The
# "hosts" share one hostname and /tmp, so each daemon gets a TMPDIR of its own for Open MPI's session files.
cat >"$work/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
i=\$((\${host##*.} - 10))
mkdir -p $work/tmp\$i
exec nsenter --net=/run/netns/dfr\$i env TMPDIR=$work/tmp\$i sh -c "\$*"
EOF
cat >"$work/rank.sh" <<EOF
#!/bin/sh
r=\$OMPI_COMM_WORLD_RANK
echo \$\$ >$work/rank\$r.pid
echo \$\$ >$cgb/dfrank\$r/cgroup.procs
exec $here/with-mem-limit.sh $mem -- "\$@"
EOF
chmod +x "$work/agent.sh" "$work/rank.sh"
sync && echo 3 >/proc/sys/vm/drop_caches
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's launch through the agent has been seen to stall with a daemon that never reported back and no rank
# started (mpirun then waits for it until the limit): a launch whose ranks have not all started within START_S
# seconds (default 60) is ended and made again, once.
start_s=${START_S:-60}
for try in 1 2; do
    rm -f "$work"/rank*.pid
    timeout -k 10 "$limit" mpirun -np "$n" --hostfile "$hosts" --bind-to none --mca plm_rsh_agent "$work/agent.sh" \
        --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" \
        --mca oob_tcp_if_include "$net.0/24" -x DELTAFIN_NET_DELAY_US="$delay" \
        "$work/rank.sh" "$bin" "$@" -m "$model" --expert-dirs "$folders" 9>&- &
    job=$!   # 9>&-: orted daemonizes, and must not keep the run's lock after it
    started=0
    for _ in $(seq $((start_s * 10))); do
        [ "$(ls "$work"/rank*.pid 2>/dev/null | wc -l)" -ge "$n" ] && { started=1; break; }
        kill -0 "$job" 2>/dev/null || { started=1; break; }   # ended early: its status says why
        sleep 0.1
    done
    [ "$started" = 1 ] && break
    echo "$0: $(ls "$work"/rank*.pid 2>/dev/null | wc -l) of $n ranks started within $start_s s (the launch" \
         "stalled); $([ "$try" = 1 ] && echo "launching again" || echo "giving up")" >&2
    kill "$job" 2>/dev/null
    pkill -f "orted .*$work/agent.sh" 2>/dev/null
    wait "$job" 2>/dev/null
    rc=124
done
[ "$started" = 1 ] && { rc=0; wait "$job" || rc=$?; }
job=
# evidence that the emulation carried the run: each link's bytes and each rank's throttled reads
for r in $(seq 0 $((n - 1))); do
    read -r tx <"/sys/class/net/dfv$r/statistics/tx_bytes"; read -r rx <"/sys/class/net/dfv$r/statistics/rx_bytes"
    mm=$(lsblk -dno MAJ:MIN "${devs[$r]}" | tr -d " ")
    rd=$(awk -v d="$mm" '$1 == d && $2 == "Read" { print $3 }' "$cgb/dfrank$r/blkio.throttle.io_service_bytes")
    echo "mpi-netns: rank $r: link dfv$r sent $rx B, received $tx B; its disk ${devs[$r]} read $rd B" >&2
done
exit "${rc:-0}"
