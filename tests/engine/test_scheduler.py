"""Tests for the scheduler: policies, token budget, chunked prefill, block admission, preemption and stopping.

A real scheduler and block manager run against a fake runner that samples a deterministic token for every request
whose prompt and output are fully computed in a step; no model, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from engine.errors import ContextLengthError, QueueFullError
from engine.sampling_params import SamplingParams
from engine.sched import limits
from engine.sched.block_manager import BlockManager
from engine.sched.policy import Policy
from engine.sched.request import Request, RequestStatus
from engine.sched.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from engine.sched.tenant import DEFAULT_TENANT, Tenant

EOS = 2
POLICIES = ("fair", "continuous", "static", "sequential")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def next_token(req: Request, script: dict[str, list[int]]) -> int:
    """The scripted token, else one that depends only on how many tokens the request has produced, so a request
    recomputed after preemption goes on with the same sequence."""
    tokens = script.get(req.request_id)
    if tokens is not None:
        return tokens[len(req.output_token_ids)]
    return 100 + len(req.output_token_ids)


def fake_runner(out: SchedulerOutput, script: dict[str, list[int]]) -> dict[str, int]:
    return {s.request.request_id: next_token(s.request, script) for s in out.scheduled if s.samples}


class Harness:
    """A scheduler, its block manager and a fake clock, stepped the way the engine core steps them, with the
    scheduler's invariants checked around every step."""

    def __init__(
        self,
        policy: str = "continuous",
        *,
        num_blocks: int = 64,
        block_size: int = 4,
        max_num_seqs: int = 4,
        max_num_batched_tokens: int = 16,
        max_queue: int = 64,
        max_model_len: int = 256,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.limits = SchedulerLimits(max_num_seqs, max_num_batched_tokens, max_queue, max_model_len, policy)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.clock = FakeClock()
        self.sched = Scheduler(self.limits, self.blocks, clock=self.clock)
        self.script: dict[str, list[int]] = {}
        self.added: list[Request] = []

    def add(
        self,
        request_id: str,
        prompt: list[int] | int,
        max_tokens: int = 4,
        script: list[int] | None = None,
        tenant: Tenant | None = None,
        **params: Any,
    ) -> Request:
        """Queue a request; an int prompt stands for that many distinct tokens unique to this request."""
        if isinstance(prompt, int):
            base = 1000 * (len(self.added) + 1)
            prompt = list(range(base, base + prompt))
        req = Request(
            request_id,
            prompt,
            SamplingParams(max_tokens=max_tokens, **params),
            arrival_time=self.clock(),
            eos_token_ids=frozenset({EOS}),
            tenant=tenant or DEFAULT_TENANT,
        )
        self.sched.add_request(req)
        self.added.append(req)
        if script is not None:
            self.script[request_id] = script
        return req

    def step(self) -> SchedulerOutput:
        running_before = list(self.sched.running)
        out = self.sched.schedule()
        self._check_schedule(out, running_before)
        self.sched.update(out, fake_runner(out, self.script))
        self._check_state()
        self.clock.now += 1.0
        return out

    def run(self, max_steps: int = 2000) -> list[SchedulerOutput]:
        outs = []
        while self.sched.has_work():
            assert len(outs) < max_steps, "the scheduler made no progress"
            outs.append(self.step())
        assert self.blocks.num_used_blocks == 0
        return outs

    def step_until(self, done: Callable[[SchedulerOutput], object], max_steps: int = 200) -> SchedulerOutput:
        for _ in range(max_steps):
            out = self.step()
            if done(out):
                return out
        raise AssertionError("condition never met")

    def _check_schedule(self, out: SchedulerOutput, running_before: list[Request]) -> None:
        limits, sched = self.limits, self.sched
        ids = [s.request.request_id for s in out.scheduled]
        assert len(ids) == len(set(ids))
        max_seqs = 1 if limits.policy == "sequential" else limits.max_num_seqs
        assert len(out.scheduled) <= max_seqs
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert out.num_batched_tokens <= limits.max_num_batched_tokens
        for s in out.scheduled:
            req = s.request
            assert req.status is RequestStatus.RUNNING and req in sched.running
            assert 1 <= s.num_new_tokens <= req.num_tokens - req.num_computed_tokens
            capacity = len(self.blocks.block_table(req.request_id)) * self.blocks.block_size
            assert capacity >= req.num_computed_tokens + s.num_new_tokens
            assert req.num_kv_slots == capacity  # the scheduler's copy, which spares a decode step the lookup
        for req in out.preempted:
            assert req.status is RequestStatus.PREEMPTED and req.num_computed_tokens == 0
            assert req in sched.waiting and req.request_id not in ids
            assert self.blocks.block_table(req.request_id) == [] and req.num_kv_slots == 0
        for req in out.reclaimed:
            assert limits.policy == "fair" and req not in out.preempted
            assert req.status is RequestStatus.PREEMPTED and req.num_computed_tokens == 0
            assert req in sched.waiting and req.request_id not in ids
            assert self.blocks.block_table(req.request_id) == []
        admitted = [s.request for s in out.scheduled if s.request not in running_before]
        if out.preempted:
            assert not admitted, "admitted in a step that preempted"
        if not Policy(limits.policy).continuous and running_before:
            assert not admitted, f"{limits.policy} policy admitted beside a running batch"
        if limits.max_num_seqs <= limits.max_num_batched_tokens:
            # Decodes are never stalled: each running request with only its last token to compute runs or is
            # preempted. (Prefills may wait: a static batch is seated beyond the budget.)
            scheduled = {s.request.request_id for s in out.scheduled}
            for req in running_before:
                if req.output_token_ids and req.num_tokens - req.num_computed_tokens == 1:
                    assert req.request_id in scheduled or req in out.preempted, f"{req.request_id} stalled"

    def _check_state(self) -> None:
        sched = self.sched
        assert all(r.status is RequestStatus.RUNNING for r in sched.running)
        assert all(r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) for r in sched.waiting)
        assert len(sched.running) <= (1 if self.limits.policy == "sequential" else self.limits.max_num_seqs)
        live = [*sched.running, *sched.waiting]
        assert sorted(sched.requests) == sorted(r.request_id for r in live)
        assert all(self.blocks.block_table(r.request_id) == [] for r in sched.waiting)
        held = {b for r in sched.running for b in self.blocks.block_table(r.request_id)}
        assert len(held) == self.blocks.num_used_blocks
        for req in self.added:
            if req.status.finished:
                assert self.blocks.block_table(req.request_id) == []
        # The tenant ledger counts what the queues hold.
        for tid, st in sched.book.tenants.items():
            assert st.running == sum(r.tenant.id == tid for r in sched.running)
            assert st.waiting == sum(r.tenant.id == tid for r in sched.waiting)


