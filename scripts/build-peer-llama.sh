#!/usr/bin/env bash
# build-peer-llama.sh DIR — builds llama.cpp's llama-completion (CPU) in DIR for scripts/bench-peer.sh.
# The source is the llama.cpp release that the npm package node-llama-cpp bundles as a git bundle (the npm
# registry is reachable here, GitHub is not). Prints the binary's path.
set -eu
dir=${1:?usage: build-peer-llama.sh DIR}
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
mkdir -p "$dir"
cd "$dir"
[ -f "node-llama-cpp-$version.tgz" ] || npm pack "node-llama-cpp@$version" >/dev/null
[ -d package ] || tar xzf "node-llama-cpp-$version.tgz"
[ -d llama.cpp ] || git clone -q package/llama/gitRelease.bundle llama.cpp
cd llama.cpp
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build build -j"$(nproc)" --target llama-completion >/dev/null
echo "$PWD/build/bin/llama-completion ($(cat ../package/llama/llama.cpp.info.json | tr -d ' \n'))"
