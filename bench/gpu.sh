#!/usr/bin/env bash
# The GPU check in one script: the gpu-marked engine tests, then `python -m bench.engine.gpu` (capacity under a
# 24 GiB cap, continuous vs static vs transformers' continuous batching, memory split), written to one JSON file
# and a short text table.
#
#   bench/gpu.sh --prepare       here, with network and the project's venv: fetches the wheels a GPU test machine
#                                lacks or has in another version (bitsandbytes, msgspec, transformers; Python 3.12)
#                                and the tokenizer folder of the random presets, into .gpu-carry/ (git-ignored,
#                                about 60 MB: the device tool carries at most 64 MiB with the repo)
#   bench/gpu.sh [--out DIR]     on the GPU machine, offline: installs .gpu-carry/wheels into a private folder,
#                                runs the tests and the benchmark; results in DIR (default artifacts/gpu)
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
BENCH_ARGS=()

while [ $# -gt 0 ]; do
    case $1 in
        --prepare) MODE=prepare ;;
        --dry-run) MODE=dry-run ;;
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
    mkdir -p "$CARRY/wheels" "$CARRY/data"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" bitsandbytes==0.50.2 msgspec==0.22.0 transformers==5.24.0
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
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"

echo "== gpu tests" >&2
# Without CUDA they skip, which is what a dry run shows; their output is kept beside the results.
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
TESTS=${PIPESTATUS[0]}
set -e

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
