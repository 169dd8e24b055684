"""The engine on CUDA: greedy equivalence with transformers' generate, bitsandbytes nf4/int8, the KV pool under a
memory cap. Marked `gpu` and skipped without a CUDA device; `bench/gpu.sh` runs them on a GPU machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, EngineConfig, SamplingParams
from engine.model.presets import PRESETS
from tests.engine.test_equivalence import reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
GIB = 1 << 30


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_equals_transformers_generate_on_cuda(dtype: str) -> None:
    """A batch with chunked prefill and a small pool (so preemption happens) matches generate token for token in
    fp32; in bf16 the first tokens must match (rounding may flip a later near-tie)."""
    llm = LLM(
        EngineConfig(
            model="random:tiny", quantization="none", device="cuda", dtype=dtype, num_kv_blocks=24,
            max_num_batched_tokens=64, max_num_seqs=8,
        )
    )  # fmt: skip
    prompts = [[100 + (i * 37 + j * 11) % 40000 for j in range(5 + 23 * i)] for i in range(8)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        expected = reference(llm.core, prompt, 24, ignore_eos=True)
        if dtype == "float32":
            assert result.token_ids == expected
        else:
            assert result.token_ids[:4] == expected[:4]
    assert llm.core.scheduler.num_preemptions > 0


@needs_bnb
@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_bitsandbytes_on_cuda_loads_smaller_and_generates(quantization: str) -> None:
    llm = LLM(EngineConfig(model="random:llama-1b", quantization=quantization, device="cuda", num_kv_blocks=256))
    loaded = llm.core.loaded
    assert loaded.dtype == torch.bfloat16 and loaded.quantization == quantization
    with torch.device("meta"):  # the unquantized parameter count (a packed 4-bit tensor holds two per element)
        count = sum(
            p.numel()
            for p in AutoModelForCausalLM.from_config(PRESETS["llama-1b"].hf_config(llm.tokenizer)).parameters()
        )
    # bf16 would be 2 bytes each; the embeddings (0.1 of 1.2 B) stay 16-bit, the projections shrink 4x or 2x.
    assert loaded.weights_bytes < count * 2 * (0.4 if quantization == "nf4" else 0.65)
    out = llm.generate([[100, 200, 300, 400]], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 16


def test_kv_pool_stays_under_the_memory_cap() -> None:
    cap = 4 * GIB  # llama-1b in bf16 is about 2.3 GiB of weights
    llm = LLM(EngineConfig(model="random:llama-1b", quantization="none", device="cuda", gpu_memory_cap_bytes=cap))
    stats = llm.core.stats()
    assert stats.memory_kind == "VRAM"
    assert stats.kv_pool_bytes > 0
    assert stats.weights_bytes + stats.kv_pool_bytes <= cap
    assert torch.cuda.max_memory_reserved() <= cap * 1.05
