#!/usr/bin/env bash
# gpu-debs.sh [DIR] — on a Debian machine with its package lists, downloads into DIR (default .debs) the -dev
# packages of the libraries Deltafin builds against, with their runtime libraries, for scripts/gpu-machine.sh
# to unpack on a GPU machine that has neither them nor a network. DIR must be git-ignored (carried, not
# committed).
set -eu
dir=${1:-.debs}
mkdir -p "$dir"
cd "$dir"
apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 liburing-dev liburing2 libmicrohttpd-dev libmicrohttpd12 libcurl4-openssl-dev libcurl4
ls -1 *.deb
