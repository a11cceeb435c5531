#!/usr/bin/env bash
# Installs the Debian packages Deltafin needs.
#   install-deps.sh               everything to build and test (CI)
#   install-deps.sh --build-only  only what building and running needs (`make run`)
#   --if-missing                  do nothing when the packages are already present
set -eu
build_only=0 if_missing=0
for a in "$@"; do
    case "$a" in
    --build-only) build_only=1 ;;
    --if-missing) if_missing=1 ;;
    *) echo "usage: install-deps.sh [--build-only] [--if-missing]" >&2; exit 2 ;;
    esac
done
PKGS=(build-essential pkg-config libpcre2-dev liburing-dev libcurl4-openssl-dev libmicrohttpd-dev libjansson-dev)
# Open MPI: expert parallelism over several processes or machines (src/dist; without it the build runs one rank)
PKGS+=(openmpi-bin libopenmpi-dev)
if [ "$build_only" = 0 ]; then
    # clang: warning check and libFuzzer; python3: test helpers and the test HTTP server; the aarch64 cross
    # compiler and qemu: the NEON kernels' test.
    PKGS+=(clang python3 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
    # Server tests (tests/shell/test_server.sh): headless Chromium, and Node.js + npm unless a Node.js is
    # already installed (an image with NodeSource's nodejs must not get Debian's npm on top).
    PKGS+=(chromium)
    command -v node >/dev/null && command -v npm >/dev/null || PKGS+=(nodejs npm)
fi
if [ "$if_missing" = 1 ]; then
    missing=0
    for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing=1; done
    [ "$missing" = 0 ] && exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}"
