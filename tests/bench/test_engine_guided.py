"""`python -m bench.engine.guided` runs and prints its figures (small: the figures themselves are the note's)."""

from __future__ import annotations

import re

import pytest

from bench.engine import guided


def test_the_guided_benchmark_prints_both_mixes_and_the_bars(capsys: pytest.CaptureFixture[str]) -> None:
    assert guided.main(["--running", "8", "--constrained", "2", "--steps", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "8 requests decoding" in out and "4 steps of each mix" in out
    plain = re.search(r"unconstrained: +([\d.]+) ms per step .* guided work +([\d.]+)", out)
    constrained = re.search(r"2 constrained: +([\d.]+) ms per step .* guided work +([\d.]+)", out)
    assert plain and constrained, out
    # Only the constrained rows do guided work; the plain mix's is the calls that find no matcher (0.00 or
    # 0.01 ms per step, as the machine's load goes).
    assert float(constrained.group(2)) > 0.0 and float(plain.group(2)) < float(constrained.group(2)) / 5, out
    assert re.search(r"overhead: [+-][\d.]+ ms per step .*throughput [\d.]+x", out), out
