"""install.sh --no-systemd for real, as CI runs it: the installed `appliance serve` answers /ready and a chat
completion and stops cleanly on SIGTERM; a second run upgrades in place and keeps settings and data;
--uninstall keeps data and settings, --purge removes everything.

One install per module (about two minutes: torch comes from pip's cache or a local wheel, the rest is
resolved once); the tests below run in file order against it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
INSTALL_SH = REPO / "install.sh"
READY_WITHIN_S = 300
DRAIN_WITHIN_S = 90


@dataclass(frozen=True, slots=True)
class Installed:
    prefix: Path
    first_output: str

    @property
    def appliance(self) -> Path:
        return self.prefix / "venv" / "bin" / "appliance"

    @property
    def command(self) -> Path:
        """The wrapper install.sh writes: the venv's command with the installed settings."""
        return self.prefix / "bin" / "appliance"

    @property
    def data_dir(self) -> Path:
        return self.prefix / "data"

    @property
    def env_file(self) -> Path:
        return self.prefix / "etc" / "appliance.env"

    def setting(self, name: str) -> str:
        lines = self.env_file.read_text().splitlines()
        return next(line.partition("=")[2] for line in lines if line.startswith(f"{name}="))


def run_install_sh(*args: str) -> str:
    """Run install.sh with this interpreter as the venv's base; pip's cache is left on so CI reuses it.
    Returns what it printed, warnings included."""
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["sh", str(INSTALL_SH), *args], capture_output=True, text=True, env=env, timeout=1200)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"install.sh {' '.join(args)} exited with {result.returncode}:\n{output[-6000:]}")
    return output


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    prefix = tmp_path_factory.mktemp("install") / "llm-appliance"
    output = run_install_sh("--prefix", str(prefix), "--no-systemd", "--source", str(REPO), "--host", "127.0.0.1")
    return Installed(prefix, output)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_until_ready(server: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"appliance serve exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    pytest.fail(f"/ready did not answer 200 within {READY_WITHIN_S} s:\n{log.read_text()[-4000:]}")


def test_first_install_writes_settings_and_prints_the_admin_password(installed: Installed) -> None:
    password = installed.setting("APPLIANCE_ADMIN_PASSWORD")
    assert len(password) >= 16
    assert f"admin password: {password}" in installed.first_output
    assert installed.setting("APPLIANCE_HOST") == "127.0.0.1"
    assert installed.setting("APPLIANCE_DATA_DIR") == str(installed.data_dir)
    assert installed.env_file.stat().st_mode & 0o077 == 0, "the env file holds a password: owner only"
    assert (installed.data_dir / "appliance.db").is_file(), "install.sh runs the migrations"
    assert f"manage it with: {installed.command} status" in installed.first_output


def run_command(installed: Installed, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed command as an operator runs it: nothing from this test process's environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(installed.data_dir), "LANG": "C.UTF-8"}
    return subprocess.run([str(installed.command), *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_cpu_install_leaves_out_triton(installed: Installed) -> None:
    """appliance/trim_venv.sh: xgrammar declares triton (1 GB) on every Linux x86_64 machine; beside a CPU build of
    torch nothing runs it. A GPU build of torch (requiring triton or NVIDIA's libraries) keeps it."""
    python = installed.prefix / "venv" / "bin" / "python"
    probe = (
        "from importlib import metadata as m\n"
        "try:\n    m.version('triton'); print('present')\nexcept m.PackageNotFoundError:\n    print('absent')\n"
        "print(any(r.startswith(('triton', 'pytorch-triton', 'nvidia-')) for r in m.requires('torch') or []))"
    )
    found, gpu_torch = subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.split()
    assert found == "absent" or gpu_torch == "True"


def test_installed_doctor_finds_nothing_wrong(installed: Installed) -> None:
    result = run_command(installed, "doctor", "--port", str(free_port()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok    database" in result.stdout and "ok    model" in result.stdout


def test_installed_appliance_serves_a_chat_completion_and_stops_cleanly(installed: Installed, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # As the service runs it: the env file, nothing from this test process's environment (conftest sets a
    # data dir), plus overrides for a free port and a fast random model.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(installed.data_dir),
        "LANG": "C.UTF-8",
        "APPLIANCE_ENV_FILE": str(installed.env_file),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_MODEL": "random:tiny",
        "APPLIANCE_QUANTIZATION": "none",
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen([str(installed.appliance), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(server, base, log)

        admin = base64.b64encode(f"admin:{installed.setting('APPLIANCE_ADMIN_PASSWORD')}".encode()).decode()
        status, created = http("POST", f"{base}/admin/api/keys", {"authorization": f"Basic {admin}"}, {"name": "ci"})
        assert status == 201, created
        bearer = {"authorization": f"Bearer {created['key']}"}

        status, models = http("GET", f"{base}/v1/models", bearer)
        assert status == 200, models
        chat = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        status, completion = http("POST", f"{base}/v1/chat/completions", bearer, chat)
        assert status == 200, completion
        assert completion["choices"][0]["finish_reason"] in ("stop", "length")
        assert isinstance(completion["choices"][0]["message"]["content"], str)
        # Guided decoding (xgrammar) serves from the trimmed venv: triton, which it declares, is not there.
        guided = {**chat, "response_format": {"type": "json_object"}, "max_tokens": 16}
        status, completion = http("POST", f"{base}/v1/chat/completions", bearer, guided)
        assert status == 200, completion
        assert completion["choices"][0]["message"]["content"].lstrip().startswith("{"), completion

        # The installed command reads the settings file: the admin password there answers `status`.
        asked = run_command(installed, "status", "--port", str(port))
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "ready" in asked.stdout and "random:tiny" in asked.stdout

        # The addresses install.sh prints: the chat page, and the console (its login page until signed in).
        for page in ("/", "/admin"):
            with urllib.request.urlopen(f"{base}{page}", timeout=30) as response:
                assert response.status == 200
                assert response.headers.get_content_type() == "text/html"

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=DRAIN_WITHIN_S) == 0, log.read_text()[-4000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_running_it_again_upgrades_in_place_keeping_settings_and_data(installed: Installed) -> None:
    settings_before = installed.env_file.read_bytes()
    data_before = file_digests(installed.data_dir)
    package = next((installed.prefix / "venv" / "lib").glob("python3*/site-packages/appliance/__init__.py"))
    package_before = package.stat().st_mtime_ns

    output = run_install_sh("--prefix", str(installed.prefix), "--no-systemd", "--source", str(REPO), "--port", "9")

    assert "upgrading the virtual environment" in output
    assert package.stat().st_mtime_ns != package_before, "the package is reinstalled from the source"
    assert installed.env_file.read_bytes() == settings_before
    assert "--host/--port/--model/--quantization/--engine are ignored" in output, "told that the settings file wins"
    assert installed.setting("APPLIANCE_ADMIN_PASSWORD") not in output, "the password is shown once only"
    data_after = file_digests(installed.data_dir)
    assert {name: data_after.get(name) for name in data_before} == data_before


def test_uninstall_keeps_data_and_settings_and_purge_removes_everything(installed: Installed) -> None:
    database = installed.data_dir / "appliance.db"
    database_before = database.read_bytes()

    run_install_sh("--uninstall", "--prefix", str(installed.prefix), "--no-systemd")
    assert not (installed.prefix / "venv").exists()
    assert not installed.command.exists()
    assert database.read_bytes() == database_before
    assert installed.env_file.is_file()

    run_install_sh("--uninstall", "--purge", "--prefix", str(installed.prefix), "--no-systemd")
    assert not installed.prefix.exists()
