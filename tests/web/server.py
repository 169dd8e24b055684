"""A real appliance server in a subprocess (`python -m appliance.cli.main serve`) on a free port, on random:tiny."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.web.conftest import ADMIN, ADMIN_PASSWORD, METRICS_TOKEN

REPO = Path(__file__).resolve().parents[2]
SHARED_MODEL_CACHE = REPO / "data" / "test-cache" / "llm-appliance" / "models"  # tests/conftest.py's XDG_DATA_HOME
READY_TIMEOUT = 600.0
# A server's first admin API call checks the admin password with scrypt at its full cost (about a second, several
# on a loaded machine; later calls find the verdict in web/people/signin.py's memo): httpx's default of 5 s is too
# short for that.
ADMIN_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the server was not ready within {timeout} s:\n{self.log()[-3000:]}")

    def new_key(self, name: str = "real", **limits: object) -> str:
        return self.new_key_and_id(name, **limits)[0]

    def new_key_and_id(self, name: str = "real", **limits: object) -> tuple[str, int]:
        """A key and its id, for a test on a shared server that counts its own history rows (`key_id=`)."""
        response = httpx.post(
            self.url + "/admin/api/keys", json={"name": name, **limits}, headers=ADMIN, timeout=ADMIN_TIMEOUT_S
        )
        response.raise_for_status()
        body = response.json()
        return str(body["key"]), int(body["info"]["id"])

    def history(self, **filters: object) -> list[dict[str, Any]]:
        """History rows, newest first; on a shared server, filter by a key of the test's own (`key_id=`)."""
        response = httpx.get(self.url + "/admin/api/requests", params=filters, headers=ADMIN, timeout=ADMIN_TIMEOUT_S)  # type: ignore[arg-type]
        response.raise_for_status()
        return list(response.json()["data"])

    def request_row(self, request_id: str) -> dict[str, Any]:
        """One request's history row, found by the id its answer carried (x-request-id)."""
        response = httpx.get(f"{self.url}/admin/api/requests/{request_id}", headers=ADMIN, timeout=ADMIN_TIMEOUT_S)
        response.raise_for_status()
        return dict(response.json())

    def kill(self) -> None:
        """For a server the test is done with, where nothing checks how it stops: SIGKILL, without the graceful
        stop's seconds of drain and engine shutdown (its engine process exits by itself when its pipe closes)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, the graceful stop (SIGKILL past `timeout`); the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(data_dir: Path, **settings: str) -> Server:
    """Start serving random:tiny with its own data dir (the converted model cache is shared when present)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    models = data_dir / "models"
    if not models.exists():
        SHARED_MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        models.symlink_to(SHARED_MODEL_CACHE)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")},
        "APPLIANCE_DATA_DIR": str(data_dir),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_MODEL": "random:tiny",
        "APPLIANCE_QUANTIZATION": "none",
        "APPLIANCE_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "APPLIANCE_METRICS_TOKEN": METRICS_TOKEN,
        "APPLIANCE_KV_CACHE_BYTES": str(64 << 20),
        "APPLIANCE_EMBEDDING_MODEL": "none",  # a process of its own per server; the tests that embed ask for it
        **{"APPLIANCE_" + k.upper(): v for k, v in settings.items()},
    }
    log_path = data_dir / f"server-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli.main", "serve"], cwd=REPO, env=env, stdout=log, stderr=log
        )
    return Server(process, f"http://127.0.0.1:{port}", data_dir, log_path)


@contextmanager
def serving(data_dir: Path, **settings: str) -> Iterator[Server]:
    """start_server, ready, then killed when the block ends: what a shared server fixture yields."""
    srv = start_server(data_dir, **settings)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()
