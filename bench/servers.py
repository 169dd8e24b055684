"""The servers the benchmarks start and stop (python -m bench.served, bench_fair, bench_gateway): the
appliance with a chosen configuration, vLLM's CPU build and llama.cpp's llama-server, each on a free port with its
own log, waited for until ready; the appliance's keys and data directories."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.variant import Variant

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "data" / "served-bench"
PEERS = REPO / "data" / "peers"
LLAMA_SERVER = PEERS / "llama.cpp" / "build" / "bin" / "llama-server"  # bench/llama_server.sh builds it
SERVED_NAME = "bench-model"
BENCH_KEY = "sk-vllm-bench"  # vLLM's --api-key; the appliance's key is created in its own database
READY_TIMEOUT = 900.0  # vLLM's first start compiles for minutes on two cores


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    url: str
    key: str
    log: Path
    ready_path: str  # the appliance's /health answers while the model still loads; its /ready does not


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "VLLM_"))}


def appliance_server(name: str, variant: Variant, data_dir: Path) -> Server:
    port = free_port()
    env = (
        clean_env()
        | variant.settings()
        | {
            "APPLIANCE_DATA_DIR": str(data_dir),
            "APPLIANCE_PORT": str(port),
            "APPLIANCE_SERVED_MODEL_NAME": SERVED_NAME,
            "APPLIANCE_LOG_LEVEL": "warning",
        }
    )
    appliance = str(Path(sys.executable).with_name("appliance"))
    log = WORK / f"{name.split(' (')[0].replace(', ', '-').replace('/', '-').replace(' ', '')}.log"
    return Server(name, [appliance, "serve"], env, f"http://127.0.0.1:{port}", "", log, "/ready")


def vllm_server(python: Path, model_dir: Path, dtype: str) -> Server:
    port = free_port()
    # One OpenMP thread, as the appliance's engine takes on two cores; 1 GiB of KV, as the appliance's default.
    env = clean_env() | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--dtype", dtype, "--max-model-len", "2048",
        "--port", str(port), "--api-key", BENCH_KEY,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return Server(f"vLLM CPU 0.32, {dtype}", command, env, url, BENCH_KEY, WORK / f"vllm-{dtype}.log", "/health")


def llama_server(binary: Path, gguf: Path, slots: int, threads: int | None) -> Server:
    """llama.cpp's server on the same GGUF the appliance serves: `slots` sequences at once, each with the context
    vLLM gets (2,048 tokens); `threads` None leaves llama.cpp its own choice (every core), as a user starts it."""
    port = free_port()
    command = [
        str(binary), "-m", str(gguf), "-a", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-c", str(slots * 2048), "--api-key", BENCH_KEY, "--no-webui",
    ]  # fmt: skip
    if threads is not None:
        command += ["-t", str(threads), "-tb", str(threads)]
    name = f"llama-server, {slots} slots, " + ("its own threads" if threads is None else f"{threads} thread(s)")
    log = WORK / f"llama-server-{slots}x{threads or 'own'}.log"
    return Server(name, command, clean_env(), f"http://127.0.0.1:{port}", BENCH_KEY, log, "/health")


@contextmanager
def running(server: Server) -> Iterator[None]:
    with server.log.open("w") as log:
        process = subprocess.Popen(server.command, env=server.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while not _ready(server.url + server.ready_path):
            if process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {process.returncode}; see {server.log}")
            if time.monotonic() - started > READY_TIMEOUT:
                raise TimeoutError(f"{server.name} was not ready in {READY_TIMEOUT:.0f} s; see {server.log}")
            time.sleep(1)
        print(f"  {server.name}: ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def warm(url: str, key: str) -> None:
    """One short request, so that neither server's first-request costs land in the measurement."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def appliance_key(data_dir: Path) -> str:
    """Migrate the bench's own database and create one key without limits in it."""
    return create_keys(data_dir, ["bench"])["bench"]


def create_keys(data_dir: Path, names: list[str], *flags: str) -> dict[str, str]:
    """Migrate the database in data_dir and create a key without limits per name (the CLI prints it once), each
    with `flags` (e.g. --front-end)."""
    env = clean_env() | {"APPLIANCE_DATA_DIR": str(data_dir)}
    appliance = str(Path(sys.executable).with_name("appliance"))
    subprocess.run([appliance, "migrate"], env=env, check=True, capture_output=True)
    keys = {}
    for name in names:
        command = [appliance, "keys", "create", name, *flags]
        made = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        keys[name] = made.stdout.strip().splitlines()[-1]
    return keys


def converted_model(data_dir: Path) -> Path:
    """The bundled model as a safetensors directory (an HF directory vLLM and aiperf's tokenizer read), converted
    once under data_dir/models: the appliance itself streams the GGUF and writes no such copy."""
    from engine.model.gguf_source import converted_gguf
    from engine.model.sources import default_model_path

    def report(line: str) -> None:
        print(f"  {line}", file=sys.stderr)

    return converted_gguf(default_model_path(), data_dir / "models", report)


def variant_dir(data_dir: Path, index: int) -> Path:
    """The data directory of the index-th appliance run: its own database, the first run's converted models."""
    if index == 0:
        return data_dir
    own = data_dir.with_name(f"{data_dir.name}-{index}")
    own.mkdir(parents=True, exist_ok=True)
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    if not (own / "models").exists():
        (own / "models").symlink_to(data_dir / "models", target_is_directory=True)
    return own
