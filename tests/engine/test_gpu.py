"""The engine on CUDA: greedy equivalence with transformers' generate, bitsandbytes nf4/int8, the KV pool under a
memory cap, the 8-bit KV pool (read by the grouped decode path, twice the tokens in the same memory, the CPU's
tokens), a GGUF quantized by bitsandbytes as it streams. Marked `gpu` and skipped without a CUDA device;
`bench/gpu.sh` runs them on a GPU machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, EngineConfig, SamplingParams
from engine.model import loader
from engine.model.attention import DecodeGroup, _decode_attention
from engine.model.gguf_source import converted_gguf
from engine.model.kv_cache import rotate_queries
from engine.model.presets import PRESETS
from tests.engine.test_equivalence import reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
GIB = 1 << 30
CPU = torch.device("cpu")


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


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_the_grouped_decode_path_reads_an_8bit_pool_on_cuda(dtype: torch.dtype) -> None:
    """The decode attention CUDA runs, over a pool quantized as the engine stores it, against the exact answer
    (the pool dequantized, on the CPU)."""
    from tests.engine.test_kv_8bit import dequantized_pool

    lens = [70, 33, 16, 2]
    q, (kc, vc, ks, vs), (k_exact, v_exact), tables = dequantized_pool(dtype, lens, seed=1)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    cuda = torch.device("cuda")
    qr = rotate_queries(q) if dtype is torch.int8 else q
    group = DecodeGroup.build(0, padded, lens, 16, cuda)
    on_gpu = [t.to(cuda) for t in (qr.transpose(0, 1).contiguous(), kc, vc, ks, vs)]
    out = _decode_attention(on_gpu[0], on_gpu[1], on_gpu[2], group, 16, None, k_scale=on_gpu[3], v_scale=on_gpu[4])
    exact = _decode_attention(
        q.transpose(0, 1), k_exact, v_exact, DecodeGroup.build(0, padded, lens, 16, CPU), 16, None
    )
    torch.testing.assert_close(out.cpu(), exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_an_8bit_pool_on_cuda_holds_twice_the_tokens_and_decodes_as_the_cpu_does(kv: str) -> None:
    cap = 4 * GIB
    sixteen = LLM(EngineConfig(model="random:llama-1b", quantization="none", device="cuda", gpu_memory_cap_bytes=cap))
    blocks16 = sixteen.core.kv.num_blocks
    del sixteen
    torch.cuda.empty_cache()
    eight = LLM(
        EngineConfig(
            model="random:llama-1b", quantization="none", device="cuda", gpu_memory_cap_bytes=cap, kv_cache_dtype=kv
        )
    )
    assert eight.core.kv.quantized and eight.core.kv.num_blocks >= 1.9 * blocks16, (eight.core.kv.num_blocks, blocks16)
    del eight
    torch.cuda.empty_cache()
    # Random tiny weights in float32 with preemption and chunked prefill: the same quantized pool on either device.
    prompts = [[100 + (i * 37 + j * 11) % 40000 for j in range(5 + 23 * i)] for i in range(8)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    runs = {}
    for device in ("cuda", "cpu"):
        llm = LLM(
            EngineConfig(
                model="random:tiny", quantization="none", device=device, dtype="float32", num_kv_blocks=24,
                max_num_batched_tokens=64, max_num_seqs=8, kv_cache_dtype=kv,
            )
        )  # fmt: skip
        runs[device] = [r.token_ids for r in llm.generate(prompts, params)]
        assert llm.core.scheduler.num_preemptions > 0
    same = sum(a == b for a, b in zip(runs["cuda"], runs["cpu"], strict=True))
    print(f"{kv}: {same} of {len(prompts)} sequences identical on CUDA and the CPU")
    assert same >= len(prompts) - 1, runs


TINY = (256, 512, 2, 4, 2)  # hidden, ffn, layers, heads, kv heads


@needs_bnb
@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_a_gguf_streams_into_bitsandbytes_on_cuda_as_from_pretrained_quantizes_it(
    quantization: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from bench.gguf_load import q4_k_m, write_random_llama

    folder = tmp_path_factory.mktemp("gguf")
    gguf = folder / "tiny.Q4_K_M.gguf"
    write_random_llama(gguf, TINY, q4_k_m)
    config = EngineConfig(
        model=str(gguf), cache_dir=str(folder / "cache"), quantization=quantization, dtype="bfloat16", device="cuda"
    )
    torch.cuda.reset_peak_memory_stats()
    messages: list[str] = []
    streamed = loader.load_model(config, messages.append)
    assert not any("converting" in m for m in messages), messages
    source = converted_gguf(gguf, folder / "converted", messages.append)
    whole = loader._from_pretrained(source, quantization, torch.device("cuda"), torch.bfloat16, None, messages.append)
    ours, theirs = streamed.model.state_dict(), whole.state_dict()
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k].cpu(), theirs[k].cpu())] == []
