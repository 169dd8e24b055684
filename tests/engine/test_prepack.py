"""bf16 linear layers prepacked for oneDNN (engine/cpu/prepack.py) give the engine the same greedy tokens as plain
ones, and every plain linear layer is replaced (on a CPU whose torch has oneDNN's bf16 path; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import EngineConfig, SamplingParams
from engine.cpu.plan import Linears
from engine.cpu.prepack import PrepackedLinear, onednn_bf16, prepack_linears
from engine.llm import LLM

pytestmark = pytest.mark.skipif(not onednn_bf16(), reason="this CPU's torch has no oneDNN bf16 linear")
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], list(range(40, 90))]


def _llm(prepack: bool) -> LLM:
    config = EngineConfig(model="random:tiny", quantization="none", dtype="bfloat16", device="cpu", prepack=prepack)
    return LLM(config)


def test_prepacked_layers_give_the_plain_layers_greedy_tokens() -> None:
    plain, packed = _llm(prepack=False), _llm(prepack=True)
    assert (plain.core.cpu_plan.linears.choice, packed.core.cpu_plan.linears.choice) == (
        Linears.PLAIN,
        Linears.PREPACKED,
    )
    # Random weights: no GGUF blocks to keep beside oneDNN's layout (engine.cpu.split_linear), and the plan says so.
    assert "no layer kept blocks the compact kernel multiplies" in packed.core.cpu_plan.linears.reason
    linears = [m for m in plain.core.loaded.model.modules() if type(m) is nn.Linear]
    assert linears and not any(isinstance(m, PrepackedLinear) for m in plain.core.loaded.model.modules())
    assert sum(isinstance(m, PrepackedLinear) for m in packed.core.loaded.model.modules()) == len(linears)
    assert not [m for m in packed.core.loaded.model.modules() if type(m) is nn.Linear]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = [r.token_ids for r in plain.generate(PROMPTS, params)]
    assert [r.token_ids for r in packed.generate(PROMPTS, params)] == expected


def test_only_plain_bf16_linears_are_replaced() -> None:
    class Quantized(nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    model = nn.Sequential(
        nn.Linear(16, 32, dtype=torch.bfloat16),
        nn.Linear(32, 8, bias=False, dtype=torch.bfloat16),
        nn.Linear(8, 8),  # float32
        Quantized(8, 8, dtype=torch.bfloat16),
    )
    probe = torch.randn(5, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        before = model[1](model[0](probe))
    assert prepack_linears(model) == 2
    assert [type(m).__name__ for m in model] == ["PrepackedLinear", "PrepackedLinear", "Linear", "Quantized"]
    with torch.inference_mode():
        assert torch.equal(model[1](model[0](probe)), before)
        assert model[0](probe.view(1, 5, 16)).shape == (1, 5, 32)
