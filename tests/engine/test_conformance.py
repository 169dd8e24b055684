"""Architecture conformance: a tiny random model of each family the engine serves gives transformers' greedy tokens
(float32) under preemption, chunked prefill and prefix hits, and agrees with it teacher-forced in bfloat16; a
family with a feature the engine lacks is refused at load, with the feature named."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from engine.cpu.plan import cpu_plan, this_machine
from engine.cpu.prepack import onednn_bf16
from engine.errors import ModelLoadError
from engine.messages import Logprob, RequestOutput
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import LoadedModel, random_model_dir
from engine.model.presets import build_random_model
from tests.engine.test_equivalence import Trace

CPU = torch.device("cpu")
WINDOW = 20  # not a multiple of the 16-token block: windows start mid-block
HEAD_DIM = 16
_ROPE_HALF = HEAD_DIM // 2
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0] * _ROPE_HALF,
    "long_factor": [8.0 * (i + 1) for i in range(_ROPE_HALF)],
    "original_max_position_embeddings": 40,  # prompts and continuations on both sides of it
}
SLIDING = {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama3-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "qwen2": ("qwen2", {}),
    # The engine's own forward serves Qwen2 but not its windows: this one must fall back to transformers'.
    "qwen2-sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("qwen3", {}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "phi3": ("phi3", {}),
    "phi3-longrope": ("phi3", {"rope_parameters": LONGROPE, "original_max_position_embeddings": 40}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "smollm3": ("smollm3", {"no_rope_layer_interval": 2}),
    "mistral-sliding": ("mistral", {"sliding_window": WINDOW}),
    "gemma2": ("gemma2", {**SLIDING, "attn_logit_softcapping": None, "query_pre_attn_scalar": HEAD_DIM}),
    "gemma2-softcap": ("gemma2", {**SLIDING, "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": HEAD_DIM}),
    "gemma3_text": ("gemma3_text", {**SLIDING, "query_pre_attn_scalar": HEAD_DIM}),
    "gpt_oss": (
        "gpt_oss",
        {
            **SLIDING,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
}
# Families mixing windowed and global layers: their pool is in layer groups, one layer a block here.
MIXED = ("qwen2-sliding", "gemma2", "gemma2-softcap", "gemma3_text", "gpt_oss")
# Families whose attention has a feature the kernel computes differently from the plain case: run both paths.
FEATURED = ("phi3-longrope", "qwen2-sliding", "mistral-sliding", "gemma2", "gemma2-softcap", "gemma3_text", "gpt_oss")
REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama-dynamic-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
        "'dynamic' rope scaling",
    ),
    "llama4-chunked": ("llama4_text", {"attention_chunk_size": 32}, "chunked local attention"),
    "qwen3_next-linear": ("qwen3_next", {}, "linear_attention layers"),
    "doge-dynamic-mask": ("doge", {"keep_window_size": 32}, "keep_window_size"),
}


@cache
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(random_model_dir("tiny", EngineConfig().model_cache_dir))


def hf_config(model_type: str, overrides: dict[str, Any]) -> Any:
    tok = tokenizer()
    settings: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "initializer_range": 0.2,  # peaky logits: no near-ties for float noise to flip
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    return AutoConfig.for_model(model_type, **{**settings, **overrides})


def loaded(
    name: str, dtype: torch.dtype, attention: str | None = ATTENTION_NAME, engine_config: EngineConfig | None = None
) -> LoadedModel:
    model_type, overrides = {**FAMILIES, **{k: v[:2] for k, v in REFUSED.items()}}[name]
    config = hf_config(model_type, overrides)
    model = build_random_model(config, 0, CPU, dtype, attention).eval().requires_grad_(False)
    machine = this_machine(onednn_bf16())
    plan = cpu_plan(
        engine_config or EngineConfig(), "cpu", str(dtype).removeprefix("torch."), type(model).__name__, machine
    )
    return LoadedModel(
        cpu_plan=plan,
        model=model,
        tokenizer=tokenizer(),
        name=name,
        source_dir=Path("."),
        device=CPU,
        dtype=dtype,
        quantization="none",
        weights_bytes=0,
        max_model_len=512,
        eos_token_ids=(),
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=HEAD_DIM,
    )


def engine(name: str, dtype: torch.dtype) -> EngineCore:
    config = EngineConfig(
        dtype=str(dtype).removeprefix("torch."),
        quantization="none",
        device="cpu",
        # 224 slots, fewer than the requests need together; fewer where blocks behind the window are given back;
        # the same bytes in twice the blocks where a block holds one of the two layers (engine.sched.kv_groups)
        num_kv_blocks=10 if name == "mistral-sliding" else 28 if name in MIXED else 14,
        max_num_batched_tokens=32,  # prompts of up to 80 tokens come in chunks
        max_num_seqs=6,
        own_forward=True,
    )
    return EngineCore(config, loaded=loaded(name, dtype, engine_config=config))


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(11)
    shared = [rng.randrange(100, vocab) for _ in range(36)]
    out = []
    for i, length in enumerate([3, 80, 25, 44, 60, 12, 71, 38]):
        own = [rng.randrange(100, vocab) for _ in range(length)]
        out.append((shared + own)[:length] if i % 2 else own)
    return out


@cache
def reference(name: str) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    """Prompts, transformers' greedy continuations and their tokens' log-probabilities, each prompt alone, eager
    attention, float32."""
    model = loaded(name, torch.float32, "eager").model
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=MAX_TOKENS,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    batch, tokens, logprobs = prompts(len(tokenizer())), [], []
    with torch.inference_mode():
        for p in batch:
            out = model.generate(torch.tensor([p]), generation_config=gen)
            ids = out.sequences[0, len(p) :].tolist()
            steps = torch.cat(out.logits).float().log_softmax(-1)
            tokens.append(ids)
            logprobs.append(steps[torch.arange(len(ids)), ids].tolist())
    return batch, tokens, logprobs


def generate(core: EngineCore, requests: list[tuple[str, list[int], SamplingParams]]) -> dict[str, list[Logprob]]:
    """Each request's sampled tokens with their log-probabilities, three requests arriving every two steps."""
    got: dict[str, list[Logprob]] = {}

    def collect(outputs: list[RequestOutput]) -> None:
        for o in outputs:
            got.setdefault(o.request_id, []).extend(o.logprobs or [])

    for start in range(0, len(requests), 3):
        for rid, prompt, params in requests[start : start + 3]:
            core.add_request(rid, prompt, params)
        collect(core.step())
        collect(core.step())
    while core.has_work():
        collect(core.step())
    return got


