#!/usr/bin/env bash
# bench-peer.sh — Deltafin and llama.cpp decoding the same weights, back to back, under the same memory
# limits and disk read-ahead settings; prints one line per run and the medians.
#
# usage: scripts/bench-peer.sh -m MODEL_DIR -g MODEL.gguf -l LLAMA_COMPLETION [--mem 8,4,none] [--ra 8192,128]
#                              [--runs 3] [-n 16] [--threads 2]
#   MODEL.gguf comes from tools/to_gguf.py MODEL_DIR; LLAMA_COMPLETION is llama.cpp's llama-completion
#   (CPU build). llama.cpp runs with --no-repack: its default repacks MXFP4 experts into anonymous memory,
#   which a memory limit below the model's size cannot hold. The page cache is dropped before every run;
#   the disk's read_ahead_kb is set per setting and restored on exit. Needs root (cgroups, drop_caches).
set -u
cd "$(dirname "$0")/.."
model="" gguf="" llama="" mems="8,4,none" ras="8192,128" runs=3 n=16 threads=2
while [ $# -gt 0 ]; do
    case "$1" in
    -m) model=$2; shift 2 ;;
    -g) gguf=$2; shift 2 ;;
    -l) llama=$2; shift 2 ;;
    --mem) mems=$2; shift 2 ;;
    --ra) ras=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "bench-peer.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
for f in "$model/config.json" "$gguf" "$llama" ./deltafin; do
    [ -e "$f" ] || { echo "bench-peer.sh: $f not found" >&2; exit 2; }
done

# The block device under the model folder (a partition's read-ahead is its disk's).
dev=$(df --output=source "$model" | tail -n 1)
blk=$(basename "$(readlink -f "$dev")")
ra_file=/sys/block/$blk/queue/read_ahead_kb
[ -f "$ra_file" ] || ra_file=/sys/block/$(basename "$(readlink -f "/sys/class/block/$blk/..")")/queue/read_ahead_kb
[ -f "$ra_file" ] || { echo "bench-peer.sh: no read_ahead_kb for $dev" >&2; exit 1; }
ra_orig=$(cat "$ra_file")
trap 'echo "$ra_orig" >"$ra_file"' EXIT

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
limited() {   # GB|none -- command...
    local gb=$1; shift 2
    if [ "$gb" = none ]; then "$@"; else scripts/with-mem-limit.sh "$gb" -- "$@"; fi
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

deltafin_run() {   # GB -> s/token (a small disk probe: only s/token is used, and the probe's reads would
                   # drain a cloud disk's burst budget before llama.cpp's run)
    drop
    limited "$1" -- ./deltafin bench -m "$model" -n "$n" --prompt 8 --threads "$threads" --probe-gb 0.5 --json 2>/dev/null |
        tail -n 1 | sed -n 's/.*"s_per_token":\([0-9.eE+-]*\).*/\1/p'
}
llama_run() {      # GB -> s/token (llama.cpp's own eval timing)
    drop
    limited "$1" -- "$llama" -m "$gguf" -p "The river" -n "$n" -c 4096 -t "$threads" --no-repack -no-cnv --temp 0 \
        --no-warmup 2>&1 | sed -n 's/.*eval time = .*(\s*\([0-9.]*\) ms per token.*/\1/p' | grep -v '^$' |
        tail -n 1 | awk '{ printf "%.6f\n", $1 / 1000 }'
}

echo "model $model ($(du -sh "$model" | cut -f1)), gguf $gguf, $n tokens, $threads threads, $runs runs each"
for ra in ${ras//,/ }; do
    echo "$ra" >"$ra_file"
    for mem in ${mems//,/ }; do
        d=() l=()
        for _ in $(seq "$runs"); do
            d+=("$(deltafin_run "$mem")")
            l+=("$(llama_run "$mem")")
            echo "  read_ahead_kb=$ra mem=$mem: deltafin ${d[-1]:-failed} s/token, llama.cpp ${l[-1]:-failed} s/token"
        done
        dm=$(printf '%s\n' "${d[@]}" | grep . | median)
        lm=$(printf '%s\n' "${l[@]}" | grep . | median)
        awk -v ra="$ra" -v mem="$mem" -v d="$dm" -v l="$lm" 'BEGIN {
            printf "read_ahead_kb=%s mem=%s: deltafin %s s/token, llama.cpp %s s/token, ratio %.2fx\n", ra, mem, d, l,
                   (d > 0 ? l / d : 0) }'
    done
done
