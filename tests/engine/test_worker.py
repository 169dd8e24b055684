"""The worker processes' entry point (`python -m engine.worker`)."""

from __future__ import annotations

import subprocess
import sys


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
