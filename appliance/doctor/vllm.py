"""`appliance doctor` with APPLIANCE_ENGINE=vllm: vLLM's own venv, its python, and the vLLM it imports."""

from __future__ import annotations

import subprocess

from appliance.doctor.host import FAIL, OK, Finding
from appliance.settings import Settings

IMPORT_TIMEOUT_S = 180.0  # importing vLLM loads torch: seconds, more on a cold disk
PROBE = "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"


def vllm_finding(settings: Settings) -> Finding:
    python = settings.vllm_interpreter
    fix = "make it with install.sh --engine vllm (make vllm-env in a checkout) or set APPLIANCE_VLLM_PYTHON"
    if not python.is_file():
        return Finding(FAIL, "vllm", f"no vLLM python at {python}: {fix}")
    try:
        done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding(FAIL, "vllm", f"{python} could not be run: {exc}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
        return Finding(FAIL, "vllm", f"{python} cannot import vLLM's OpenAI server ({last}): {fix}")
    version = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"
    return Finding(OK, "vllm", f"vLLM {version} in {python} (its own venv and torch)")
