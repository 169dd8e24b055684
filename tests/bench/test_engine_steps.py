"""`python -m bench.engine.steps` measures each decode attention on one engine per batch, over long-tailed
contexts."""

from __future__ import annotations

import pytest

from bench.engine import steps


def test_each_decode_attention_is_a_row_with_a_cell_per_batch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "random:tiny", "--variants", "none/float32", "--batches", "2,5", "--steps", "2"]
    attentions = ["compiled", "torch/one", "torch/0", "torch"]
    assert steps.main([*argv, "--context", "40", "--sigma", "1.0", "--attention", ",".join(attentions)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "|" in line]
    assert [row.split("|")[0].strip() for row in rows[1:]] == [f"none/float32 {a}" for a in attentions]
    assert all(row.count("ms") == 2 for row in rows[1:])


def test_an_unknown_attention_is_refused() -> None:
    argv = ["--model", "random:tiny", "--variants", "none/float32", "--batches", "2", "--steps", "1"]
    with pytest.raises(SystemExit, match="torch/one"):
        steps.main([*argv, "--attention", "flash"])


def test_long_tailed_contexts_are_seeded_and_spread() -> None:
    base = steps.EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", cpu_threads=1)
    lengths = [r.num_prompt_tokens for r in steps.decoding_core(base, 6, 40, 2, sigma=1.0).scheduler.running]
    again = [r.num_prompt_tokens for r in steps.decoding_core(base, 6, 40, 2, sigma=1.0).scheduler.running]
    assert sorted(lengths) == sorted(again) and len(set(lengths)) > 3
