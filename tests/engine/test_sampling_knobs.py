"""The sampling knobs of issue 13 (logit_bias, repetition/presence/frequency penalties, min_p) against hand-computed
references on small logits, batched rows against rows alone, and a few runs through the offline engine."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch

from engine import LLM, EngineConfig, InvalidRequestError, SamplingParams
from engine.sample.penalties import apply_penalties
from engine.sample.sampler import DRAW_BLOCK, sample


@dataclass
class History:
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def llm() -> LLM:
    # float32 on every CPU (auto is bfloat16 where the CPU has native bf16): the greedy outputs below are then the
    # same on every machine.
    return LLM(EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", num_kv_blocks=512))


def adjusted(logits: list[float], params: SamplingParams, history: History) -> list[float]:
    row = torch.tensor([logits])
    apply_penalties(row, [params], [history])
    return row[0].tolist()


# -- each knob against a hand-computed reference ----------------------------------------------------------


def test_logit_bias_adds_to_the_named_tokens() -> None:
    params = SamplingParams(logit_bias=((1, 2.5), (3, -1.0)))
    assert adjusted([0.0, 1.0, 2.0, 3.0], params, History()) == [0.0, 3.5, 2.0, 2.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_prompt_and_output_tokens() -> None:
    params = SamplingParams(repetition_penalty=2.0)
    history = History(prompt_token_ids=[0, 1], output_token_ids=[3, 3])
    # tokens 0 (prompt, positive), 1 (prompt, negative) and 3 (output) are penalized; 2 and 4 are not.
    assert adjusted([2.0, -1.0, 0.5, 3.0, -4.0], params, history) == [1.0, -2.0, 0.5, 1.5, -4.0]


def test_presence_and_frequency_penalties_count_only_generated_tokens() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    history = History(prompt_token_ids=[0, 0, 0], output_token_ids=[2, 2, 1])
    # logit -= presence * (count > 0) + frequency * count; the prompt's token 0 is not charged.
    assert adjusted([1.0, 1.0, 1.0, 1.0], params, history) == [1.0, 0.25, 0.0, 1.0]


def test_logit_bias_applies_before_the_repetition_penalty() -> None:
    params = SamplingParams(logit_bias=((0, 5.0),), repetition_penalty=2.0)
    # (-1 + 5) / 2 = 2; the other order would give -1 * 2 + 5 = 3.
    assert adjusted([-1.0, 0.0], params, History(output_token_ids=[0])) == [2.0, 0.0]


def test_penalties_of_rows_with_histories_of_any_length_match_each_row_alone() -> None:
    torch.manual_seed(3)
    logits = torch.randn(4, 50)
    params = [
        SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(presence_penalty=1.0, logit_bias=((0, 2.0),)),
        SamplingParams(repetition_penalty=0.7),
        SamplingParams(frequency_penalty=-1.0),
    ]
    histories = [History([5], []), History([1, 2, 3, 4], [9, 9, 0, 7, 7, 7]), History([], [3]), History()]
    batch = logits.clone()
    apply_penalties(batch, params, histories)
    for i in range(4):
        alone = logits[i : i + 1].clone()
        apply_penalties(alone, [params[i]], [histories[i]])
        assert torch.equal(batch[i], alone[0]), i
    assert torch.equal(batch[3], logits[3])  # nothing generated, nothing to penalize


def draws(logits: list[float], params: SamplingParams, n: int = 3000) -> Counter[int]:
    gen = torch.Generator().manual_seed(7)
    row = torch.tensor([logits])
    return Counter(sample(row, [params], [gen], [History()]).token_ids[0] for _ in range(n))


def test_random_rows_draw_each_token_as_often_as_its_probability() -> None:
    probs = (0.5, 0.3, 0.15, 0.05, 0.0)
    counts = draws([math.log(p) if p else float("-inf") for p in probs], SamplingParams(temperature=1.0), 4000)
    assert all(abs(counts[i] / 4000 - p) < 0.025 for i, p in enumerate(probs)), counts
    assert 4 not in counts


def test_min_p_drops_tokens_below_its_share_of_the_likeliest() -> None:
    logits = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    # min_p 0.2: the floor is 0.1, so token 3 (0.05) goes; token 2 (0.15) stays.
    counts = draws(logits, SamplingParams(temperature=1.0, min_p=0.2))
    assert set(counts) == {0, 1, 2}
    assert abs(counts[2] / 3000 - 0.15 / 0.95) < 0.03
    assert 3 in draws(logits, SamplingParams(temperature=1.0))


def test_min_p_applies_after_temperature() -> None:
    logits = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    # At temperature 2 the probabilities go as sqrt(p): 0.05 -> sqrt(0.05/0.5) = 0.32 of the top, above 0.3.
    assert set(draws(logits, SamplingParams(temperature=2.0, min_p=0.3))) == {0, 1, 2, 3}
    # At temperature 1 the same min_p keeps only 0.5 and 0.3 (0.15 / 0.5 = 0.3 is not below the floor).
    assert set(draws(logits, SamplingParams(temperature=1.0, min_p=0.31))) == {0, 1}


def test_logit_bias_forces_and_bans_tokens_in_greedy_and_random_rows() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)
    best = logits.argmax(dim=-1).tolist()
    params = [
        SamplingParams(temperature=0.0, logit_bias=((17, 100.0),)),
        SamplingParams(temperature=1.0, logit_bias=((17, 100.0),)),
        SamplingParams(temperature=0.0, logit_bias=((best[2], -100.0),)),
        SamplingParams(temperature=0.0),
    ]
    ids = sample(logits, params, [None] * 4, [History()] * 4).token_ids
    assert ids[:2] == [17, 17]
    assert ids[2] != best[2] and ids[2] == logits[2].topk(2).indices[1].item()
    assert ids[3] == best[3]


def test_repetition_penalty_stops_a_greedy_loop() -> None:
    """Logits that always favour token 5: plain greedy repeats it forever; penalized, it moves on."""
    logits = torch.tensor([[0.0, 1.0, 1.5, 2.0, 2.5, 3.0]])

    def decode(params: SamplingParams, steps: int = 5) -> list[int]:
        history = History(prompt_token_ids=[0])
        for _ in range(steps):
            history.output_token_ids.append(sample(logits, [params], [None], [history]).token_ids[0])
        return history.output_token_ids

    assert decode(SamplingParams(temperature=0.0)) == [5] * 5
    # Each seen token's 2.0..3.0 divided by 4 falls below the next unseen one.
    assert decode(SamplingParams(temperature=0.0, repetition_penalty=4.0)) == [5, 4, 3, 2, 1]
    assert decode(SamplingParams(temperature=0.0, frequency_penalty=2.0)) == [5, 4, 3, 2, 1]


def test_logprobs_come_from_the_raw_logits() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    params = SamplingParams(temperature=0.0, logprobs=1, logit_bias=((0, 100.0),))
    result = sample(logits, [params], [None], [History()])
    raw = logits[0].log_softmax(dim=-1)
    assert result.token_ids == [0]
    top = result.logprobs[0]
    assert top is not None
    assert math.isclose(top.token_logprob, raw[0].item(), rel_tol=1e-6)
    assert top.top_ids == [2]


# -- batches ------------------------------------------------------------------------------------------------


MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.8, logit_bias=((3, 4.0),)),
    SamplingParams(temperature=0.8, seed=1, min_p=0.05),
    SamplingParams(temperature=1.0, seed=2, presence_penalty=1.5, frequency_penalty=-0.5, top_k=50),
    SamplingParams(temperature=0.0, frequency_penalty=2.0),
    SamplingParams(temperature=1.2, seed=3, top_p=0.9, logit_bias=((10, -100.0), (11, 30.0))),
    SamplingParams(temperature=0.7, seed=4),
    SamplingParams(temperature=0.0, presence_penalty=-2.0, repetition_penalty=0.5),
]


@pytest.mark.parametrize("rows", [MIXED, MIXED[1:]], ids=["with a plain greedy row", "without"])
def test_a_batch_mixing_knobs_samples_each_row_as_it_would_alone(rows: list[SamplingParams]) -> None:
    torch.manual_seed(1)
    logits = torch.randn(len(rows), 200) * 3
    histories = [History([i, 7, 8], [(i * 13 + k) % 200 for k in range(12)]) for i in range(len(rows))]

    def generators() -> list[torch.Generator | None]:
        return [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in rows]

    for _ in range(3):
        raw = logits.clone()
        batch = sample(logits, rows, generators(), histories).token_ids
        alone = [
            sample(logits[i : i + 1], [rows[i]], [g], [histories[i]]).token_ids[0] for i, g in enumerate(generators())
        ]
        assert batch == alone
        assert torch.equal(logits, raw), "the sampler wrote into the model's logits"
        logits = logits.roll(1, dims=1)


def test_plain_greedy_rows_ignore_their_neighbours_knobs() -> None:
    torch.manual_seed(2)
    logits = torch.randn(16, 500)
    params = [SamplingParams(temperature=0.0) if i % 2 else MIXED[i % len(MIXED)] for i in range(16)]
    histories = [History([1, 2], [int(logits[i].argmax())] * 3) for i in range(16)]
    ids = sample(logits, params, [None] * 16, histories).token_ids
    best = logits.argmax(dim=-1).tolist()
    assert [ids[i] for i in range(1, 16, 2)] == [best[i] for i in range(1, 16, 2)]
    # The penalized greedy neighbours did move off their argmax (their only output token so far).
    assert ids[4] != best[4]


# -- through the offline engine -------------------------------------------------------------------------------


def test_repetition_penalty_keeps_a_model_from_repeating_itself(llm: LLM) -> None:
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    free = llm.generate(["Once upon a time there was"], plain)[0].token_ids
    penalized = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, repetition_penalty=1.5)
    out = llm.generate(["Once upon a time there was"], penalized)[0].token_ids
    assert len(set(free)) < len(free), "the plain greedy output has no repeat to stop"
    assert len(set(out)) == len(out)
    first_repeat = next(i for i, t in enumerate(free) if t in free[:i])
    assert out[:first_repeat] == free[:first_repeat]


def test_logit_bias_forces_a_token_and_bans_another_through_the_engine(llm: LLM) -> None:
    free = llm.generate(["The sea"], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    forced = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, logit_bias=((1234, 100.0),))
    assert llm.generate(["The sea"], forced)[0].token_ids == [1234] * 6
    banned = free.token_ids[0]
    ban = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias=((banned, -100.0),))
    out = llm.generate(["The sea"], ban)[0].token_ids
    assert banned not in out and out != free.token_ids


def test_logit_bias_beyond_the_vocabulary_is_refused_at_admission(llm: LLM) -> None:
    vocab = llm.core.vocab_size
    with pytest.raises(InvalidRequestError, match="logit_bias") as refused:
        llm.generate(["hi"], SamplingParams(max_tokens=2, logit_bias=((vocab, 1.0),)))
    assert refused.value.param == "logit_bias"
    last = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logit_bias=((vocab - 1, 100.0),))
    assert llm.generate(["hi"], last)[0].token_ids == [vocab - 1] * 2


def test_draws_across_blocks_and_the_vocabulary_tail_follow_the_probabilities() -> None:
    # 1,000 words: three full blocks of the two-level draw and a tail of 232; the mass sits in all four.
    assert DRAW_BLOCK == 256
    mass = {5: 0.3, 300: 0.25, 700: 0.25, 999: 0.2}
    logits = [math.log(mass[i]) if i in mass else float("-inf") for i in range(1000)]
    counts = draws(logits, SamplingParams(temperature=1.0), 4000)
    assert set(counts) <= set(mass), counts
    assert all(abs(counts[i] / 4000 - p) < 0.025 for i, p in mass.items()), counts


def test_a_flat_row_is_drawn_evenly_over_every_block() -> None:
    counts = draws([0.0] * 1000, SamplingParams(temperature=1.0), 4000)
    per_block = Counter(min(token // DRAW_BLOCK, 3) for token in counts.elements())
    shares = {b: per_block[b] / 4000 for b in range(4)}
    assert all(abs(shares[b] - (256 if b < 3 else 232) / 1000) < 0.03 for b in range(4)), shares
