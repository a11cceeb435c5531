#!/usr/bin/env bash
# gpu-machine.sh — on a machine with an NVIDIA GPU but without the project's -dev packages (and no network):
# unpacks the Debian packages in DEBS (default .debs: the -dev packages of jansson, PCRE2, liburing,
# libmicrohttpd and curl, with their runtime libraries, fetched beforehand by scripts/gpu-debs.sh) into a prefix,
# builds the project against it and runs `make test-gpu`. The machine's own runtime libraries are used where it
# has them; the packages' ones only where it does not.
#   bash scripts/gpu-machine.sh [--build-only] [make test-gpu arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS=${DEBS:-.debs}
P=${GPU_PREFIX:-/tmp/deltafin-prefix}
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
mkdir -p "$P"
for f in "$DEBS"/*-dev_*.deb; do dpkg -x "$f" "$P"; done
LIBDIR="$P/usr/lib/x86_64-linux-gnu"
mkdir -p "$LIBDIR" "$P/rt"
# Each library the build links: the machine's copy if ldconfig knows it, else the runtime package's.
for spec in "libjansson.so.4:libjansson4" "libpcre2-8.so.0:libpcre2-8-0" "liburing.so.2:liburing2" \
            "libmicrohttpd.so.12:libmicrohttpd12" "libcurl.so.4:libcurl4"; do
    so=${spec%%:*} pkg=${spec##*:}
    sys=$(ldconfig -p | awk -v s="$so" '$1 == s && /x86-64/ {print $NF; exit}')
    if [ -z "$sys" ]; then
        deb=$(ls "$DEBS"/"$pkg"_*.deb | head -n1)
        dpkg -x "$deb" "$P/rt"
        sys=$(ls "$P"/rt/usr/lib/x86_64-linux-gnu/"$so"* | head -n1)
        echo "gpu-machine: $so from $(basename "$deb")"
    fi
    base=${so%%.so.*}
    ln -sf "$sys" "$LIBDIR/$base.so"
done
export CPATH="$P/usr/include:$P/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export LIBRARY_PATH="$LIBDIR${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$P/rt/usr/lib/x86_64-linux-gnu:$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# warnings stay warnings here: another compiler version may warn where the project's does not
MK=(PKG_CFLAGS= "PKG_LIBS=-lpcre2-8 -luring -lcurl -lmicrohttpd -ljansson" "WARN=-Wall -Wextra -Wno-unused-parameter")
nproc=$(nproc)
make -j"$nproc" "${MK[@]}" deltafin build/check/tests/test_gpu_kcache >/dev/null
[ "$build_only" = 1 ] && exit 0
make -j"$nproc" "${MK[@]}" test-gpu "$@"
