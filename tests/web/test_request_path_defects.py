"""Issue 17's defects on the request path (H1, H2, C1, P1; tests/robustness/BUGS.md keeps the record): a
cancelled stream keeps its queue wait, an engine crash is visible and named, integral-float token counts and
stream_options are judged as OpenAI and vLLM do, and a prompt far past the context is refused untokenized."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from engine import RequestOutput, Timings
from tests.waiting import until
from tests.web.conftest import (
    ADMIN,
    METRICS_TOKEN,
    MODEL,
    InLoop,
    assert_openai_error,
    bearer,
    new_key,
    rows,
    sign_in,
)
from tests.web.fakes import FakeTokenizer
from tests.web.test_lifecycle import CHAT, call_then_disconnect
from web.generation.prompts import MAX_CHARS_PER_TOKEN


async def test_a_stream_cancelled_after_its_first_token_keeps_its_queue_wait(
    in_loop: InLoop, db: sqlite3.Connection
) -> None:
    in_loop.fake.token_delay = 0.05  # scheduled, then the first token 50 ms later
    key = await new_key(in_loop.http)
    body = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}
    await call_then_disconnect(in_loop.app, key, body, after_chunks=3)
    await in_loop.gateway.writer.flush()
    (row,) = rows(db, "SELECT status, admitted_at, first_token_at, queue_wait_s, ttft_s FROM requests")
    assert row["status"] == "cancelled" and row["first_token_at"] is not None
    assert row["admitted_at"] is not None and row["queue_wait_s"] is not None
    assert 0 <= row["queue_wait_s"] < row["ttft_s"]  # the engine's schedule time, not the first token's


def test_a_merged_delta_keeps_the_first_deltas_timings() -> None:
    first = RequestOutput("r", [1], "a", timings=Timings(1.0, 2.0, 3.0, None))
    first.merge(RequestOutput("r", [2], "b"))
    assert first.timings == Timings(1.0, 2.0, 3.0, None)


async def _engine_state(http: Any) -> str:
    """The dashboard's engine-state partial, as htmx polls it."""
    response = await http.get("/admin", headers={"HX-Request": "true", "HX-Target": "engine-state"})
    assert response.status_code == 200, response.text
    return str(response.text)


async def test_an_engine_crash_is_named_to_clients_the_console_stats_and_metrics(in_loop: InLoop) -> None:
    fake, http = in_loop.fake, in_loop.http
    key = await new_key(http)
    await sign_in(http)  # before the crash: hashing the password on a slow machine outlasted the restart
    fake.kill()
    down = assert_openai_error(await http.post("/v1/chat/completions", json=CHAT, headers=bearer(key)), 503)
    assert down["code"] == "engine_unavailable" and "code -9" in down["message"]
    fake.start_gate = asyncio.Event()  # the restart lasts until every check below is done, however slow the box
    restarting = asyncio.create_task(fake.restart())
    await until(lambda: fake.state == "loading", "the restart to begin")
    refused = assert_openai_error(await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"},
                                                  headers=bearer(key)), 503, "engine_unavailable")  # fmt: skip
    assert "restarting: after a crash (1 restart; last: the engine process exited (code -9))" in refused["message"]
    assert_openai_error(await http.get("/ready"), 503, "engine_unavailable")
    fragment = await _engine_state(http)
    assert "restarting: after a crash (1 restart; last: the engine process exited (code -9))" in fragment
    assert 'data-state="loading"' not in fragment
    stats = (await http.get("/admin/api/stats", headers=ADMIN)).json()
    assert (stats["restarts"], stats["last_exit"]) == (1, "the engine process exited (code -9)")
    scraped = (await http.get("/metrics", headers=bearer(METRICS_TOKEN))).text
    assert "appliance_engine_restarts_total 1.0" in scraped
    fake.start_gate.set()
    await restarting
    assert (await http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 200
    assert "1 restart after a crash" in await _engine_state(http)


async def test_integral_float_max_tokens_are_counts(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    for body in ({**CHAT, "max_tokens": 3.0}, {**CHAT, "max_completion_tokens": 3.0}):
        answered = await in_loop.http.post("/v1/chat/completions", json={**body, "ignore_eos": True},
                                           headers=bearer(key))  # fmt: skip
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == 3
    completion = {"model": MODEL, "prompt": "hi", "max_tokens": 2.0, "ignore_eos": True}
    answered = await in_loop.http.post("/v1/completions", json=completion, headers=bearer(key))
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 2
    fraction = await in_loop.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2.5}, headers=bearer(key))
    assert_openai_error(fraction, 400, param="max_tokens")


