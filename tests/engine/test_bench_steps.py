"""`python -m engine.bench.steps` measures each group cost on one engine per batch, over long-tailed contexts."""

from __future__ import annotations

import pytest

from engine.bench import steps


def test_each_group_cost_is_a_row_with_a_cell_per_batch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "random:tiny", "--variants", "none/float32", "--batches", "2,5", "--steps", "2"]
    assert steps.main([*argv, "--context", "40", "--sigma", "1.0", "--group-costs", "one,0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "|" in line]
    assert [row.split("|")[0].strip() for row in rows[1:]] == ["none/float32 g=one", "none/float32 g=0"]
    assert all(row.count("ms") == 2 for row in rows[1:])


def test_long_tailed_contexts_are_seeded_and_spread() -> None:
    base = steps.EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", cpu_threads=1)
    lengths = [r.num_prompt_tokens for r in steps.decoding_core(base, 6, 40, 2, sigma=1.0).scheduler.running]
    again = [r.num_prompt_tokens for r in steps.decoding_core(base, 6, 40, 2, sigma=1.0).scheduler.running]
    assert sorted(lengths) == sorted(again) and len(set(lengths)) > 3