MAX_TOKENS = 20


@cache
def float32_engine(name: str) -> EngineCore:
    return engine(name, torch.float32)


CASES = [(name, "compiled") for name in FAMILIES] + [(name, "torch") for name in FEATURED]


@pytest.mark.parametrize(("name", "attention"), CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_float32_greedy_equals_transformers(name: str, attention: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A mixed family's windowed blocks go back to the pool early and are the first evicted: the second path's run
    # on the first's engine finds its shared prefixes gone, so it gets an engine of its own.
    core = engine(name, torch.float32) if attention == "torch" and name in MIXED else float32_engine(name)
    assert core.runner.decode_kernel is not None, "the compiled kernel was meant to build here (needs cc)"
    if name in ("llama", "qwen2"):
        assert core.forward is not None, "the engine's own forward was meant to serve this family"
    elif name == "qwen2-sliding":
        assert core.forward is None, "the engine's own forward has no sliding window"
    if attention == "torch":
        monkeypatch.setattr(core.runner, "decode_kernel", None)
    batch, want, want_logprobs = reference(name)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    requests = [(f"{attention}-{i}", p, params) for i, p in enumerate(batch)]
    preemptions, hits = core.scheduler.num_preemptions, core.blocks.prefix_hits
    trace = Trace(core)
    got = generate(core, requests)
    assert core.scheduler.num_preemptions > preemptions, "the pool was meant to force preemptions"
    assert trace.chunked > 0, "the token budget was meant to force chunked prefill"
    if core.rope is None:
        assert core.blocks.prefix_hits > hits, "shared prefixes were meant to hit the prefix cache"
    if name == "mistral-sliding" or name in MIXED:
        assert core.blocks.num_released_blocks > 0, "blocks behind the windowed layers' reach were meant to go back"
    assert core.blocks.num_used_blocks == 0
    tokens = [[lp.token_id for lp in got[rid]] for rid, _, _ in requests]
    same = sum(t == w for t, w in zip(tokens, want, strict=True))
    assert same == len(batch), f"{name}: {same}/{len(batch)} continuations equal transformers'"
    # Tiny random models lean on the current token; their log-probabilities show any attention difference.
    drift = max(
        abs(lp.logprob - w)
        for rid, ws in zip(want_logprobs, [got[r] for r, _, _ in requests], strict=True)
        for lp, w in zip(ws, rid, strict=True)
    )
    assert drift < 1e-3, f"{name}: log-probabilities drift {drift:.2e} from transformers'"


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_family_with_a_feature_the_engine_lacks_is_refused(name: str) -> None:
    with pytest.raises(ModelLoadError, match=REFUSED[name][2]):
        engine(name, torch.float32)


def argmaxes(model: Any, sequence: list[int], first: int, attention: str) -> list[int]:
    """transformers' greedy choice after each prefix sequence[:p], p from first on, in one forward."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = attention
    try:
        with torch.inference_mode():
            logits = model(torch.tensor([sequence])).logits[0, first - 1 : -1]
    finally:
        model.config._attn_implementation = saved
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bfloat16_teacher_forced_agrees_with_transformers(name: str) -> None:
    """At each position of transformers' float32 continuations, the engine's bf16 argmax given the same prefix
    agrees with transformers' bf16 eager one at least as often as transformers' own two ways of computing it
    (eager and SDPA where SDPA computes the model; else bf16 and float32 eager) agree with each other."""
    batch, want, _ = reference(name)
    sequences = [(p, p + w) for p, w in zip(batch, want, strict=True) if len(p) in (44, 80)]
    model = loaded(name, torch.bfloat16, "eager").model
    plain = all(f.plain for f in float32_engine(name).features.layers)
    other = "sdpa" if plain and model._supports_sdpa else "eager"
    other_model = model if other == "sdpa" else loaded(name, torch.float32, "eager").model
    core = engine(name, torch.bfloat16)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=0)
    requests = [(f"tf-{i}-{p}", seq[:p], params) for i, (prompt, seq) in enumerate(sequences)
                for p in range(len(prompt), len(seq))]  # fmt: skip
    got = generate(core, requests)
    engine_choices = [got[rid][0].token_id for rid, _, _ in requests]
    hf, floor = [], []
    for prompt, seq in sequences:
        hf += argmaxes(model, seq, len(prompt), "eager")
        floor += argmaxes(other_model, seq, len(prompt), other)
    engine_agree = sum(a == b for a, b in zip(engine_choices, hf, strict=True))
    floor_agree = sum(a == b for a, b in zip(floor, hf, strict=True))
    print(
        f"{name}: bf16 teacher-forced {engine_agree}/{len(hf)}, transformers eager vs {other} {floor_agree}/{len(hf)}"
    )
    assert engine_agree >= floor_agree - 1, f"{name}: {engine_agree}/{len(hf)} against a floor of {floor_agree}"
