"""install.sh without installing anything: shellcheck finds nothing, and bad options fail fast and say why."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL_SH = REPO / "install.sh"


def run_install_sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL_SH), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed (apt package shellcheck; `make test` installs it in CI)",
)
def test_shellcheck_finds_nothing() -> None:
    """In install.sh and the scripts it and `make` run."""
    called = [REPO / "appliance" / "trim_venv.sh", REPO / "appliance" / "vllm" / "env.sh", REPO / ".ci" / "apt-ensure"]
    result = subprocess.run(
        ["shellcheck", *map(str, [INSTALL_SH, *called])], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_help_lists_the_options() -> None:
    result = run_install_sh("--help")
    assert result.returncode == 0
    options = ("--prefix", "--no-systemd", "--uninstall", "--purge", "--source", "--port", "--host", "--model")
    for option in (*options, "--engine"):
        assert option in result.stdout


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--frobnicate"], "unknown option: --frobnicate"),
        (["--no-systemd", "--purge"], "--purge goes with --uninstall"),
        (["--no-systemd", "--port", "70000"], "--port must be between 1 and 65535"),
        (["--no-systemd", "--port", "http"], "--port must be a number"),
        (["--no-systemd", "--prefix", "/tmp/with space"], "--prefix may hold only"),
        (["--no-systemd", "--quantization", "q3"], "--quantization must be auto, none, nf4, fp4 or int8"),
        (["--no-systemd", "--model"], "--model needs a value"),
        (["--no-systemd", "--engine", "tgi"], "--engine must be embedded or vllm"),
    ],
)
def test_bad_options_stop_before_anything_is_touched(args: list[str], complaint: str) -> None:
    result = run_install_sh(*args)
    assert result.returncode == 2
    assert complaint in result.stderr


def test_a_source_that_is_not_the_appliance_is_refused(tmp_path: Path) -> None:
    result = run_install_sh("--no-systemd", "--prefix", str(tmp_path / "prefix"), "--source", str(tmp_path))
    assert result.returncode == 1
    assert "is not the appliance's source tree" in result.stderr
    assert not (tmp_path / "prefix").exists()
