"""Facts about this machine for doctor: the GPUs nvidia-smi lists, CPU flags, who listens on a port, and
whether an appliance answers there."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from appliance.cli.status import StatusError, error_message, fetch

NVIDIA_SMI_TIMEOUT_S = 20
PROBE_TIMEOUT_S = 3.0  # an appliance answers /health at once, even while it loads


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    driver: str
    total_mib: int


def nvidia_gpus() -> list[Gpu] | str:
    """The GPUs nvidia-smi lists, or why it could not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no nvidia-smi"
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi did not run: {exc}"
    if done.returncode != 0:
        first = (done.stdout + done.stderr).strip().splitlines()
        return f"nvidia-smi failed: {first[0] if first else f'exit status {done.returncode}'}"
    gpus = []
    for row in done.stdout.strip().splitlines():
        name, driver, total = (part.strip() for part in row.split(","))
        gpus.append(Gpu(name, driver, int(float(total))))
    return gpus


def nearest_existing(path: Path) -> Path:
    """The path itself, or its closest ancestor that exists (where it would be created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def cpu_flag(flag: str) -> bool:
    """Whether /proc/cpuinfo lists the flag (avx512_bf16, ...)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and flag in line.split() for line in text.splitlines())


def listener(port: int) -> str:
    """ " (pid N: command)" for the process listening on the port, when this user may see it."""
    try:
        connections = psutil.net_connections("tcp")
    except (psutil.Error, OSError):
        return ""
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                command = " ".join(psutil.Process(conn.pid).cmdline())
            except psutil.Error:
                command = "?"
            return f" (pid {conn.pid}: {command[:80]})"
    return ""


def probe_appliance(base: str) -> str | None:
    """How the appliance at base says it is ("ready, serving X" or its not-ready reason); None if it is not one."""
    try:
        code, health = fetch(base, "/health", None, PROBE_TIMEOUT_S)
        if code != 200 or health != {"status": "ok"}:
            return None
        code, ready = fetch(base, "/ready", None, PROBE_TIMEOUT_S)
    except StatusError:
        return None
    if code == 200 and isinstance(ready, dict):
        return f"ready, serving {ready.get('model')}"
    return error_message(ready) if isinstance(ready, dict) and "error" in ready else None
