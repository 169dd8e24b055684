#!/usr/bin/env bash
# The GPU check in one script: the gpu-marked engine tests (tests/engine/test_gpu.py), decode steps by KV pool
# (`python -m bench.engine.steps --device cuda`: 16-bit, int8 and fp8 pools at batch 1/8/32/128), and a Q4_K_M
# GGUF of a 1B shape streamed into nf4 (`python -m bench.gguf_load --device cuda`), each written to its own text file; with --bench also `python -m bench.engine.gpu` (capacity under a
# 24 GiB cap, continuous vs static vs transformers' continuous batching, memory split) as JSON and a table.
#
#   bench/gpu.sh --prepare       here, with network and the project's venv: fetches the wheels a GPU test machine
#                                lacks or has in another version (bitsandbytes, msgspec, transformers, gguf;
#                                Python 3.12), the tokenizer folder of the random presets and a GGUF holding only
#                                the bundled tokenizer, into .gpu-carry/ (git-ignored, about 60 MB: the device
#                                tool carries at most 64 MiB with the repo)
#   bench/gpu.sh [--out DIR]     on the GPU machine, offline: installs .gpu-carry/wheels into a private folder,
#                                runs the tests and the benchmarks; results in DIR (default artifacts/gpu)
#   bench/gpu.sh --dry-run       anywhere: the same on the CPU with random:tiny, to check the script; the figures
#                                of a dry run mean nothing
# Extra arguments go to bench.engine.gpu (e.g. --streams 160 --cap-gib 24). PYTHON picks the interpreter.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${GPU_CARRY:-$ROOT/.gpu-carry}
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$ROOT/.venv/bin/python" ] && PYTHON=$ROOT/.venv/bin/python
fi
OUT_DIR=$ROOT/artifacts/gpu
MODE=gpu
FULL=0
BENCH_ARGS=()

while [ $# -gt 0 ]; do
    case $1 in
        --prepare) MODE=prepare ;;
        --dry-run) MODE=dry-run ;;
        --bench) FULL=1 ;;
        --out) OUT_DIR=${2:?--out needs a folder}; shift ;;
        --out=*) OUT_DIR=${1#--out=} ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) BENCH_ARGS+=("$1") ;;
    esac
    shift
done

case $OUT_DIR in /*) ;; *) OUT_DIR=$PWD/$OUT_DIR ;; esac  # relative to where it was called from
cd "$ROOT"

if [ "$MODE" = prepare ]; then
    rm -rf "$CARRY/wheels"
    mkdir -p "$CARRY/wheels" "$CARRY/data"
    # The versions this project pins, and xgrammar's own needs that the GPU machine's image lacks.
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$CARRY/wheels" bitsandbytes==0.50.2 msgspec==0.22.0 transformers==5.24.0 gguf==0.19.0 \
        xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic-core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5
    # bitsandbytes' wheel holds a library for every CUDA, ROCm and XPU release (43 MB): keep the CPU's and CUDA
    # 13's, which the GPU machine's torch (cu130) loads, so that the carry stays well under its limit.
    "$PYTHON" - "$CARRY"/wheels/bitsandbytes-*.whl <<'PY'
import re, sys, zipfile
from pathlib import Path
wheel = Path(sys.argv[1])
keep = re.compile(r"libbitsandbytes_(cpu|cuda13\d)\.so$")
slim = wheel.with_suffix(".slim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.endswith(".so") and not keep.search(item.filename):
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines()
            data = "\n".join(l for l in lines if ".so," not in l or keep.search(l.split(",")[0])).encode() + b"\n"
        dst.writestr(item, data)
slim.replace(wheel)
PY
    "$PYTHON" -c 'import sys; from pathlib import Path; from bench.gguf_load import write_tokenizer_gguf
write_tokenizer_gguf(Path(sys.argv[1]))' "$CARRY/data/tokenizer.gguf"
    XDG_DATA_HOME=$CARRY/data "$PYTHON" -c '
from engine.config import EngineConfig
from engine.model.loader import random_model_dir
print(random_model_dir("tiny", EngineConfig().model_cache_dir))  # the other presets take its tokenizer there
'
    du -sh "$CARRY"
    exit 0
fi

if [ -d "$CARRY/wheels" ] && [ "$MODE" = gpu ]; then
    SITE=$(mktemp -d)
    trap 'rm -rf "$SITE"' EXIT
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl
    export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -d "$CARRY/data" ]; then
    export XDG_DATA_HOME=$CARRY/data  # the engine's default model cache: $XDG_DATA_HOME/llm-appliance/models
    export BENCH_TOKENIZER_GGUF=$CARRY/data/tokenizer.gguf  # the GGUFs bench.gguf_load writes take it from there
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"

echo "== gpu tests" >&2
# Without CUDA they skip, which is what a dry run shows; their output is kept beside the results. tests/conftest.py
# serves the gateway's suites (it imports web/, whose packages the GPU machine lacks) and is left out.
set +e
timeout "${GPU_TESTS_SECONDS:-600}" "$PYTHON" -m pytest -q -rA -p no:cacheprovider --noconftest -m gpu tests/engine/test_gpu.py 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
TESTS=${PIPESTATUS[0]}
set -e

if [ "$MODE" = gpu ]; then
    echo "== decode steps by KV pool" >&2
    set +e
    timeout 150 "$PYTHON" -m bench.engine.steps --device cuda --model random:llama-1b --variants none/bfloat16 \
        --kv-cache-dtype auto,int8,fp8 --batches 1,8,32,128 --context 512 --steps 20 2>&1 | tee "$OUT_DIR/steps.txt"
    echo "== a Q4_K_M GGUF into nf4" >&2
    # gguf's numpy dequantization takes about a minute per billion weights: the 1B shape only.
    timeout 200 "$PYTHON" -m bench.gguf_load --shape 1b --paths new --device cuda --quantization nf4 2>&1 |
        tee "$OUT_DIR/gguf.txt"
    set -e
    if [ "$FULL" = 0 ]; then
        echo "results: $OUT_DIR/gpu-tests.txt, $OUT_DIR/steps.txt, $OUT_DIR/gguf.txt" >&2
        exit "$TESTS"
    fi
fi

echo "== benchmark" >&2
if [ "$MODE" = dry-run ]; then
    BENCH_ARGS=(--dry-run "${BENCH_ARGS[@]}")
fi
set +e
"$PYTHON" -m bench.engine.gpu --out "$OUT_DIR" "${BENCH_ARGS[@]}"
BENCH=$?
set -e
echo "results: $OUT_DIR/gpu.json, $OUT_DIR/gpu.txt, $OUT_DIR/gpu-tests.txt" >&2
# Non-zero when a test failed or a benchmark run failed (its error is in gpu.json and gpu.txt).
[ "$TESTS" -eq 0 ] && exit "$BENCH"
exit "$TESTS"