def scheduled_ids(out: SchedulerOutput) -> list[str]:
    return [s.request.request_id for s in out.scheduled]


def new_tokens(out: SchedulerOutput) -> dict[str, int]:
    return {s.request.request_id: s.num_new_tokens for s in out.scheduled}


# -- continuous batching --------------------------------------------------------------------------------------


def test_finished_request_leaves_at_once_and_a_waiting_one_takes_its_seat_next_step() -> None:
    h = Harness(max_num_seqs=2)
    short = h.add("short", 3, max_tokens=2)
    long = h.add("long", 3, max_tokens=6)
    waiter = h.add("waiter", 3, max_tokens=1)

    assert scheduled_ids(h.step()) == ["short", "long"]
    assert waiter.status is RequestStatus.WAITING
    h.step()
    assert short.status is RequestStatus.FINISHED_LENGTH
    assert short not in h.sched.running and h.blocks.block_table("short") == []

    out = h.step()
    assert scheduled_ids(out) == ["long", "waiter"]
    assert long.status is RequestStatus.RUNNING
    h.run()
    assert [len(r.output_token_ids) for r in (short, long, waiter)] == [2, 6, 1]


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_batch_never_exceeds_max_num_seqs(policy: str) -> None:
    h = Harness(policy, max_num_seqs=3, max_num_batched_tokens=64)
    for i in range(10):
        h.add(f"r{i}", 5, max_tokens=3)
    outs = h.run()
    assert max(len(out.scheduled) for out in outs) == 3
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in h.added)


