"""A real vLLM OpenAI server for the suite (issue 11: real components, no mocks): vLLM's own venv (made by the same
script as `make vllm-env` and install.sh --engine vllm), the bundled model's converted HF directory, and one server
per test session on a free port. Every vLLM the suite starts runs its model eagerly (NO_COMPILE): what the tests
prove is the gateway's side (routing, failover, usage, supervision), and vLLM's torch.compile of the model cost
the suite minutes of CPU."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.web.server import REPO, SHARED_MODEL_CACHE, free_port

VLLM_ENV = REPO / "data" / "peers" / "vllm"
VLLM_PYTHON = VLLM_ENV / "bin" / "python"
# One cache for every vLLM the tests start, the appliance's managed one included (tests/conftest.py sets it and
# TORCHINDUCTOR_CACHE_DIR, where the compiled kernels go, outside the clone): a start whose graphs were compiled
# before skips the two minutes.
VLLM_CACHE = Path(os.environ["VLLM_CACHE_ROOT"]).expanduser()
SERVED_NAME = "smollm2-vllm"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 64  # APPLIANCE_MAX_NUM_SEQS's default: the appliance's managed vLLM then reuses this compile
READY_TIMEOUT_S = 900.0
# torch's own switch (vLLM has none but --enforce-eager, and the appliance builds its managed vLLM's command): the
# model runs eagerly, the same tokens. Measured, this model on the 2-core box, start to /v1/models: 34-54 s eager,
# 76 s compiling with a warm inductor cache, 169 s with a cold one (CI's every run).
NO_COMPILE = {"TORCH_COMPILE_DISABLE": "1"}


@dataclass(frozen=True, slots=True)
class VllmModel:
    python: Path  # vLLM's venv's interpreter
    model_dir: Path  # the bundled model as an HF directory (the appliance's converted cache entry)


@dataclass(frozen=True, slots=True)
class VllmServer:
    base_url: str  # http://127.0.0.1:PORT, without /v1
    api_key: str
    model: str  # the served name
    model_dir: Path
    log_path: Path


def ensure_vllm_env() -> Path:
    """The venv, made once (CI starts from nothing; the script's stamp makes a second call a no-op)."""
    subprocess.run([str(REPO / "appliance" / "vllm" / "env.sh"), str(VLLM_ENV), "python3"], check=True)
    return VLLM_PYTHON


def bundled_model_dir() -> Path:
    """The converted HF directory of the bundled GGUF, by the embedded loader's own conversion (once per cache)."""
    from engine.model.loader import _checkpoint_dir

    path, _ = _checkpoint_dir("default", SHARED_MODEL_CACHE, lambda line: None)
    return path.resolve()


def wait_ready(process: subprocess.Popen[bytes], base_url: str, key: str, name: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            models = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=2)
            if models.status_code == 200 and any(m["id"] == name for m in models.json()["data"]):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM was not ready within {READY_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def vllm_model() -> VllmModel:
    return VllmModel(ensure_vllm_env(), bundled_model_dir())


@pytest.fixture(scope="session")
def vllm_server(vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """ONE vLLM server for the session: float32, a 2048-token context, 1 GiB of KV, an api key, no compile."""
    port, key = free_port(), "sk-vllm-" + secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "VLLM_"))}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(VLLM_CACHE), "VLLM_NO_USAGE_STATS": "1"}
    env["VLLM_USE_AOT_COMPILE"] = "0"  # as the appliance starts it (appliance/vllm/process.py says why)
    env |= NO_COMPILE
    command = [
        str(vllm_model.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_model.model_dir),
        "--served-model-name", SERVED_NAME, "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
    ]  # fmt: skip
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, base_url, key, SERVED_NAME, log_path)
        yield VllmServer(base_url, key, SERVED_NAME, vllm_model.model_dir, log_path)
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM to vLLM's process group (it forks an engine core), SIGKILL to what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
