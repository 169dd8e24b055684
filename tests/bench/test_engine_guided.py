"""`python -m bench.engine.guided` runs and prints its figures (small: the figures themselves are the note's)."""

from __future__ import annotations

import re

import pytest

from bench.engine import guided


def test_the_guided_benchmark_prints_both_mixes_and_the_bars(capsys: pytest.CaptureFixture[str]) -> None:
    assert guided.main(["--running", "8", "--constrained", "2", "--steps", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "8 requests decoding" in out and "4 steps of each mix" in out
    row = r" +([\d.]+) ms per step .* guided work +([\d.]+) ms per step on (\d+) constrained row"
    plain = re.search("unconstrained:" + row, out)
    constrained = re.search("2 constrained:" + row, out)
    assert plain and constrained, out
    # Only the constrained rows do guided work (its time is the machine's to vary: the rows are counted).
    assert plain.group(3) == "0" and constrained.group(3) == "2" and float(constrained.group(2)) > 0.0, out
    assert re.search(r"overhead: [+-][\d.]+ ms per step .*throughput [\d.]+x", out), out