def test_token_budget_caps_every_step() -> None:
    h = Harness(max_num_seqs=8, max_num_batched_tokens=10)
    for i in range(6):
        h.add(f"r{i}", 7, max_tokens=3)
    outs = h.run()
    assert all(out.num_batched_tokens <= 10 for out in outs)
    assert outs[0].num_batched_tokens == 10  # 7 for r0, then a 3-token first chunk of r1
    assert new_tokens(outs[0]) == {"r0": 7, "r1": 3}


def test_long_prompt_is_prefilled_in_chunks_while_decodes_keep_running() -> None:
    h = Harness(max_num_batched_tokens=8)
    decoder = h.add("decoder", 3, max_tokens=20)
    h.step()
    assert len(decoder.output_token_ids) == 1

    long = h.add("long", 30, max_tokens=2)
    chunks = []
    while not long.output_token_ids:
        out = h.step()
        assert new_tokens(out)["decoder"] == 1
        chunks.append(new_tokens(out)["long"])
    assert chunks == [7, 7, 7, 7, 2]
    assert len(decoder.output_token_ids) == 1 + len(chunks)


def test_prompt_longer_than_budget_alone_is_chunked_by_the_budget() -> None:
    h = Harness(max_num_batched_tokens=8)
    req = h.add("long", 19, max_tokens=2)
    outs = h.run()
    assert [new_tokens(out)["long"] for out in outs] == [8, 8, 3, 1]
    assert req.output_token_ids == [100, 101]


def test_admission_is_first_come_first_served() -> None:
    h = Harness(max_num_seqs=2, max_num_batched_tokens=64)
    for i, max_tokens in enumerate([5, 1, 3, 2, 1, 4]):
        h.add(f"r{i}", 3 + i, max_tokens=max_tokens)
    h.run()
    by_admission = sorted(h.added, key=lambda r: (r.scheduled_time, h.added.index(r)))
    assert [r.request_id for r in by_admission] == [f"r{i}" for i in range(6)]
    assert [r.scheduled_time for r in h.added] == sorted(r.scheduled_time for r in h.added)


# -- static and sequential ------------------------------------------------------------------------------------


def test_static_admits_nothing_while_the_batch_decodes_and_refills_when_it_empties() -> None:
    h = Harness("static", max_num_seqs=4)
    a = h.add("a", 3, max_tokens=2)
    b = h.add("b", 3, max_tokens=5)
    h.step()
    late = h.add("late", 3, max_tokens=1)

    while b.status is RequestStatus.RUNNING:
        out = h.step()
        assert "late" not in scheduled_ids(out)
        assert late.status is RequestStatus.WAITING
    assert a.status.finished and b.status.finished

    assert scheduled_ids(h.step()) == ["late"]
    assert late.status is RequestStatus.FINISHED_LENGTH


def test_static_batch_is_admitted_whole_and_prefilled_over_several_steps() -> None:
    h = Harness("static", max_num_seqs=3, max_num_batched_tokens=8)
    a, b, c = h.add("a", 12, max_tokens=3), h.add("b", 4, max_tokens=3), h.add("c", 2, max_tokens=3)
    beyond_seats = h.add("beyond_seats", 2, max_tokens=1)

    assert new_tokens(h.step()) == {"a": 8}
    # b and c joined the batch beyond this step's budget: seated, holding blocks for their prompts.
    assert h.sched.running == [a, b, c] and list(h.sched.waiting) == [beyond_seats]
    assert b.num_computed_tokens == c.num_computed_tokens == 0
    assert len(h.blocks.block_table("b")) * h.blocks.block_size >= b.num_prompt_tokens

    h.add("late", 2, max_tokens=1)
    assert new_tokens(h.step()) == {"a": 4, "b": 4}
    assert new_tokens(h.step()) == {"a": 1, "b": 1, "c": 2}
    while h.sched.running:
        assert set(scheduled_ids(h.step())) <= {"a", "b", "c"}
    assert scheduled_ids(h.step()) == ["beyond_seats", "late"]
    h.run()


