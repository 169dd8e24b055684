"""`python -m bench.engine`'s overhead probe splits a decode step into the forward, sampling and bookkeeping,
whichever forward the engine runs."""

from __future__ import annotations

import pytest

from bench.engine.runs import measure_overhead
from engine.config import EngineConfig
from engine.model.loader import load_model


@pytest.mark.parametrize("own_forward", [True, False], ids=["own forward", "transformers' forward"])
def test_the_forward_is_timed_whichever_runs(own_forward: bool) -> None:
    config = EngineConfig(
        model="random:tiny", quantization="none", dtype="float32", device="cpu", cpu_threads=1, own_forward=own_forward
    )
    probe = measure_overhead(load_model(config), config, running=4, steps=3)
    assert probe["forward_ms"] > 0 and probe["sampling_ms"] > 0 and probe["bookkeeping_ms"] > 0
    assert probe["step_ms"] == pytest.approx(probe["forward_ms"] + probe["overhead_ms"])
    assert probe["overhead_ms"] == pytest.approx(probe["sampling_ms"] + probe["bookkeeping_ms"])
