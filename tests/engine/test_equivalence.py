"""The engine's greedy output equals transformers' generate, token for token, under preemption,
chunked prefill and prefix-cache hits, with requests arriving at different steps."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from transformers import GenerationConfig, PreTrainedModel

from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from engine.cpu.packed_linear import PackedLinear
from engine.messages import RequestOutput
from engine.model import runner as runner_module
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import load_model
from engine.sched.scheduler import SchedulerOutput


def reference(
    core: EngineCore, prompt: list[int], max_tokens: int, ignore_eos: bool, model: PreTrainedModel | None = None
) -> list[int]:
    """Greedy continuation of one prompt alone, by transformers' own generate with its own attention (on the
    engine's model, or on `model`, the same weights loaded without the engine's changes to its layers)."""
    model = model or core.loaded.model
    paged = model.config._attn_implementation
    model.config._attn_implementation = "sdpa"
    try:
        gen = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_tokens,
            eos_token_id=None if ignore_eos else list(core.loaded.eos_token_ids),
            pad_token_id=0,
        )
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt], device=core.loaded.device), generation_config=gen)
    finally:
        model.config._attn_implementation = paged
    return out[0, len(prompt) :].tolist()


class Trace:
    """Records what the scheduler did, to prove the hard paths really ran."""

    def __init__(self, core: EngineCore) -> None:
        self.chunked = 0
        inner = core.scheduler.schedule

        def schedule() -> SchedulerOutput:
            out = inner()
            for s in out.scheduled:
                remaining = s.request.num_tokens - s.request.num_computed_tokens
                if s.num_new_tokens < remaining:
                    self.chunked += 1
            return out

        core.scheduler.schedule = schedule  # type: ignore[method-assign]


def run(core: EngineCore, batches: Iterator[list[tuple[str, list[int], SamplingParams]]]) -> dict[str, list[int]]:
    """Add each batch of requests one step after the previous, then run to completion."""
    tokens: dict[str, list[int]] = {}

    def collect(outputs: list[RequestOutput]) -> None:
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.token_ids)

    for batch in batches:
        for rid, prompt, params in batch:
            core.add_request(rid, prompt, params)
        collect(core.step())
        collect(core.step())
    while core.has_work():
        collect(core.step())
    return tokens


@pytest.fixture(scope="module")
def tiny_core() -> EngineCore:
    config = EngineConfig(
        model="random:tiny",
        quantization="none",
        dtype="float32",
        device="cpu",
        num_kv_blocks=48,  # 768 token slots: far fewer than 32 requests need together
        max_num_batched_tokens=64,  # forces long prompts into chunks
        max_num_seqs=16,
    )
    return EngineCore(config)


@pytest.fixture(scope="module")
def tiny_references() -> dict[tuple[tuple[int, ...], int], list[int]]:
    """transformers' greedy tokens on tiny_core's model by (prompt, max_tokens), made once: each attention the test
    below tries changes only the engine's runner, not the model reference() runs."""
    return {}


