"""n > 1 is n engine requests on the same prompt ids (the web submits them together, seed + i when seeded): the
copies wait for the first one's prompt blocks and share them (BlockManager.promise / awaits_prefix), and their
outputs equal separate runs."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.sched.block_manager import BlockManager
from engine.sched.request import Request
from engine.sched.scheduler import Scheduler, SchedulerLimits


@pytest.fixture(scope="module")
def llm() -> LLM:
    # float32: a copy that hits the prefix cache attends through another path (engine.cpu.decode_kernel) than one that
    # computes the prompt; in bf16 the logits differ in the last bits, enough to move a seeded draw over the
    # random model's nearly flat distribution.
    config = EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", num_kv_blocks=512)
    return LLM(config)


BLOCK = 16
PROMPT = list(range(300, 300 + 5 * BLOCK + 3))  # five full blocks and a tail of three tokens


def scheduler(budget: int = 512, num_blocks: int = 64) -> Scheduler:
    return Scheduler(SchedulerLimits(8, budget, 64, 1024, "fair"), BlockManager(num_blocks, BLOCK))


def add_copies(sched: Scheduler, n: int, prompt: list[int] = PROMPT) -> list[Request]:
    reqs = [Request(f"seq-{i}", list(prompt), SamplingParams(max_tokens=8), 0.0) for i in range(n)]
    for req in reqs:
        sched.add_request(req)
    return reqs


def step(sched: Scheduler) -> dict[str, int]:
    out = sched.schedule()
    sched.update(out, {s.request.request_id: 7 for s in out.scheduled if s.samples})
    return {s.request.request_id: s.num_new_tokens for s in out.scheduled}


def test_n_copies_of_a_prompt_compute_its_full_blocks_once() -> None:
    sched = scheduler()
    reqs = add_copies(sched, 4)
    # The first computes the prompt; the others wait for its blocks instead of computing copies of them.
    assert step(sched) == {"seq-0": len(PROMPT)}
    assert step(sched) == {"seq-0": 1, "seq-1": 3, "seq-2": 3, "seq-3": 3}
    assert [r.num_cached_prompt_tokens for r in reqs] == [0, 80, 80, 80]
    # Five shared prompt blocks, and each sequence's own tail block (the first's now holds its first token).
    assert sched.blocks.num_used_blocks == 5 + 4
    tables = [sched.blocks.block_table(r.request_id) for r in reqs]
    assert all(t[:5] == tables[0][:5] for t in tables) and len({t[5] for t in tables}) == 4


def test_copies_wait_for_a_prompt_prefilled_in_chunks_and_share_all_its_blocks() -> None:
    sched = scheduler(budget=32)
    reqs = add_copies(sched, 3)
    assert step(sched) == {"seq-0": 32}
    assert step(sched) == {"seq-0": 32}
    assert step(sched) == {"seq-0": 19}
    assert step(sched) == {"seq-0": 1, "seq-1": 3, "seq-2": 3}
    assert [r.num_cached_prompt_tokens for r in reqs] == [0, 80, 80]


def test_copies_go_ahead_when_the_first_is_aborted_mid_prompt() -> None:
    sched = scheduler(budget=32)
    add_copies(sched, 2)
    assert step(sched) == {"seq-0": 32}
    sched.abort_requests(["seq-0"])
    # Its two computed blocks stay cached; nothing is promised any more, so the copy is admitted at once.
    assert step(sched) == {"seq-1": 32}
    assert sched.requests["seq-1"].num_cached_prompt_tokens == 2 * BLOCK


def test_a_promise_lasts_until_its_blocks_are_cached_or_its_request_is_freed() -> None:
    blocks = BlockManager(32, BLOCK)
    assert blocks.allocate_slots("first", len(PROMPT))
    blocks.promise("first", PROMPT)
    assert blocks.awaits_prefix(PROMPT, [])
    assert not blocks.awaits_prefix([1, *PROMPT[1:]], []), "another prompt waits for nothing"
    blocks.cache_blocks("first", PROMPT, 2 * BLOCK)
    hits, _ = blocks.get_computed_blocks(PROMPT)
    assert len(hits) == 2 and blocks.awaits_prefix(PROMPT, hits)
    blocks.free("first")
    assert not blocks.awaits_prefix(PROMPT, hits)
    off = BlockManager(32, BLOCK, enable_prefix_caching=False)
    assert off.allocate_slots("first", len(PROMPT))
    off.promise("first", PROMPT)
    assert not off.awaits_prefix(PROMPT, [])


def test_n_greedy_sequences_equal_separate_runs_and_seeded_ones_their_own_seed(llm: LLM) -> None:
    prompt = [(7 * i + 100) % 49000 + 50 for i in range(5 * BLOCK + 3)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = llm.generate([prompt], greedy)[0]
    assert alone.usage is not None and alone.usage.cached_prompt_tokens == 0
    together = llm.generate([prompt] * 4, greedy)
    assert all(r.token_ids == alone.token_ids for r in together)
    # The cache now holds the prompt from the first run; every copy hits it.
    assert [r.usage.cached_prompt_tokens for r in together if r.usage] == [80] * 4
    seeded = [SamplingParams(max_tokens=12, temperature=1.0, seed=40 + i, ignore_eos=True) for i in range(3)]
    fresh = [(p + 1) % 49000 for p in prompt]  # a prompt not cached yet
    n = llm.generate([fresh] * 3, seeded)
    assert [r.usage.cached_prompt_tokens for r in n if r.usage] == [0, 80, 80]
    assert [r.token_ids for r in n] == [llm.generate([fresh], s)[0].token_ids for s in seeded]
