"""Tests for the fair policy: who is admitted next, who gives a seat back, who is preempted for KV blocks.

The real scheduler and block manager against the fake runner of test_scheduler (no model, no torch).
"""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.client import AsyncEngineClient
from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.messages import AddRequest, EngineStats, QueuePosition
from engine.sampling_params import SamplingParams
from engine.sched.fair import MAX_RECLAIMS, W_IN, W_OUT
from engine.sched.request import Request, RequestStatus
from engine.sched.tenant import Tenant
from tests.engine.test_scheduler import Harness, scheduled_ids

A, B, C = Tenant("a"), Tenant("b"), Tenant("c")


def admitted_order(h: Harness) -> list[str]:
    first = [r for r in h.added if r.scheduled_time is not None]
    return [r.request_id for r in sorted(first, key=lambda r: (r.scheduled_time, h.added.index(r)))]


def service(reqs: list[Request]) -> float:
    """Weighted tokens a tenant's requests received: the prompts of those admitted and the tokens generated."""
    prompts = sum(r.num_prompt_tokens for r in reqs if r.scheduled_time is not None)
    return W_IN * prompts + W_OUT * sum(len(r.output_token_ids) for r in reqs)


def test_a_light_tenant_goes_before_the_heavy_tenants_backlog() -> None:
    h = Harness("fair", max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(6):
        h.add(f"heavy{i}", 4, max_tokens=4, tenant=A)
    h.step()
    h.add("light", 4, max_tokens=4, tenant=B)
    h.run()
    assert admitted_order(h)[:3] == ["heavy0", "light", "heavy1"]


def test_fcfs_keeps_arrival_order_across_tenants() -> None:
    h = Harness("fcfs", max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(6):
        h.add(f"heavy{i}", 4, max_tokens=4, tenant=A)
    h.step()
    h.add("light", 4, max_tokens=4, tenant=B)
    h.run()
    assert admitted_order(h)[-1] == "light"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30), st.integers(1, 3), st.randoms())
def test_each_tenant_is_served_first_come_first_served(owners: list[str], seats: int, rnd: random.Random) -> None:
    h = Harness("fair", max_num_seqs=seats, max_num_batched_tokens=32)
    for i, owner in enumerate(owners):
        h.add(f"{owner}{i}", rnd.randint(1, 9), max_tokens=rnd.randint(1, 6), tenant=Tenant(owner))
        if rnd.random() < 0.5:
            h.step()
    h.run()
    order = admitted_order(h)
    for owner in "abc":
        mine = [rid for rid in order if rid.startswith(owner)]
        assert mine == sorted(mine, key=lambda rid: int(rid[1:]))


@pytest.mark.parametrize("seed", range(3))
def test_two_saturating_tenants_weighted_one_to_three_get_service_one_to_three(seed: int) -> None:
    rng = random.Random(seed)
    h = Harness("fair", num_blocks=512, max_num_seqs=8, max_num_batched_tokens=64, max_queue=1024)
    light, heavy = Tenant("w1", weight=1.0), Tenant("w3", weight=3.0)
    for i in range(300):
        h.add(f"l{i}", rng.randint(2, 12), max_tokens=rng.randint(2, 24), tenant=light)
        h.add(f"h{i}", rng.randint(2, 12), max_tokens=rng.randint(2, 24), tenant=heavy)
    for _ in range(600):  # both stay backlogged throughout
        h.step()
    by = {t: [r for r in h.added if r.tenant is t] for t in (light, heavy)}
    assert all(any(r.status is RequestStatus.WAITING for r in reqs) for reqs in by.values())
    ratio = service(by[heavy]) / service(by[light])
    assert abs(ratio - 3.0) <= 0.3, ratio


