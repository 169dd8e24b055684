"""The router's choices and the backends' parts that need no server: APPLIANCE_BACKENDS entries, the load read
from metrics text, the circuit breaker, power of two choices, KV avoidance, stickiness and the one retry."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from engine import (
    EngineDeadError,
    InvalidRequestError,
    ModelInfo,
    QueueFullError,
    RequestOutput,
    SamplingParams,
    Tenant,
)
from web.backends import breaker as breaker_module
from web.backends.breaker import Breaker
from web.backends.protocol import Served
from web.backends.router import KV_FULL, Router
from web.backends.scrape import Load, read_load
from web.backends.spec import BackendSpecError, parse_backends, redacted

INFO = ModelInfo("m", 2048, "/t", [0], "remote", "", "", 2048, 1, 0)


def test_backend_entries() -> None:
    parsed = parse_backends(
        "embedded, http://:s3cret@10.0.0.5:8000/v1#alias=qwen2.5:7b=qwen&tokenizer=/srv/tok,https://h"
    )
    assert parsed.embedded
    first, second = parsed.remotes
    assert (first.name, first.base_url, first.api_key) == ("10.0.0.5:8000", "http://10.0.0.5:8000", "s3cret")
    assert first.served_name("qwen2.5:7b") == "qwen" and first.served_name("other") == "other"
    assert first.tokenizer == "/srv/tok"
    assert "s3cret" not in repr(first) and "s3cret" not in repr(parsed)
    assert (second.name, second.api_key, second.text_prompt) == ("h:443", None, False)
    assert parse_backends("http://h:11434/v1#prompt=text").remotes[0].text_prompt
    assert (
        not parse_backends("http://[::1]:9").embedded and parse_backends("http://[::1]:9").remotes[0].name == "[::1]:9"
    )
    assert parse_backends("").embedded and not parse_backends(" , ").remotes


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ftp://h:1", "http:// or https://"),
        ("http://:k@h:99999", "not a URL"),
        ("http://h:1#model=x", "unknown option"),
        ("http://h:1#alias=noequals", "UPSTREAM=SERVED"),
        ("http://h:1,http://:k@h:1", "listed twice"),
    ],
)
def test_bad_backend_entries_are_refused_without_their_keys(text: str, needle: str) -> None:
    with pytest.raises(BackendSpecError, match=needle) as refused:
        parse_backends(text.replace(":k@", ":topsecret@"))
    assert "topsecret" not in str(refused.value)


def test_redacted() -> None:
    assert redacted("http://user:pw@h:1/x") == "http://user:***@h:1/x"
    assert redacted("http://h:1") == "http://h:1"


def test_load_from_each_servers_metrics() -> None:
    vllm = (
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0 1700000000\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.5\n'
    )
    assert read_load(vllm) == Load(waiting=3, running=3, kv_usage=0.5)
    assert read_load("sglang:num_queue_reqs 4\nsglang:num_running_reqs 1\nsglang:token_usage 0.9\n") == Load(4, 1, 0.9)
    assert read_load("llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n") == Load(0, 2, None)
    assert read_load('garbage{\nvllm:num_requests_running{a="}"} nan\nx 1\n') is None
    assert read_load('vllm:num_requests_running{model_name="m" 3\nvllm:num_requests_waiting{} 2\n') == Load(2, 0, None)
    assert read_load("vllm:num_requests_running -3\nvllm:num_requests_waiting 1e400\n") is None


def test_breaker_opens_after_failures_and_lets_one_trial_through(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(breaker_module.time, "monotonic", lambda: now[0])
    b = Breaker()
    for _ in range(breaker_module.FAILURES - 1):
        b.failure()
    assert not b.open
    b.failure()
    assert b.open
    now[0] += breaker_module.COOLDOWN_S + 0.1
    assert not b.open  # half-open: one trial may go
    b.allow()
    assert b.open  # ... and only one
    b.failure()  # the trial failed: open again, for twice as long
    now[0] += breaker_module.COOLDOWN_S + 0.1
    assert b.open
    now[0] += breaker_module.COOLDOWN_S
    assert not b.open
    b.allow()
    b.success()
    assert not b.open and b.failures == 0


def test_a_good_health_probe_lets_requests_in_on_probation(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(breaker_module.time, "monotonic", lambda: now[0])
    b = Breaker()
    for _ in range(breaker_module.FAILURES):
        b.failure()
    b.recovered()
    assert b.open  # not before the cool-down
    now[0] += breaker_module.COOLDOWN_S
    b.recovered()
    assert not b.open
    b.allow()
    b.allow()
    assert not b.open  # many requests may go, not one trial
    b.failure()  # one failure on probation: open again, for twice the cool-down
    now[0] += breaker_module.COOLDOWN_S
    assert b.open


class FakeBackend:
    """A backend double for the router's decisions: its load, state and what its streams do are set by the test."""

    kind = "remote"
    url = None

    def __init__(self, name: str, load: Load | None = None, fail: BaseException | None = None) -> None:
        self.name = name
        self._load = load
        self.fail = fail
        self.up = True
        self.started: list[str] = []

    def models(self) -> dict[str, Served]:
        return {"m": Served("m", "m", INFO, None)} if self.up else {}

    def state(self) -> str:
        return "up" if self.up else "down"

    def load(self) -> Load | None:
        return self._load

    def generate(
        self,
        served: Served,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> AsyncIterator[RequestOutput]:
        self.started.append(request_id)
        return self._stream(request_id)

    async def _stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        if self.fail is not None:
            raise self.fail
        yield RequestOutput(request_id, [1], "a")
        yield RequestOutput(request_id, [2], "b", finished=True, finish_reason="stop")

    async def abort(self, request_id: str) -> None:
        return None

    async def probe(self) -> None:
        return None


def picks(router: Router, n: int = 400, prompt: Sequence[int] = (1, 2, 3)) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _ in range(n):
        chosen = router.pick("m", prompt)
        assert chosen is not None
        counts[chosen.name] = counts.get(chosen.name, 0) + 1
    return counts


def test_power_of_two_choices_prefers_the_less_loaded() -> None:
    idle, busy, busier = (
        FakeBackend("idle", Load(0, 1, 0.1)),
        FakeBackend("busy", Load(5, 8, 0.3)),
        FakeBackend("x", Load(9, 9, 0.2)),
    )
    counts = picks(Router([idle, busy, busier], rng=random.Random(1)))
    # The idle one wins whenever it is drawn (2 of 3 pairs); the busiest never wins a pair.
    assert counts["idle"] > 230 and "x" not in counts


def test_equal_loads_spread_and_exports_nothing_falls_back_to_in_flight() -> None:
    a, b = FakeBackend("a"), FakeBackend("b")
    router = Router([a, b], rng=random.Random(2))
    counts = picks(router)
    assert min(counts.values()) > 150
    router.seats.taken["a"] += 1  # the gateway has a request open on a: b is less loaded now
    assert set(picks(router, 50)) == {"b"}


def test_backends_with_full_kv_are_avoided_while_another_has_room() -> None:
    full, roomy = FakeBackend("full", Load(0, 0, KV_FULL + 0.05)), FakeBackend("roomy", Load(3, 3, 0.5))
    assert set(picks(Router([full, roomy], rng=random.Random(3)), 50)) == {"roomy"}
    both_full = Router([full, FakeBackend("also", Load(2, 2, 0.99))], rng=random.Random(3))
    assert set(picks(both_full, 50)) == {"full"}  # all full: the load decides again


def test_stickiness_keeps_a_conversation_home_until_it_is_busier() -> None:
    backends = [FakeBackend(f"b{i}", Load(0, 0, 0.1)) for i in range(4)]
    router = Router(backends, sticky=True, rng=random.Random(4))
    homes = {tuple(p): set(picks(router, 20, p)) for p in ([1, 2, 3], [7, 8, 9], [4, 4, 4], [5, 6])}
    assert all(len(h) == 1 for h in homes.values())  # each conversation always lands on one backend
    assert len(set.union(*homes.values())) > 1  # and conversations spread
    home = next(iter(homes[(1, 2, 3)]))
    next(b for b in backends if b.name == home)._load = Load(10, 10, 0.1)
    assert home not in picks(router, 20, [1, 2, 3])  # unbalanced: overridden


async def collect(router: Router, request_id: str = "r") -> tuple[list[RequestOutput], str | None]:
    stream = router.generate("m", [1, 2], SamplingParams(max_tokens=2), request_id)
    outs = [out async for out in stream]
    return outs, stream.backend_name


@pytest.mark.parametrize("error", [EngineDeadError("gone"), QueueFullError("busy")])
def test_a_failure_before_the_first_delta_is_retried_once_elsewhere(error: Exception) -> None:
    broken, good = FakeBackend("broken", Load(0, 0, 0.0), fail=error), FakeBackend("good", Load(5, 5, 0.0))
    router = Router([broken, good], rng=random.Random(5))
    outs, name = asyncio.run(collect(router))
    assert [o.text for o in outs] == ["a", "b"] and name == "good"
    assert broken.started == ["r"] and good.started == ["r"]
    assert not any(router.seats.taken.values())
    # Both failing: the second failure is the client's.
    good.fail = EngineDeadError("also gone")
    with pytest.raises(EngineDeadError, match="gone"):
        asyncio.run(collect(router, "s"))
    assert len(broken.started) + len(good.started) == 4  # one try and one retry


def test_a_refusal_of_the_request_itself_is_not_retried() -> None:
    bad, other = (
        FakeBackend("bad", Load(0, 0, 0.0), fail=InvalidRequestError("no")),
        FakeBackend("other", Load(9, 9, 0)),
    )
    with pytest.raises(InvalidRequestError):
        asyncio.run(collect(Router([bad, other], rng=random.Random(6))))
    assert other.started == []


def test_no_backend_up_for_the_model() -> None:
    down = FakeBackend("down")
    down.up = False
    router = Router([down])
    with pytest.raises(EngineDeadError, match="no backend serving 'm' is up"):
        asyncio.run(collect(router))
    assert router.model_names() == [] and not router.known("m")


class HeldBackend(FakeBackend):
    """Its streams give one token, then hold their seat until the test releases them."""

    def __init__(self, name: str) -> None:
        super().__init__(name, Load(0, 0, 0.0))
        self.release = asyncio.Event()

    async def _stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        yield RequestOutput(request_id, [1], "a")
        await self.release.wait()
        yield RequestOutput(request_id, [2], "b", finished=True, finish_reason="stop")


def test_with_every_seat_taken_the_lightest_tenant_gets_the_next_one() -> None:
    async def scenario() -> tuple[list[str], Any, Any]:
        backend = HeldBackend("remote")
        router = Router([backend], seats={"remote": 1})
        heavy, light = Tenant("heavy"), Tenant("light")
        order: list[str] = []

        async def run(request_id: str, tenant: Tenant) -> None:
            stream = router.generate("m", [1, 2, 3, 4], SamplingParams(max_tokens=2), request_id, tenant=tenant)
            async for out in stream:
                if out.token_ids == [1]:
                    order.append(request_id)

        first = asyncio.ensure_future(run("heavy-0", heavy))
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(run(f"heavy-{i}", heavy)) for i in range(1, 4)]
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(run("light-0", light))
        await asyncio.sleep(0.01)
        positions = (router.queue_position("heavy-1"), router.queue_position("light-0"))
        assert backend.started == ["heavy-0"]  # one seat: the rest wait in the gateway
        backend.release.set()
        await asyncio.gather(first, *queued, late)
        return order, positions, router.seats.taken["remote"]

    order, (heavy_1, light_0), taken = asyncio.run(scenario())
    # The light tenant arrives last, lifted to the heavy one's counter (idleness banks no credit), so it is
    # projected last among equals; but the heavy tenant is charged heavy-0's last token before the seat frees,
    # and the light one gets it (first come, first served would have put it last).
    assert heavy_1 is not None and heavy_1.position == 1 and light_0 is not None and light_0.position == 4
    assert order == ["heavy-0", "light-0", "heavy-1", "heavy-2", "heavy-3"] and taken == 0


def test_a_request_aborted_while_it_waits_for_a_seat_ends_as_aborted() -> None:
    async def scenario() -> list[RequestOutput]:
        backend = HeldBackend("remote")
        router = Router([backend], seats={"remote": 1})
        holder = router.generate("m", [1], SamplingParams(max_tokens=2), "holder")
        await anext(holder)
        waiting = router.generate("m", [1], SamplingParams(max_tokens=2), "waiting")
        pending = asyncio.ensure_future(anext(waiting))
        await asyncio.sleep(0.01)
        await router.abort("waiting")
        outs = [await pending]
        backend.release.set()
        outs += [out async for out in holder]
        assert backend.started == ["holder"] and router.queue_position("waiting") is None
        return outs

    first, *rest = asyncio.run(scenario())
    assert first.finished and first.finish_reason == "abort" and rest[-1].finish_reason == "stop"
