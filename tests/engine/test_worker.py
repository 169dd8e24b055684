"""The worker processes' entry point (`python -m engine.worker`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTS_AND_ENDS = """
import sys
from engine.worker import start_worker
worker, inbox, outbox = start_worker("tests.engine.triton_worker:run", None)
worker.join(120)
sys.exit(worker.exitcode)
"""


def test_a_worker_starts_without_runpys_double_import_warning() -> None:
    """`python -m engine.worker` imports the engine package first; had that imported engine.worker, runpy would run
    it again as __main__ and print a RuntimeWarning at every engine start. As an error here: a worker whose
    config pipe (stdin, /dev/null) closes before it is sent exits 0."""
    command = [sys.executable, "-W", "error::RuntimeWarning", "-m", "engine.worker"]
    run = subprocess.run(
        [*command, "engine.process:run_engine_process", "0", "1"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_a_worker_ends_without_nanobinds_leak_report() -> None:
    """A worker freezes its heap after its imports; left frozen at exit, what triton's bindings made is never freed
    and nanobind lists it as leaked ("a reference counting issue"), some thirty lines at every engine stop."""
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-c", STARTS_AND_ENDS], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "leaked" not in run.stderr, run.stderr