def test_static_admits_by_free_blocks_for_whole_prompts() -> None:
    h = Harness("static", num_blocks=6, block_size=4, max_num_batched_tokens=4, enable_prefix_caching=False)
    h.add("a", 12, max_tokens=1)  # 3 blocks
    h.add("b", 8, max_tokens=1)  # 2 blocks
    c = h.add("c", 8, max_tokens=1)  # 2 more would exceed the pool, though its first chunk would fit
    assert new_tokens(h.step()) == {"a": 4}
    assert [r.request_id for r in h.sched.running] == ["a", "b"]
    assert h.blocks.num_used_blocks == 5 and c.status is RequestStatus.WAITING
    h.run()
    assert c.status is RequestStatus.FINISHED_LENGTH


def test_sequential_runs_one_request_at_a_time_in_arrival_order() -> None:
    h = Harness("sequential", max_num_seqs=4, max_num_batched_tokens=64)
    for i in range(4):
        h.add(f"r{i}", 4, max_tokens=3)
    outs = h.run()
    assert all(len(out.scheduled) == 1 for out in outs)
    assert [scheduled_ids(out)[0] for out in outs] == [f"r{i}" for i in range(4) for _ in range(3)]


# -- KV blocks: admission and preemption ----------------------------------------------------------------------


def test_request_waits_for_free_blocks_and_is_admitted_once_they_are_freed() -> None:
    h = Harness(num_blocks=6, block_size=4, max_num_batched_tokens=32, enable_prefix_caching=False)
    big = h.add("big", 15, max_tokens=4)  # 4 blocks at admission, 5 at its end
    blocked = h.add("blocked", 12, max_tokens=1)  # needs 3 blocks
    small = h.add("small", 2, max_tokens=1)  # would fit, but may not overtake

    assert scheduled_ids(h.step()) == ["big"]
    while big.status is RequestStatus.RUNNING:
        assert scheduled_ids(h.step()) == ["big"]
        assert blocked.status is small.status is RequestStatus.WAITING
    assert h.blocks.num_used_blocks == 0

    assert scheduled_ids(h.step()) == ["blocked", "small"]
    h.run()


def test_preemption_takes_the_most_recently_admitted_request() -> None:
    h = Harness(num_blocks=6, block_size=4, max_num_seqs=3, max_num_batched_tokens=32, enable_prefix_caching=False)
    a, b, c = (h.add(name, 4, max_tokens=8) for name in "abc")
    waiter = h.add("waiter", 1, max_tokens=1)
    out = h.step_until(lambda out: out.preempted)

    assert out.preempted == [c]
    assert scheduled_ids(out) == ["a", "b"]
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert h.blocks.block_table("c") == []
    assert list(h.sched.waiting) == [c, waiter]
    assert c.output_token_ids == [100, 101, 102, 103, 104]
    assert (c.num_preemptions, a.num_preemptions, b.num_preemptions, h.sched.num_preemptions) == (1, 0, 0, 1)

    h.run()
    for req in (a, b, c):
        assert req.status is RequestStatus.FINISHED_LENGTH
        assert req.output_token_ids == list(range(100, 108))
    assert waiter.status is RequestStatus.FINISHED_LENGTH
    assert h.sched.num_preemptions == sum(r.num_preemptions for r in h.added)


