#!/usr/bin/env bash
# with-mem-limit.sh GB -- command [args...]
# Runs a command inside a fresh memory cgroup limited to GB GiB (anonymous memory and page cache both count,
# as on a machine with that much RAM), then prints the cgroup's peak usage to stderr and removes the cgroup.
# Uses cgroup v2 when the memory controller is there, else v1 (/sys/fs/cgroup/memory). Needs root (or a
# delegated cgroup). Exit status: the command's.
set -u
if [ $# -lt 3 ] || [ "$2" != "--" ]; then
    echo "usage: $0 GB -- command [args...]" >&2
    exit 2
fi
gb=$1; shift 2
bytes=$(awk -v g="$gb" 'BEGIN { if (g + 0 <= 0) exit 1; printf "%.0f", g * 1073741824 }') || {
    echo "$0: bad size '$gb' (GiB, e.g. 8 or 9.5)" >&2; exit 2; }
name="deltafin-mem-$$"
v2root=""
for r in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    if [ -f "$r/cgroup.controllers" ] && grep -qw memory "$r/cgroup.controllers"; then v2root=$r; break; fi
done
if [ -n "$v2root" ]; then
    parent="$v2root$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)"
    parent=${parent%/}
    cg="$parent/$name"
    mkdir "$cg" || exit 1
    echo "$bytes" >"$cg/memory.max"
    [ -f "$cg/memory.swap.max" ] && echo 0 >"$cg/memory.swap.max"
    peak_file="$cg/memory.peak"; kind="v2"
else
    rel=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
    parent="/sys/fs/cgroup/memory${rel%/}"
    [ -d "$parent" ] || { echo "$0: no memory cgroup hierarchy found" >&2; exit 1; }
    cg="$parent/$name"
    mkdir "$cg" || exit 1
    echo "$bytes" >"$cg/memory.limit_in_bytes"
    [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$bytes" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null
    peak_file="$cg/memory.max_usage_in_bytes"; kind="v1"
fi
bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' with-mem-limit "$cg" "$@"
rc=$?
peak=$(cat "$peak_file" 2>/dev/null || echo 0)
awk -v p="$peak" -v l="$bytes" -v k="$kind" -v rc="$rc" 'BEGIN {
    printf "with-mem-limit: cgroup %s, limit %.2f GiB, peak usage %.2f GiB (page cache included), exit %d\n",
           k, l / 1073741824, p / 1073741824, rc }' >&2
rmdir "$cg" 2>/dev/null || sleep 1; rmdir "$cg" 2>/dev/null
exit "$rc"
