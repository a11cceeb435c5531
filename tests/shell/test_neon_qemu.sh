#!/usr/bin/env bash
# Runs the kernels unit test cross-compiled for aarch64 (NEON path, built by `make tests-build` through
# src/kernels/kernels.mk) under qemu user emulation; its ok / not ok lines count as this test's.
cd "$(dirname "$0")/../.."
bin=build/aarch64/test_kernels
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ -z "$qemu" ]; then
    echo "not ok - neon: gcc-aarch64-linux-gnu and qemu-user-static are needed (scripts/install-deps.sh)"
    exit 1
fi
make -s "$bin" >/dev/null || { echo "not ok - neon: cross build of $bin failed"; exit 1; }
out=$("$qemu" "$bin")
rc=$?
printf '%s\n' "$out" | sed 's/^\(not \)\{0,1\}ok - /&[aarch64] /'
if printf '%s\n' "$out" | grep -q '^ok - neon MXFP4: matmul'; then
    echo "ok - neon: the NEON path was selected and tested under qemu"
else
    echo "not ok - neon: the NEON path did not run under qemu"
fi
[ "$rc" -eq 0 ] || echo "not ok - neon: test_kernels under qemu exited $rc"
