"""Sampling through the whole engine: seeds reproduce, top-k/top-p cut, logprobs, stop strings and tokens,
and the quantized default model still knows its capitals."""

from __future__ import annotations

import math

import pytest
import torch

from engine import LLM, EngineConfig, InvalidRequestError, SamplingParams
from engine.sample.sampler import sample


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(EngineConfig(model="random:tiny", quantization="none", device="cpu", num_kv_blocks=512))


def test_same_seed_same_text_whatever_shares_the_batch(llm: LLM) -> None:
    seeded = SamplingParams(max_tokens=30, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate(["Once upon a time"], seeded)[0]
    other = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)
    crowded = llm.generate(["noise " * 5, "Once upon a time", "more noise"], [other, seeded, other])[1]
    assert alone.token_ids == crowded.token_ids and len(alone.token_ids) == 30
    different = llm.generate(["Once upon a time"], SamplingParams(max_tokens=30, seed=99, ignore_eos=True))[0]
    assert different.token_ids != alone.token_ids


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = llm.generate(["The sea"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    top1 = llm.generate(["The sea"], SamplingParams(max_tokens=20, temperature=1.5, top_k=1, ignore_eos=True))[0]
    assert top1.token_ids == greedy.token_ids


def test_greedy_rows_pick_the_first_maximum_among_mixed_rows() -> None:
    """The CPU greedy path (numpy's argmax) agrees with torch's, ties included, when sampled rows share the batch."""
    torch.manual_seed(0)
    logits = torch.randn(64, 4096)
    logits[5, [7, 9, 4000]] = 50.0  # a three-way tie: the first index wins
    logits[6, :] = 1.0  # all equal: index 0
    params = [SamplingParams(temperature=0.0) if i % 3 else SamplingParams(temperature=1.0) for i in range(64)]
    ids = sample(logits, params, [None] * 64).token_ids
    expected = logits.argmax(dim=-1).tolist()
    assert [ids[i] for i in range(64) if i % 3] == [expected[i] for i in range(64) if i % 3]
    assert ids[5] == 7 and ids[7] == expected[7]
    assert sample(logits[6:7], [SamplingParams(temperature=0.0)], [None]).token_ids == [0]


def test_top_k_and_top_p_restrict_the_draw() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 400)
    gens = [None] * 400
    drawn = sample(logits, [SamplingParams(temperature=1.0, top_k=2)] * 400, gens).token_ids
    assert set(drawn) == {0, 1}
    # softmax: p0 = 0.64, p1 = 0.24: top_p 0.7 keeps exactly the first two.
    drawn = sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)] * 400, gens).token_ids
    assert set(drawn) == {0, 1}
    drawn = sample(logits, [SamplingParams(temperature=1.0, top_p=0.5)] * 400, gens).token_ids
    assert set(drawn) == {0}


def test_logprobs_are_normalised_and_ranked(llm: LLM) -> None:
    out = llm.generate(["Hello"], SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, ignore_eos=True))[0]
    assert len(out.logprobs) == 5
    for token_id, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == token_id and lp.logprob <= 0.0
        assert len(lp.top) == 3 and lp.top[0][0] == token_id  # greedy picks the best
        assert lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2]
        assert math.isclose(lp.top[0][2], lp.logprob, rel_tol=1e-5)


def test_stop_string_is_not_emitted_and_ends_the_request(llm: LLM) -> None:
    free = llm.generate(["Tell"], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
    assert len(free.text) > 12
    stop = free.text[8:12]
    cut = free.text[: free.text.index(stop)]
    out = llm.generate(["Tell"], SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,), ignore_eos=True))[0]
    assert out.finish_reason == "stop" and out.text == cut
    assert len(out.token_ids) < 40


def test_stop_token_ids_and_length(llm: LLM) -> None:
    free = llm.generate(["Tell"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    target = free.token_ids[5]
    first = free.token_ids.index(target)
    out = llm.generate(["Tell"], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(target,)))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]
    assert free.finish_reason == "length" and len(free.token_ids) == 20


def test_bad_requests_raise_clear_errors(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="temperature"):
        SamplingParams(temperature=3.0)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        llm.generate([[10**9]], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="context"):
        llm.generate(["hi"], SamplingParams(max_tokens=100_000))


def test_nf4_default_model_knows_the_capital_of_france() -> None:
    llm = LLM(EngineConfig(model="default", quantization="nf4", device="cpu"))
    # 4-bit weights: the fp32 model is 538 MB, nf4 packs the linear layers to a quarter of a byte per weight.
    assert llm.core.loaded.weights_bytes < 250 * 2**20
    prompt = llm.chat_prompt([{"role": "user", "content": "What is the capital of France?"}])
    out = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in out.text, out.text
