"""install.sh and the scripts beside it without installing anything: shellcheck finds nothing, bad options fail
fast and say why, and uv is told where pip would install from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    called = [REPO / "appliance" / name for name in ("trim_venv.sh", "uv_pip.sh", "vllm/env.sh")]
    called.append(REPO / ".ci" / "apt-ensure")
    result = subprocess.run(
        ["shellcheck", *map(str, [INSTALL_SH, *called])], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_uv_installs_from_where_pip_would(tmp_path: Path) -> None:
    """appliance/uv_pip.sh hands uv the venv pip's settings as pip ranks them (a CPU torch on disk is found through
    find-links here), and pip's way of choosing among indexes."""
    uv = tmp_path / "uv"
    uv.write_text('#!/bin/sh\nprintf "%s\\n" "SSL_CERT_FILE=$SSL_CERT_FILE" "$@" > "$(dirname "$0")/called"\n')
    uv.chmod(0o755)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://global.example/simple\nfind-links = /wheels/global\n"
        "[install]\nindex-url = https://mirror.example/simple\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE" and not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(config), "PIP_FIND_LINKS": "/wheels/a /wheels/b",
            "PIP_CONSTRAINT": str(constraints), "PIP_CERT": "/etc/ssl/corp.pem"}  # fmt: skip
    script = REPO / "appliance" / "uv_pip.sh"
    done = subprocess.run(
        ["sh", str(script), str(uv), sys.executable, "torch==2.13.0", "-e", ".[dev]"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    called = (tmp_path / "called").read_text().splitlines()
    assert called[0] == "SSL_CERT_FILE=/etc/ssl/corp.pem"
    assert called[1:8] == [
        "pip",
        "install",
        "--quiet",
        "--python",
        sys.executable,
        "--index-strategy",
        "unsafe-best-match",
    ]
    pairs = list(zip(called[8::2], called[9::2], strict=False))
    assert ("--index-url", "https://mirror.example/simple") in pairs  # [install] over [global]
    assert ("--find-links", "/wheels/a") in pairs and ("--find-links", "/wheels/b") in pairs  # PIP_* over files
    assert not {"https://global.example/simple", "/wheels/global"} & set(called)
    assert ("--constraint", str(constraints)) in pairs
    assert called[-3:] == ["torch==2.13.0", "-e", ".[dev]"]


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
