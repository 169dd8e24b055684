"""The systemd unit and its example env file: systemd accepts the unit, its exposure rating stays at 3.0 or
lower without hiding the GPU, stopping leaves time to drain, and the env file holds only known settings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.connections import RESERVED_FILES
from appliance.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "appliance.service"
ENV_EXAMPLE = REPO / "systemd" / "appliance.env.example"
MAX_EXPOSURE = 3.0

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (apt package systemd; `make test` installs it in CI)",
)


def service_settings() -> dict[str, list[str]]:
    """The [Service] section as key -> values (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.fixture
def checkable_unit(tmp_path: Path) -> Path:
    """A copy of the unit whose ExecStart runs /bin/true: `systemd-analyze verify` fails when the ExecStart
    binary is missing, and /opt/llm-appliance/venv/bin/appliance only exists on an installed machine."""
    text = UNIT.read_text()
    checked, count = re.subn(r"^ExecStart=\S+", "ExecStart=/bin/true", text, flags=re.MULTILINE)
    assert count == 1
    path = tmp_path / "appliance.service"
    path.write_text(checked)
    return path


@needs_systemd_analyze
def test_systemd_accepts_the_unit(checkable_unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(checkable_unit)], capture_output=True, text=True, timeout=60
    )
    # verify reports unknown or misspelt settings as warnings, with exit status 0, naming the file.
    complaints = [line for line in result.stderr.splitlines() if str(checkable_unit) in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []


@needs_systemd_analyze
def test_unit_exposure_is_at_most_3(checkable_unit: Path) -> None:
    help_text = subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True).stdout
    if "--offline" not in help_text:
        pytest.skip("this systemd-analyze (older than systemd 250) cannot rate a unit file offline")
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(checkable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_hardening_keeps_the_gpu_reachable() -> None:
    service = service_settings()
    # PrivateDevices hides /dev/nvidia*; a device allow-list (also implied by ProtectClock) blocks them;
    # PyTorch and CUDA need writable-executable memory for their JIT.
    for hides_the_gpu in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute"):
        assert hides_the_gpu not in service, f"{hides_the_gpu}= would break GPU inference"


def test_stopping_leaves_time_to_drain() -> None:
    service = service_settings()
    assert service["TimeoutStopSec"] == ["60"]
    assert Settings().drain_timeout < 60
    # Only the main process gets SIGTERM; the engine process must live on until the drain is over.
    assert service["KillMode"] == ["mixed"]


def test_example_env_file_is_accepted_by_the_appliance() -> None:
    settings = load_settings({"APPLIANCE_ENV_FILE": str(ENV_EXAMPLE)})
    state_directory = service_settings()["StateDirectory"][0]
    assert settings.data_dir == f"/var/lib/{state_directory}"
    assert service_settings()["EnvironmentFile"] == ["-/etc/llm-appliance/appliance.env"]


def test_open_files_allow_every_connection() -> None:
    """Each HTTP connection is a file: the unit's LimitNOFILE must hold the connection cap and the process's own
    files, or the service keeps systemd's soft default of 1,024 (issue 17, S1)."""
    limit = service_settings().get("LimitNOFILE", ["1024"])
    assert int(limit[0]) >= Settings().max_connections + RESERVED_FILES


def test_compiled_kernels_are_kept_in_the_units_cache_directory() -> None:
    """engine.cpu.kernel_build keeps what it builds under $XDG_CACHE_HOME/llm-appliance; the unit makes that a
    directory of the service's own, the only writable place besides the state directory."""
    service = service_settings()
    environment = dict(item.split("=", 1) for item in service["Environment"])
    assert environment["XDG_CACHE_HOME"] == "/var/cache"
    assert service["CacheDirectory"] == ["llm-appliance"] and service["CacheDirectoryMode"] == ["0700"]
