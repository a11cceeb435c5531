#!/usr/bin/env bash
# test_int8_spine.sh — the int8 spine on the bundled model, through the CLI: `deltafin quantize --spine int8`
# writes the sidecar (in a temporary folder of symlinks, never into models/), `info --spine int8` reports it,
# `run --spine int8` generates, asking for it where it is absent fails clearly, and `quantize --compare` on
# held-out text (tests/shell/int8_heldout.txt, written for this test, never seen in training) stays within
# bounds: top-1 agreement >= 95%, mean KL(bf16 || int8) < 0.01 nats, perplexity within 2%.
set -u
cd "$(dirname "$0")/../.."
bin=./deltafin
dir=$(mktemp -d /tmp/df_int8_XXXXXX)
trap 'rm -rf "$dir"' EXIT
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }

m="$dir/m"
mkdir "$m"
for f in models/default/*; do ln -s "$PWD/$f" "$m/"; done

if $bin run -m "$m" --spine int8 -p "The" -n 2 >"$dir/out" 2>"$dir/err"; then
    bad "--spine int8 without a sidecar should fail"
else
    grep -q "deltafin quantize" "$dir/err" && ok "--spine int8 without a sidecar fails, naming the fix" ||
        bad "missing-sidecar message: $(cat "$dir/err")"
fi
$bin run -m "$m" --spine fp4 -p "The" -n 2 >/dev/null 2>"$dir/err" && bad "--spine fp4 accepted" ||
    ok "--spine fp4 refused: $(head -1 "$dir/err")"

if $bin quantize -m "$m" --spine int8 >"$dir/q" 2>&1 && [ -f "$m/spine-int8.safetensors" ]; then
    ok "quantize: $(head -1 "$dir/q")"
else
    bad "quantize failed: $(tail -3 "$dir/q")"; exit 0
fi
$bin info -m "$m" --spine int8 >"$dir/info" 2>&1
grep -q "^int8 spine: 80 matrices" "$dir/info" && grep -q "every tensor present" "$dir/info" &&
    ok "info --spine int8: $(grep '^int8 spine' "$dir/info")" || bad "info --spine int8: $(tail -5 "$dir/info")"
$bin info -m "$m" >"$dir/info0" 2>&1
grep -q "^int8 spine" "$dir/info0" && bad "info without --spine uses the sidecar" || ok "default (bf16) ignores the sidecar"

a=$($bin run -m "$m" --spine int8 --tokens 464,2811,4037 -n 8 2>/dev/null)
[ -n "$a" ] && ok "run --spine int8 generates: $a" || bad "run --spine int8"

if $bin quantize -m "$m" --compare --text tests/shell/int8_heldout.txt --json >"$dir/cmp" 2>"$dir/cmp.err"; then
    read -r agree kl klmax dppl < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
print(r["top1_agreement"], r["kl_mean"], r["kl_max"], r["ppl_change"])' "$dir/cmp")
    python3 -c "import sys; sys.exit(0 if $agree >= 0.95 else 1)" && ok "top-1 agreement $agree >= 0.95" ||
        bad "top-1 agreement $agree < 0.95"
    python3 -c "import sys; sys.exit(0 if $kl < 0.01 else 1)" && ok "mean KL $kl < 0.01 (max $klmax)" ||
        bad "mean KL $kl >= 0.01"
    python3 -c "import sys; sys.exit(0 if abs($dppl) < 0.02 else 1)" && ok "perplexity change $dppl within 2%" ||
        bad "perplexity change $dppl"
else
    bad "quantize --compare: $(cat "$dir/cmp.err")"
fi
