#!/usr/bin/env bash
# Installs the Debian packages Deltafin needs to build and test. With --if-missing it does nothing when
# they are already present (used by `make run`).
set -eu
PKGS=(build-essential pkg-config clang libpcre2-dev liburing-dev libcurl4-openssl-dev libmicrohttpd-dev
      libjansson-dev python3 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
# Server tests (tests/shell/test_server.sh): headless Chromium, and Node.js + npm unless a Node.js is
# already installed (an image with NodeSource's nodejs must not get Debian's npm on top).
PKGS+=(chromium)
command -v node >/dev/null && command -v npm >/dev/null || PKGS+=(nodejs npm)
if [ "${1:-}" = "--if-missing" ]; then
    missing=0
    for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing=1; done
    [ "$missing" = 0 ] && exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}"
