#!/usr/bin/env bash
# The whole tree builds warning-free (-Wall -Wextra -Werror) with clang as well as gcc.
set -u
cd "$(dirname "$0")/../.."
if out=$(make --no-print-directory clang-check 2>&1); then
    echo "ok - clang build with -Wall -Wextra -Werror"
else
    echo "not ok - clang build: $(grep -m5 -E 'error|warning' <<<"$out")"
fi