def test_no_request_is_admitted_in_a_step_that_preempted() -> None:
    h = Harness(num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False)
    old = h.add("old", 3, max_tokens=10)
    new = h.add("new", 13, max_tokens=12)
    out = h.step_until(lambda out: out.preempted)

    assert out.preempted == [new] and scheduled_ids(out) == ["old"]
    assert h.sched.waiting[0] is new
    # The victim's next chunk would fit in the blocks its preemption freed; it still waits a step.
    chunk = min(new.num_tokens, h.limits.max_num_batched_tokens - out.num_batched_tokens)
    assert h.blocks.num_blocks_needed(chunk) <= h.blocks.num_free_blocks

    assert "new" in scheduled_ids(h.step())
    h.run()
    assert len(old.output_token_ids) == 10 and len(new.output_token_ids) == 12
    assert new.num_preemptions >= 1


def test_preempted_request_keeps_its_first_token_time_and_cached_count() -> None:
    h = Harness(num_blocks=5, block_size=4, max_num_batched_tokens=32)
    h.add("a", 4, max_tokens=8)
    b = h.add("b", 4, max_tokens=8)
    h.step()
    scheduled, first_token = b.scheduled_time, b.first_token_time
    h.step_until(lambda out: out.preempted)
    h.run()
    assert b.num_preemptions >= 1
    assert (b.scheduled_time, b.first_token_time, b.num_cached_prompt_tokens) == (scheduled, first_token, 0)


# -- stop conditions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "status", "output", "stop_reason"),
    [
        ({}, RequestStatus.FINISHED_STOPPED, [5, 6, EOS], EOS),
        ({"ignore_eos": True}, RequestStatus.FINISHED_LENGTH, [5, 6, EOS, 7, 8], None),
        ({"stop_token_ids": (6,)}, RequestStatus.FINISHED_STOPPED, [5, 6], 6),
        ({"stop_token_ids": (7,), "ignore_eos": True}, RequestStatus.FINISHED_STOPPED, [5, 6, EOS, 7], 7),
        ({"max_tokens": 2}, RequestStatus.FINISHED_LENGTH, [5, 6], None),
    ],
)
def test_stop_conditions(
    params: dict[str, Any], status: RequestStatus, output: list[int], stop_reason: int | None
) -> None:
    h = Harness()
    req = h.add("r", 3, **{"max_tokens": 5, **params}, script=[5, 6, EOS, 7, 8])
    h.run()
    assert (req.status, req.output_token_ids, req.stop_reason) == (status, output, stop_reason)
    assert req.finish_reason == ("stop" if status is RequestStatus.FINISHED_STOPPED else "length")


def test_request_stops_with_length_when_it_reaches_max_model_len() -> None:
    h = Harness(max_model_len=16)
    req = h.add("r", 10, max_tokens=6)
    h.run()
    assert req.num_tokens == 16 and req.finish_reason == "length"


def test_timestamps_follow_the_clock() -> None:
    h = Harness(max_num_seqs=1)
    h.add("first", 3, max_tokens=3)
    second = h.add("second", 3, max_tokens=2)
    h.run()
    assert second.arrival_time == 0.0
    assert (second.scheduled_time, second.first_token_time, second.finished_time) == (3.0, 3.0, 4.0)


# -- prefix caching -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("prompt_len", "cached"), [(20, 16), (16, 12), (4, 0)])
def test_repeated_prompt_hits_the_prefix_cache_but_computes_its_last_token(prompt_len: int, cached: int) -> None:
    h = Harness(block_size=4, max_num_batched_tokens=64)
    prompt = list(range(500, 500 + prompt_len))
    first = h.add("first", prompt, max_tokens=2)
    h.run()
    second = h.add("second", prompt, max_tokens=2)
    out = h.step()
    assert first.num_cached_prompt_tokens == 0
    assert second.num_cached_prompt_tokens == cached
    assert new_tokens(out) == {"second": prompt_len - cached}
    h.run()
    assert second.output_token_ids == first.output_token_ids