@pytest.mark.parametrize(
    "attention", ["compiled", "torch", "torch/0"], ids=["compiled", "torch-default-groups", "torch-a-group-per-length"]
)
def test_greedy_matches_transformers_under_preemption_chunking_and_prefix_hits(
    tiny_core: EngineCore,
    tiny_references: dict[tuple[tuple[int, ...], int], list[int]],
    attention: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups: list[int] = []
    plan = runner_module.plan_decode_groups

    def counted(num_blocks: list[int], cost: int) -> list[tuple[int, int]]:
        planned = plan(num_blocks, cost)
        groups.append(len(planned))
        return planned

    monkeypatch.setattr(runner_module, "plan_decode_groups", counted)
    if attention == "compiled":
        assert tiny_core.runner.decode_kernel is not None, "the decode kernel was meant to build here (needs cc)"
    else:
        monkeypatch.setattr(tiny_core.runner, "decode_kernel", None)
    if attention == "torch/0":
        monkeypatch.setattr(tiny_core.runner, "group_cost", 0)
    rng = random.Random(7)
    vocab = tiny_core.vocab_size
    shared = [rng.randrange(100, vocab) for _ in range(80)]
    requests = []
    for i in range(32):
        length = rng.choice([1, 5, 17, 40, 64, 120, 200, 300])
        prompt = [rng.randrange(100, vocab) for _ in range(length)]
        if i % 3 == 0:
            prompt = shared + prompt[: max(0, length - 80)]
        max_tokens = rng.choice([1, 2, 10, 50, 120, 200])
        max_tokens = min(max_tokens, 48 * 16 - len(prompt))
        requests.append((f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
    trace = Trace(tiny_core)
    batches = iter([requests[i : i + 4] for i in range(0, 32, 4)])
    got = run(tiny_core, batches)

    assert tiny_core.scheduler.num_preemptions > 0, "the pool was meant to force preemptions"
    assert trace.chunked > 0, "the token budget was meant to force chunked prefill"
    assert tiny_core.blocks.prefix_hits > 0, "shared prefixes were meant to hit the prefix cache"
    if attention == "torch/0":
        assert max(groups) > 3, "decodes of different lengths were meant to attend in several groups"
    assert (groups == []) == (attention == "compiled"), "the compiled kernel was meant to attend with no groups"
    for rid, prompt, params in requests:
        key = (tuple(prompt), params.max_tokens)
        if key not in tiny_references:
            tiny_references[key] = reference(tiny_core, prompt, params.max_tokens, ignore_eos=True)
        assert got[rid] == tiny_references[key], f"{rid} (prompt {len(prompt)} tokens) diverged"
    assert tiny_core.blocks.num_used_blocks == 0


def test_second_family_qwen2_matches_transformers() -> None:
    core = EngineCore(
        EngineConfig(model="random:tiny-qwen2", quantization="none", dtype="float32", device="cpu", num_kv_blocks=64)
    )
    rng = random.Random(3)
    requests = [
        (
            f"q{i}",
            [rng.randrange(100, core.vocab_size) for _ in range(n)],
            SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
        )
        for i, (n, m) in enumerate([(3, 30), (50, 20), (130, 40), (9, 60)])
    ]
    got = run(core, iter([requests[:2], requests[2:]]))
    for rid, prompt, params in requests:
        assert got[rid] == reference(core, prompt, params.max_tokens, ignore_eos=True)


def test_default_model_chat_prompts_match_transformers() -> None:
    """The bundled model as served (its linear layers packed, engine.cpu.packed_linear) against transformers'
    generate on the same weights as transformers loads them, in float32."""
    config = EngineConfig(model="default", quantization="none", dtype="float32", device="cpu")
    core = EngineCore(config)
    assert any(isinstance(m, PackedLinear) for m in core.loaded.model.modules())
    plain = load_model(replace(config, compact_weights=False), attn_implementation=ATTENTION_NAME).model
    assert not any(isinstance(m, PackedLinear) for m in plain.modules())
    chats = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colours.",
        "Explain what a CPU does in one sentence.",
    ]
    requests = []
    for i, text in enumerate(chats):
        ids = core.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
        requests.append((f"c{i}", ids, SamplingParams(max_tokens=24, temperature=0.0)))
    got = run(core, iter([requests]))
    for rid, prompt, params in requests:
        assert got[rid] == reference(core, prompt, params.max_tokens, ignore_eos=False, model=plain)


def test_prompt_tokens_count_when_prefill_ends_not_when_the_request_does(tiny_core: EngineCore) -> None:
    """Issue 16: vLLM's prompt_tokens counter rises as prefills run, so a long generation's prompt shows at once."""
    before = tiny_core.stats().prompt_tokens_total
    tiny_core.add_request("prefill-count", list(range(100, 150)), SamplingParams(max_tokens=40, ignore_eos=True))
    while not any(out.token_ids for out in tiny_core.step()):
        pass
    assert tiny_core.stats().prompt_tokens_total == before + 50  # counted at its first token, 39 to go
    while tiny_core.has_work():
        tiny_core.step()
    assert tiny_core.stats().prompt_tokens_total == before + 50  # and not once more when it finished
