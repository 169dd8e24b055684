"""bench/gpu.sh, the prepared GPU check, proven on the CPU: shellcheck clean, and a dry run (random:tiny) that
runs the gpu tests (skipped without CUDA) and the benchmark end to end and writes its JSON and table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu.sh"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (`make test` installs it)")
def test_the_gpu_script_is_shellcheck_clean() -> None:
    run = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_the_gpu_script_dry_run_writes_its_results(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CARRY": str(tmp_path / "no-carry")}
    run = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    assert report["dry_run"] is True and report["model"] == "random:tiny" and report["device"] == "cpu"
    assert report["capacity"]["streams_held"] == report["capacity"]["streams_sent"] == 12
    assert [r["name"] for r in report["policies"]["runs"]] == ["continuous", "static", "transformers-cb"]
    assert all(r["output_tokens"] > 0 for r in report["policies"]["runs"])
    assert set(report["bars"]) == {"100 streams held", "continuous >= 3x static", "continuous >= 1.5x transformers-cb"}
    assert report["memory"]["weights_bytes"] > 0 and report["memory"]["kv_pool_bytes"] > 0
    table = (out / "gpu.txt").read_text()
    assert "DRY RUN" in table and "streams held: 12 of 12" in table and "continuous/static tok/s" in table
    tests = (out / "gpu-tests.txt").read_text()
    if not torch.cuda.is_available():
        assert "skipped" in tests and "failed" not in tests


def test_the_gpu_benchmark_refuses_to_run_without_cuda_unless_dry() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    run = subprocess.run([sys.executable, "-m", "bench.engine.gpu"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--dry-run" in run.stderr