def test_running_requests_share_cached_prefix_blocks() -> None:
    h = Harness(block_size=4, max_num_batched_tokens=64)
    prefix = list(range(500, 512))
    h.add("a", [*prefix, 1], max_tokens=4)
    h.step()
    b = h.add("b", [*prefix, 2, 3], max_tokens=4)
    assert new_tokens(h.step()) == {"a": 1, "b": 2}
    assert b.num_cached_prompt_tokens == 12
    assert h.blocks.num_used_blocks == 3 + 2  # three shared prefix blocks, one tail block each
    h.run()


# -- queue bound and request validation -----------------------------------------------------------------------


def test_add_request_beyond_max_queue_raises_queue_full() -> None:
    h = Harness(max_queue=2, max_num_seqs=1)
    h.add("a", 3)
    h.add("b", 3)
    with pytest.raises(QueueFullError):
        h.add("c", 3)
    h.step()  # "a" leaves the queue for the batch
    h.add("c", 3)
    with pytest.raises(QueueFullError):
        h.add("d", 3)


@pytest.mark.parametrize(
    ("num_blocks", "max_model_len", "prompt_len", "max_tokens", "fits"),
    [
        (64, 16, 10, 6, True),  # exactly the context
        (64, 16, 10, 7, False),
        (64, 16, 17, 1, False),
        (4, 64, 4, 13, True),  # fills the 16-token pool: the last sampled token is never cached
        (4, 64, 4, 14, False),
        (4, 64, 17, 1, False),
    ],
)
def test_request_beyond_context_or_kv_pool_raises_context_length(
    num_blocks: int, max_model_len: int, prompt_len: int, max_tokens: int, fits: bool
) -> None:
    h = Harness(num_blocks=num_blocks, block_size=4, max_model_len=max_model_len)
    if fits:
        h.add("r", prompt_len, max_tokens=max_tokens)
        h.run()
        return
    with pytest.raises(ContextLengthError) as err:
        h.add("r", prompt_len, max_tokens=max_tokens)
    assert err.value.param == "max_tokens"
    assert not h.sched.has_work() and h.sched.requests == {}


def test_duplicate_request_id_is_rejected_until_the_first_finishes() -> None:
    h = Harness()
    h.add("r", 3, max_tokens=2)
    with pytest.raises(ValueError, match="already in use"):
        h.add("r", 3)
    h.step()
    with pytest.raises(ValueError, match="already in use"):
        h.add("r", 3)
    assert len(h.sched.waiting) + len(h.sched.running) == 1
    h.run()
    h.add("r", 3, max_tokens=1)
    h.run()


# -- abort and finish from outside ----------------------------------------------------------------------------


def test_abort_waiting_and_running_requests_frees_their_blocks() -> None:
    h = Harness(max_num_seqs=1)
    running = h.add("running", 9, max_tokens=10)
    waiting = h.add("waiting", 9, max_tokens=10)
    h.step()
    assert h.blocks.num_used_blocks > 0

    assert h.sched.abort_requests(["waiting", "unknown"]) == [waiting]
    assert waiting.status is RequestStatus.FINISHED_ABORTED and waiting.finish_reason == "abort"
    assert not h.sched.waiting
    assert h.sched.abort_requests(["running"]) == [running]
    assert running.status is RequestStatus.FINISHED_ABORTED
    assert not h.sched.has_work()
    assert h.blocks.num_used_blocks == 0
    assert h.sched.abort_requests(["running"]) == []
    assert h.sched.schedule().empty


def test_abort_of_a_preempted_request_removes_it_from_the_queue() -> None:
    h = Harness(num_blocks=6, block_size=4, max_num_batched_tokens=32)
    h.add("a", 4, max_tokens=8)
    h.add("b", 4, max_tokens=8)
    victim = h.add("c", 4, max_tokens=8)
    h.step_until(lambda out: out.preempted)
    assert victim.status is RequestStatus.PREEMPTED
    assert h.sched.abort_requests(["c"]) == [victim]
    assert victim not in h.sched.waiting
    h.run()