def test_an_idle_tenant_banks_no_credit() -> None:
    h = Harness("fair", max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(20):
        h.add(f"a{i}", 4, max_tokens=4, tenant=A)
    h.run()  # a alone for a long time; b was idle all along
    for i in range(6):
        h.add(f"a{20 + i}", 4, max_tokens=4, tenant=A)
        h.add(f"b{i}", 4, max_tokens=4, tenant=B)
    h.run()
    later = admitted_order(h)[20:]
    # b returns lifted to a's counter: the two alternate instead of b taking six turns in a row.
    assert [rid[0] for rid in later] == list("ab" * 6)


def test_interactive_requests_go_before_batch_ones_and_take_a_batch_seat_back() -> None:
    h = Harness("fair", max_num_seqs=2, max_num_batched_tokens=64)
    user, batch = Tenant("user", weight=0.1), Tenant("job", priority="batch")
    h.add("warm", 4, max_tokens=30, tenant=user)
    h.step()
    for i in range(6):
        h.add(f"job{i}", 4, max_tokens=20, tenant=batch)
    for _ in range(5):
        h.step()
    book = h.sched.book
    assert book.tenants["user"].counter > book.tenants["job"].counter  # the user has received far more
    chat = h.add("chat", 4, max_tokens=2, tenant=user)
    out = h.step()
    assert "chat" in scheduled_ids(out) and [r.request_id for r in out.reclaimed] == ["job0"]
    h.run()
    assert chat.first_token_time is not None and chat.first_token_time - chat.arrival_time <= 1.0
    assert admitted_order(h).index("chat") < admitted_order(h).index("job1")


def test_a_tenant_below_its_share_takes_a_seat_back_from_the_one_holding_them_all() -> None:
    h = Harness("fair", max_num_seqs=4, max_num_batched_tokens=64)
    for i in range(8):
        h.add(f"heavy{i}", 4, max_tokens=30, tenant=A)
    h.step()
    assert len(h.sched.running) == 4
    light = h.add("light", 4, max_tokens=3, tenant=B)
    out = h.step()
    assert [r.request_id for r in out.reclaimed] == ["heavy3"]  # the heavy tenant's newest
    assert "light" in scheduled_ids(out) and light.output_token_ids
    h.run()


def test_no_seat_is_taken_back_from_a_tenant_that_would_fall_below_its_share() -> None:
    h = Harness("fair", max_num_seqs=4, max_num_batched_tokens=64)
    for i in range(10):
        h.add(f"a{i}", 4, max_tokens=12, tenant=A)
        h.add(f"b{i}", 4, max_tokens=12, tenant=B)
    h.step()
    # a and b hold two seats each; c's share is 4/3 seats, but taking one would leave a or b below theirs.
    late = h.add("c0", 4, max_tokens=12, tenant=C)
    while late.scheduled_time is None:
        assert not h.step().reclaimed
    assert admitted_order(h).index("c0") < 8  # c gets one of the next four seats to free
    h.run()


def test_a_request_gives_its_seat_back_at_most_max_reclaims_times_and_finishes() -> None:
    h = Harness("fair", num_blocks=256, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=512)
    long = h.add("long", 4, max_tokens=200, tenant=A)
    h.add("long2", 4, max_tokens=200, tenant=A)
    for step in range(400):
        if step % 5 == 0:
            h.add(f"light{step}", 4, max_tokens=3, tenant=Tenant(f"user{step % 3}"))
        assert not h.step().preempted  # blocks are ample: every preemption here is a seat taken back
    h.run()
    assert long.status is RequestStatus.FINISHED_LENGTH and len(long.output_token_ids) == 200
    assert 1 <= long.num_preemptions <= MAX_RECLAIMS


def test_kv_pressure_preempts_the_newest_request_of_the_tenant_served_most() -> None:
    h = Harness(
        "fair", num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    hog = h.add("hog", 8, max_tokens=20, tenant=A)
    h.step()
    h.step()  # the hog has received the most
    a_new = h.add("hog-new", 4, max_tokens=20, tenant=A)
    h.step()
    b_new = h.add("b-newest", 4, max_tokens=20, tenant=B)
    out = h.step_until(lambda out: out.preempted)
    # b's request is the newest overall, but the victim is a's newest.
    assert out.preempted[0] is a_new and b_new.status is RequestStatus.RUNNING
    assert hog.status is RequestStatus.RUNNING
    h.run()


def test_fcfs_under_kv_pressure_still_preempts_the_newest_overall() -> None:
    h = Harness(
        "fcfs", num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    h.add("hog", 8, max_tokens=20, tenant=A)
    h.step()
    h.step()
    h.add("hog-new", 4, max_tokens=20, tenant=A)
    h.step()
    b_new = h.add("b-newest", 4, max_tokens=20, tenant=B)
    out = h.step_until(lambda out: out.preempted)
    assert out.preempted[0] is b_new
    h.run()


MAX_PROMPT, MAX_TOKENS = 12, 10


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=2, max_size=4),
    st.integers(1, 4),
    st.integers(8, 32),
    st.randoms(),
)
def test_no_tenant_starves(weights: list[float], seats: int, budget: int, rnd: random.Random) -> None:
    """The bound: while tenants f and g both have a request that was never admitted, f's counter is at most
    (W_IN * MAX_PROMPT + seats * MAX_TOKENS * W_OUT) / weight_f above g's. f was the smallest waiting tenant
    at its last admission, and since then only that prompt and at most `seats` running requests were charged
    to it. Every admission of another tenant raises its counter, so g's turn comes after a bounded number."""
    h = Harness("fair", num_blocks=256, max_num_seqs=seats, max_num_batched_tokens=budget, max_queue=256)
    tenants = [Tenant(f"t{i}", weight=w) for i, w in enumerate(weights)]
    for t in tenants:
        for j in range(rnd.randint(1, 15)):
            h.add(f"{t.id}-{j}", rnd.randint(1, MAX_PROMPT), max_tokens=rnd.randint(1, MAX_TOKENS), tenant=t)
    book = h.sched.book
    steps = 0
    while h.sched.has_work():
        h.step()
        steps += 1
        assert steps < 2000, "a tenant starved"
        fresh = {r.tenant.id for r in h.sched.waiting if r.scheduled_time is None}
        for f in fresh:
            for g in fresh:
                bound = (W_IN * MAX_PROMPT + seats * MAX_TOKENS * W_OUT) / book.tenants[f].tenant.weight
                assert book.tenants[f].counter - book.tenants[g].counter <= bound + 1e-9
    assert all(r.status.finished for r in h.added)


def test_tenant_crosses_the_process_boundary_and_rejects_bad_values() -> None:
    msg = AddRequest("r", [1, 2], SamplingParams(), 0.0, Tenant("key-1", weight=2.5, priority="batch"))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=AddRequest) == msg
    for bad in (dict(weight=0.0), dict(weight=-1.0), dict(weight=float("inf")), dict(priority="urgent")):
        with pytest.raises(InvalidRequestError):
            Tenant("key-1", **bad)
    with pytest.raises(InvalidRequestError):
        Tenant("")


