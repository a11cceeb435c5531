#!/usr/bin/env bash
# mpich-check.sh — the expert-parallel engine built against MPICH instead of Open MPI, and run under MPICH's own
# launcher (mpiexec.hydra): every fixture's logits byte-identical to one process with 1, 2 and 3 ranks, with the
# spine replicated and split, and a stopped rank named. The comm layer uses standard MPI-3 calls only; this is
# what shows it. MPICH's Debian packages are fetched with apt-get download and unpacked under WORK (default
# build/mpich, ignored by git) with dpkg -x, beside the system's Open MPI, which stays the default build.
#
#   bash scripts/mpich-check.sh            # prints ok / not ok lines and a summary; exit 1 on a failure
set -u
cd "$(dirname "$0")/.."
work=${WORK:-build/mpich}
root=$work/root
lib=$root/usr/lib/x86_64-linux-gnu
fail=0
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; fail=1; }
if [ ! -x "$root/usr/bin/mpiexec.hydra" ]; then
    mkdir -p "$work/debs"
    (cd "$work/debs" && apt-get download mpich libmpich-dev libmpich12 libslurm38 >/dev/null 2>&1) ||
        { echo "mpich-check: apt-get download of MPICH's packages failed"; exit 1; }
    for d in "$work"/debs/*.deb; do dpkg -x "$d" "$root"; done
fi
make -s -j2 B="$work" BIN="$work/deltafin" MPI_CFLAGS="-I$root/usr/include/x86_64-linux-gnu/mpich" \
    MPI_LIBS="-L$lib -lmpich" "$work/deltafin" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
make -s deltafin >/dev/null
export LD_LIBRARY_PATH=$lib PATH=$root/usr/bin:$PATH DELTAFIN_RANK_TIMEOUT=3
bin=$work/deltafin
ldd "$bin" | grep -q libmpich && ! ldd "$bin" | grep -q libmpi.so && ok "$bin links MPICH ($(mpichversion | head -1))" ||
    bad "$bin does not link MPICH alone: $(ldd "$bin" | grep -i mpi)"
mpi() { timeout 60 mpiexec.hydra -launcher fork -n "$@"; }
dir=$(mktemp -d /tmp/df_mpich_XXXXXX)
trap 'rm -rf "$dir"' EXIT
for f in tests/fixtures/*/; do
    f=${f%/}
    ./deltafin logits -m "$f" --prompt "$f/prompt.json" -o "$dir/ref.f32" --cache-slots 3 -t 1 2>/dev/null || continue
    same=""
    for n in 1 2 3; do
        for split in off on; do
            mpi "$n" "$bin" logits -m "$f" --prompt "$f/prompt.json" -o "$dir/n.f32" --cache-slots 3 -t 1 \
                --spine-split "$split" >"$dir/out" 2>&1 && cmp -s "$dir/ref.f32" "$dir/n.f32" && same="$same $n/$split" ||
                bad "$(basename "$f"), $n ranks, spine split $split: $(tail -c 300 "$dir/out")"
        done
    done
    [ "$same" = " 1/off 1/on 2/off 2/on 3/off 3/on" ] &&
        ok "$(basename "$f"): byte-identical to one process (Open MPI build) with 1, 2, 3 ranks, spine whole and split"
done
# a stopped rank is named within the liveness timeout
DELTAFIN_NET_DELAY_US=2000 mpi 2 "$bin" run -m models/default --tokens 1,2,3 -n 480 -t 1 --heat off >"$dir/o" 2>"$dir/e" &
job=$!
sleep 3
for p in $(pgrep -f "$bin run -m models/default"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "PMI_RANK=1" && kill -STOP "$p" && stopped=$p
done
wait $job
[ -n "${stopped:-}" ] && kill -9 "$stopped" 2>/dev/null
grep -q "rank 1 (.*) has sent nothing for" "$dir/e" && ok "a stopped rank under MPICH: $(grep -m1 'sent nothing' "$dir/e" | head -c 150)" ||
    bad "stopped rank under MPICH: $(head -c 300 "$dir/e")"
[ "$fail" = 0 ] && echo "mpich-check: all passed" || echo "mpich-check: FAILED"
exit "$fail"
