"""Log lines as the operator reads them: syslog priorities and no doubled timestamp when stderr is the journal,
timestamped lines elsewhere; the engine process logs at APPLIANCE_LOG_LEVEL like the server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.settings import load_settings
from appliance.wiring import engine_config
from engine import ConfigError, EngineConfig

REPO = Path(__file__).resolve().parents[2]
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
SERVER_LOGS = """
import logging
from appliance.serve import configure_logging
configure_logging("info")
log = logging.getLogger("appliance.demo")
log.debug("not shown at info")
log.info("listening")
log.warning("slow disk")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("it broke")
"""
HUB_KERNEL_HINT = """
import logging
from engine.logs import configure_logging
configure_logging("info")
import bitsandbytes  # on a CPU with AVX512-BF16 its CPU backend warns, at import, that `kernels` is missing
cpu_ops = logging.getLogger("bitsandbytes.backends.cpu.ops")
cpu_ops.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "No module named 'kernels'")
cpu_ops.warning("another warning of that backend")
"""
ENGINE_LOGS = """
import multiprocessing, sys
from engine.config import EngineConfig
from engine.process import run_engine_process
inbox, closed = multiprocessing.Pipe(duplex=False)
replies, outbox = multiprocessing.Pipe(duplex=False)
closed.close()  # the engine reads EOF right after it says Ready, and ends
config = EngineConfig(model="random:tiny", quantization="none", device="cpu", num_kv_blocks=32, log_level=sys.argv[1])
run_engine_process(config, inbox, outbox)
"""


def run_python(code: str, stderr: Path, *args: str, journal_of: Path | None = None) -> str:
    """Run `code` with stderr into a file; JOURNAL_STREAM names `journal_of`'s device and inode, as systemd
    names the journal's socket."""
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM" and not k.startswith("APPLIANCE_")}
    with stderr.open("wb") as err:
        if journal_of is not None:
            stat = os.stat(journal_of)
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
        subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, stderr=err, check=True, timeout=300)
    return stderr.read_text()


def test_journal_lines_carry_priorities_and_no_timestamp(tmp_path: Path) -> None:
    log = tmp_path / "journal"
    log.touch()
    lines = run_python(SERVER_LOGS, log, journal_of=log).splitlines()
    assert lines[:3] == ["<6>appliance.demo: listening", "<4>appliance.demo: slow disk", "<3>appliance.demo: it broke"]
    assert lines[3] == "<3>Traceback (most recent call last):", "every line of a traceback is an error"
    assert all(line.startswith("<3>") for line in lines[3:]) and lines[-1] == "<3>ZeroDivisionError: division by zero"
    assert not any(TIMESTAMP.search(line) for line in lines), "journald stamps the time itself"


def test_lines_elsewhere_are_plain_and_timestamped(tmp_path: Path) -> None:
    other = tmp_path / "journal-of-the-parent"
    other.touch()  # a child whose stderr was redirected inherits JOURNAL_STREAM: it names another file
    lines = run_python(SERVER_LOGS, tmp_path / "stderr", journal_of=other).splitlines()
    assert TIMESTAMP.match(lines[0]) and lines[0].endswith(" INFO appliance.demo: listening"), lines[0]
    assert not any(line.startswith("<") for line in lines)


def test_bitsandbytes_hint_to_fetch_hub_kernels_is_left_out(tmp_path: Path) -> None:
    """Its advice (install `kernels`, code fetched from the Hugging Face Hub at run time) has no place in the log
    of an appliance that runs offline; the backend's other warnings stay."""
    lines = run_python(HUB_KERNEL_HINT, tmp_path / "stderr").splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["another warning of that backend"]


def test_the_engine_process_logs_at_the_configured_level(tmp_path: Path) -> None:
    assert "engine ready" in run_python(ENGINE_LOGS, tmp_path / "info", "info")
    quiet = run_python(ENGINE_LOGS, tmp_path / "warning", "warning")
    assert " INFO " not in quiet and "engine ready" not in quiet, quiet


def test_the_log_level_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = load_settings({"APPLIANCE_LOG_LEVEL": "debug", "APPLIANCE_DATA_DIR": str(tmp_path)})
    assert engine_config(settings).log_level == "debug"
    with pytest.raises(ConfigError, match="log_level"):
        EngineConfig(log_level="loud")