def test_request_finished_between_schedule_and_update_gets_no_token() -> None:
    h = Harness()
    req = h.add("r", 3, max_tokens=5)
    h.step()
    out = h.sched.schedule()
    h.sched.finish_request("r", RequestStatus.FINISHED_STOPPED, "a stop string")
    assert h.sched.update(out, fake_runner(out, h.script)) == []
    assert req.output_token_ids == [100]
    assert (req.status, req.stop_reason) == (RequestStatus.FINISHED_STOPPED, "a stop string")
    assert h.blocks.num_used_blocks == 0


def test_finish_request_of_an_unknown_or_finished_id_is_a_no_op() -> None:
    h = Harness()
    req = h.add("r", 3, max_tokens=1)
    h.sched.finish_request("unknown", RequestStatus.FINISHED_ABORTED)
    h.run()
    h.sched.finish_request("r", RequestStatus.FINISHED_ABORTED, "late")
    assert (req.status, req.stop_reason) == (RequestStatus.FINISHED_LENGTH, None)


# -- randomized runs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy", POLICIES)
def test_randomized_run_finishes_everything_within_limits(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(
        policy,
        num_blocks=rng.choice([12, 20, 40]),
        block_size=rng.choice([2, 4]),
        max_num_seqs=rng.choice([1, 3, 6]),
        max_num_batched_tokens=rng.choice([6, 16, 48]),
        max_model_len=48,
    )
    longest = min(h.limits.max_model_len, h.blocks.num_blocks * h.blocks.block_size)
    shared_prefixes = [[rng.randrange(3, 50) for _ in range(12)] for _ in range(3)]
    expected: dict[str, list[int]] = {}
    n_requests, step = 40, 0
    while len(expected) < n_requests or h.sched.has_work():
        assert step < 5000, "the scheduler made no progress"
        if len(expected) < n_requests and rng.random() < 0.4:
            rid = f"r{len(expected)}"
            prompt = [rng.randrange(3, 50) for _ in range(rng.randint(1, 20))]
            if rng.random() < 0.5:
                prompt = rng.choice(shared_prefixes)[: rng.randint(1, 12)] + prompt
            prompt = prompt[: longest - 1]
            max_tokens = rng.randint(1, min(16, longest - len(prompt)))
            script = [EOS if rng.random() < 0.05 else rng.randrange(3, 50) for _ in range(max_tokens)]
            h.add(rid, prompt, max_tokens=max_tokens, script=script)
            expected[rid] = script[: script.index(EOS) + 1] if EOS in script else script
        if rng.random() < 0.01 and h.sched.requests:
            h.sched.abort_requests([rng.choice(sorted(h.sched.requests))])
        h.step()
        step += 1

    assert h.blocks.num_used_blocks == 0 and not h.sched.running and not h.sched.waiting
    first_admissions = [r.scheduled_time for r in h.added if r.scheduled_time is not None]
    assert first_admissions == sorted(first_admissions), "admitted out of arrival order"
    for req in h.added:
        assert req.status.finished
        if req.status is not RequestStatus.FINISHED_ABORTED:
            assert req.output_token_ids == expected[req.request_id]
            assert req.finish_reason == ("stop" if req.output_token_ids[-1] == EOS else "length")


@pytest.mark.parametrize(("prompt", "context", "kv"), [(10, 64, 1000), (10, 1000, 40), (64, 64, 1000), (50, 64, 40)])
def test_room_is_the_largest_max_tokens_that_fits(prompt: int, context: int, kv: int) -> None:
    """room() and check_fits() are one decision: every max_tokens up to the room fits, one more does not."""
    room = limits.room(prompt, context, kv)
    if room < 1:
        with pytest.raises(ContextLengthError):
            limits.check_fits(prompt, 1, context, kv)
        return
    limits.check_fits(prompt, room, context, kv)
    with pytest.raises(ContextLengthError):
        limits.check_fits(prompt, room + 1, context, kv)
