#!/usr/bin/env bash
# test_mpich.sh — expert parallelism under MPICH as well as Open MPI: scripts/mpich-check.sh builds a second
# binary against MPICH's Debian packages (fetched with apt-get download, unpacked under build/mpich) and runs every
# fixture at 1 to 3 ranks, spine whole and split, byte-identical to one process, plus a stopped rank named. Skips
# where the packages cannot be fetched or the machine has no Open MPI build to compare with.
set -u
cd "$(dirname "$0")/../.."
if ! ldd ./deltafin 2>/dev/null | grep -q libmpi; then
    echo "skip - mpich: ./deltafin was built without MPI"
    exit 0
fi
out=$(bash scripts/mpich-check.sh 2>&1)
if echo "$out" | grep -q "apt-get download of MPICH's packages failed"; then
    echo "skip - mpich: MPICH's Debian packages could not be fetched here"
    exit 0
fi
echo "$out" | grep -E "^(ok|not ok) - "
echo "$out" | grep -q "mpich-check: all passed" || echo "$out" | grep -vE "^(ok|not ok) - " | tail -5