# -- what the web side reads: per-tenant numbers, the projected queue, a waiting request's position ------------


def test_snapshot_counts_each_tenants_running_and_waiting_requests_and_its_token_rate() -> None:
    h = Harness("fair", max_num_seqs=3, max_num_batched_tokens=64)
    for i in range(4):
        h.add(f"a{i}", 4, max_tokens=8, tenant=A)
    h.add("b0", 4, max_tokens=8, tenant=Tenant("b", weight=2.0, priority="batch"))
    book = h.sched.book
    book.snapshot(0.0)
    for _ in range(3):
        h.step()
    stats = {t.id: t for t in book.snapshot(3.0)}
    # b is a batch tenant: the interactive one takes every seat while it has requests waiting.
    assert (stats["a"].running, stats["a"].waiting) == (3, 1)
    assert (stats["b"].running, stats["b"].waiting, stats["b"].weight, stats["b"].priority) == (0, 1, 2.0, "batch")
    # 3 prompts of 4 tokens and 6 generated tokens for a over 3 s, decayed over the minute window.
    assert 0 < stats["a"].tokens_per_s <= 18 / 3
    assert stats["b"].tokens_per_s == 0
    assert book.admission_rate > 0


def test_an_idle_tenant_leaves_the_snapshot_once_its_rate_has_faded() -> None:
    h = Harness("fair", max_num_seqs=3, max_num_batched_tokens=64)
    h.add("a0", 4, max_tokens=2, tenant=A)
    h.sched.book.snapshot(0.0)
    h.run()
    assert [t.id for t in h.sched.book.snapshot(1.0)] == ["a"]
    assert h.sched.book.snapshot(3600.0) == []


def test_projected_queue_starts_with_the_head_keeps_each_tenants_order_and_follows_the_weights() -> None:
    h = Harness("fair", max_num_seqs=1, max_num_batched_tokens=64, max_queue=128)
    light, heavy = Tenant("w1", weight=1.0), Tenant("w3", weight=3.0)
    for i in range(20):
        h.add(f"l{i}", 4, max_tokens=4, tenant=light)
        h.add(f"h{i}", 4, max_tokens=4, tenant=heavy)
    order = [r.request_id for r in h.sched.waiting.ordered(16)]
    assert order[0] == h.sched.waiting.peek().request_id
    for prefix in "lh":
        mine = [int(rid[1:]) for rid in order if rid[0] == prefix]
        assert mine == sorted(mine)
    assert sum(rid[0] == "h" for rid in order) == 12  # three of every four places


def test_queue_position_and_eta_come_from_the_latest_snapshot() -> None:
    client = AsyncEngineClient(EngineConfig(model="random:tiny"))
    assert client.queue_position("r1") is None
    snapshot = {f: 0 for f in EngineStats.__struct_fields__} | {"memory_kind": "RAM", "kv_cache_dtype": "float32"}
    snapshot |= {"tenants": [], "recent_queue_wait": [], "recent_ttft": [], "recent_tpot": [], "queue": ["r0", "r1"]}
    snapshot |= {"kv_groups": []}
    client._stats = msgspec.convert(snapshot | {"admission_rate": 4.0}, EngineStats)
    assert client.queue_position("r1") == QueuePosition(2, 0.5)
    assert client.queue_position("running-or-unknown") is None
    client._stats = msgspec.structs.replace(client._stats, admission_rate=0.0)
    assert client.queue_position("r0") == QueuePosition(1, None)