async def test_stream_options_need_stream(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    options = {"stream_options": {"include_usage": True}}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        refused = await in_loop.http.post(path, json={**body, **options}, headers=bearer(key))
        assert assert_openai_error(refused, 400, param="stream_options")["type"] == "invalid_request_error"
        streamed = await in_loop.http.post(path, json={**body, **options, "stream": True}, headers=bearer(key))
        assert streamed.status_code == 200, streamed.text


class _CountingTokenizer(FakeTokenizer):
    def __init__(self) -> None:
        self.chars = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.chars += len(text)
        return super().encode(text, add_special_tokens)


async def test_a_prompt_past_what_the_context_can_hold_is_refused_untokenized(in_loop: InLoop) -> None:
    in_loop.fake.tokenizer = tokenizer = _CountingTokenizer()
    key = await new_key(in_loop.http)
    huge = "x" * (in_loop.fake.max_model_len * MAX_CHARS_PER_TOKEN + 1)
    chat = {**CHAT, "messages": [{"role": "user", "content": huge}]}
    calls = (
        ("/v1/chat/completions", chat, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": huge}, "prompt"),
    )
    for path, body, param in calls:
        refused = await in_loop.http.post(path, json=body, headers=bearer(key))
        assert_openai_error(refused, 400, "context_length_exceeded", param)
    assert tokenizer.chars == 0


async def test_a_key_without_a_quota_is_queued_on_the_engine_while_its_row_is_written(
    in_loop: InLoop, db: sqlite3.Connection, monkeypatch: Any
) -> None:
    """The database's commit overlaps the engine's queue; a refused write stops the engine request, and the client
    gets the storage refusal, not a token."""
    ledger = in_loop.gateway.ledger
    key = await new_key(in_loop.http)
    written, release = asyncio.Event(), asyncio.Event()
    reserve = ledger._reserve

    async def slow_reserve(*args: Any) -> bool:
        written.set()
        await release.wait()
        return await reserve(*args)

    monkeypatch.setattr(ledger, "_reserve", slow_reserve)
    call = asyncio.create_task(in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key)))
    await written.wait()
    for _ in range(100):
        if in_loop.fake.requests:
            break
        await asyncio.sleep(0.01)
    assert [rid for rid, _, _ in in_loop.fake.requests] and not rows(db, "SELECT id FROM requests")
    release.set()
    answered = await call
    assert answered.status_code == 200, answered.text
    (row,) = rows(db, "SELECT id, status FROM requests")
    assert row["status"] == "finished" and in_loop.fake.requests[0][0] == row["id"]

    before = len(in_loop.fake.requests)

    async def refused(*args: Any) -> bool:
        while len(in_loop.fake.requests) == before:  # the engine has it, and is generating
            await asyncio.sleep(0.01)
        raise OSError("disk gone")

    monkeypatch.setattr(ledger, "_reserve", refused)
    body = {**CHAT, "max_tokens": 300, "ignore_eos": True}
    assert_openai_error(await in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)), 503)
    stopped = in_loop.fake.requests[before][0]
    await asyncio.sleep(0.05)
    fake = in_loop.fake
    assert stopped in fake.aborted + fake.closed_early, (fake.aborted, fake.closed_early)
    assert fake.generated.get(stopped, 0) < 300


async def test_a_key_with_a_quota_is_reserved_before_the_engine_sees_it(in_loop: InLoop, monkeypatch: Any) -> None:
    """Its max_tokens is what its quota has left: the reservation decides it before the request is queued."""
    ledger = in_loop.gateway.ledger
    key = await new_key(in_loop.http, "metered", quota_tokens=40)
    seen: list[int] = []
    reserve = ledger._reserve

    async def watched(*args: Any) -> bool:
        seen.append(len(in_loop.fake.requests))
        return await reserve(*args)

    monkeypatch.setattr(ledger, "_reserve", watched)
    answered = await in_loop.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 300}, headers=bearer(key))
    assert answered.status_code == 200, answered.text
    assert seen and seen[0] == 0  # nothing queued before the reservation
    assert in_loop.fake.requests[0][2].max_tokens < 300  # cut to what the quota had left
