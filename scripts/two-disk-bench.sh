#!/usr/bin/env bash
# two-disk-bench.sh — do two throttled devices deliver about twice the expert bandwidth of one? Makes two
# loop-device file systems, throttles each to the same read rate with the cgroup-v1 blkio controller, places a
# model's experts on one of them and on both (`deltafin place`), and runs `deltafin bench` on each placement
# inside the throttled cgroup. Needs root, losetup, mkfs.ext4 and /sys/fs/cgroup/blkio.
#
#   sudo scripts/two-disk-bench.sh MODEL_DIR [MB_PER_S=200] [IMAGE_GB=24]
#
# The spine stays on MODEL_DIR's own disk and resident (large --mem), so only expert reads hit the throttled
# devices; compare expert_disk_bytes / s between the two JSON lines (and s/token).
set -eu
model=$(realpath "$1")
rate=$((${2:-200} * 1000000))
size=${3:-24}
work=${WORK:-/var/tmp/df-two-disk}
bin=$(realpath "${BIN:-./deltafin}")
cg=/sys/fs/cgroup/blkio/deltafin-two-disk
mkdir -p "$work" "$cg"
devs=()
cleanup() {
    for i in 1 2; do umount "$work/mnt$i" 2>/dev/null || true; done
    for d in "${devs[@]}"; do losetup -d "$d" 2>/dev/null || true; done
    rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
for i in 1 2; do
    truncate -s "${size}G" "$work/disk$i.img"
    d=$(losetup --find --show --direct-io=on "$work/disk$i.img")
    devs+=("$d")
    mkfs.ext4 -q -F "$d"
    mkdir -p "$work/mnt$i"
    mount "$d" "$work/mnt$i"
    echo "$(lsblk -dno MAJ:MIN "$d" | tr -d ' ') $rate" >"$cg/blkio.throttle.read_bps_device"
done
for p in one two; do   # one model folder per placement: the placement lives in DIR/.deltafin
    rm -rf "$work/$p" && mkdir -p "$work/$p"
    for f in "$model"/*; do ln -s "$f" "$work/$p/"; done
done
"$bin" place -m "$work/one" --to "$work/mnt1/one"
"$bin" place -m "$work/two" --to "$work/mnt1/two,$work/mnt2/two"
sync && echo 3 >/proc/sys/vm/drop_caches
for p in one two; do
    sh -c "echo \$\$ >$cg/cgroup.procs && exec '$bin' bench -m '$work/$p' -n 8 --prompt 8 --mem 200G --cache-slots 32 --heat off --json" |
        sed "s/^/$p device(s): /"
done
