#!/bin/sh
# Removes from a venv what a CPU install pulls in and never runs:
#   appliance/trim_venv.sh VENV
# triton (GPU kernels' compiler: 1 GB installed, from a 286 MB wheel) comes with xgrammar, which declares it on
# every Linux x86_64 machine for its CUDA bitmask kernel; nothing imports it beside a CPU build of torch. Beside a
# GPU build (one that requires triton, a ROCm triton or NVIDIA's libraries) it stays. Called by `make setup`,
# install.sh and appliance/vllm/env.sh: three venvs on a CPU box, and a test run's disk (one CI run ended on a full
# disk).
set -eu

[ $# -eq 1 ] || {
    echo "usage: $0 VENV" >&2
    exit 2
}
venv=$1
if "$venv/bin/python" - <<'EOF'; then
import sys
from importlib import metadata

try:
    metadata.version("triton")
except metadata.PackageNotFoundError:
    sys.exit(1)  # nothing to remove
gpu = [r for r in metadata.requires("torch") or [] if r.startswith(("triton", "pytorch-triton", "nvidia-"))]
sys.exit(1 if gpu else 0)
EOF
    PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip uninstall --quiet -y triton
fi
