"""Requests meeting the world: client disconnects (streamed and not, before and after the first token), the
engine dying mid-request and coming back, and the drain at shutdown."""

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from litestar import Litestar

from tests.waiting import until
from tests.web.conftest import METRICS_TOKEN, MODEL, InLoop, assert_openai_error, bearer, new_key, rows, sse_events

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}  # 19 prompt tokens


async def call_then_disconnect(
    app: Litestar,
    key: str,
    body: dict[str, Any],
    *,
    after_chunks: int | None = None,
    after_s: float | None = None,
    until: Callable[[], bool] | None = None,
    mid_body: bool = False,
    statuses: list[int] | None = None,
    path: str = "/v1/chat/completions",
) -> list[bytes]:
    """Drive the ASGI app like a server whose client goes away after some body chunks or some seconds, or
    (mid_body) halfway through sending its body; `statuses` collects the response's status."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("10.9.8.7", 4000), "server": ("appliance", 80),
        "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
        "state": {},
    }  # fmt: skip
    gone = asyncio.Event()
    sent_body = False
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            if mid_body:
                return {"type": "http.request", "body": raw[: len(raw) // 2], "more_body": True}
            return {"type": "http.request", "body": raw, "more_body": False}
        if not mid_body:
            await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and statuses is not None:
            statuses.append(message["status"])
        if message["type"] == "http.response.body" and message.get("body"):
            chunks.append(message["body"])
            if after_chunks is not None and len(chunks) >= after_chunks:
                gone.set()

    if after_s is not None:
        asyncio.get_running_loop().call_later(after_s, gone.set)

    async def watch() -> None:
        while until is not None and not until():
            await asyncio.sleep(0.01)
        gone.set()

    watcher = asyncio.create_task(watch()) if until is not None else None
    await asyncio.wait_for(app(scope, receive, send), 10)  # type: ignore[arg-type]
    if watcher is not None:
        watcher.cancel()
    return chunks


async def test_stream_disconnect_aborts_and_charges_tokens_so_far(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http, quota_tokens=10_000)
    body = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}
    chunks = await call_then_disconnect(in_loop.app, key, body, after_chunks=3)
    assert len(chunks) >= 3
    await in_loop.gateway.writer.flush()
    (row,) = rows(db, "SELECT * FROM requests")
    assert row["status"] == "cancelled" and "disconnected" in row["error"]
    assert row["id"] in in_loop.fake.closed_early  # the engine request was aborted, not run to the end
    generated = in_loop.fake.generated[row["id"]]
    assert 3 <= row["completion_tokens"] <= generated < 200
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert quota["used_tokens"] == 19 + row["completion_tokens"] and quota["reserved_tokens"] == 0
    assert not in_loop.gateway.inflight and in_loop.gateway.limiter.in_flight(1) == 0


async def test_disconnect_before_the_first_token(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 1.0  # a long "prefill"
    key = await new_key(in_loop.http)
    for stream in (True, False):
        await call_then_disconnect(in_loop.app, key, {**CHAT, "stream": stream}, after_s=0.1)
    await in_loop.gateway.writer.flush()
    found = rows(db, "SELECT id, status, completion_tokens FROM requests")
    assert [(r["status"], r["completion_tokens"]) for r in found] == [("cancelled", 0)] * 2
    assert {r["id"] for r in found} <= set(in_loop.fake.closed_early)
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert (quota["used_tokens"], quota["reserved_tokens"]) == (0, 0)


async def test_a_client_gone_before_its_body_was_read_is_cancelled_not_refused(
    in_loop: InLoop, db: sqlite3.Connection
) -> None:
    """Under load the handler may read the body only after the client left: that is no bad input (it was
    recorded as rejected, a 400, and counted among the refusals), and nothing reaches the engine."""
    key = await new_key(in_loop.http, quota_tokens=10_000)
    statuses: list[int] = []
    await call_then_disconnect(in_loop.app, key, {**CHAT, "stream": True}, mid_body=True, statuses=statuses)
    await in_loop.gateway.writer.flush()
    assert statuses == [499]
    (row,) = rows(db, "SELECT status, error, prompt_tokens, completion_tokens FROM requests")
    assert row["status"] == "cancelled" and "disconnected" in row["error"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (0, 0) and not in_loop.fake.generated
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert (quota["used_tokens"], quota["reserved_tokens"]) == (0, 0)
    scraped = (await in_loop.http.get("/metrics", headers=bearer(METRICS_TOKEN))).text
    assert 'appliance_requests_total{status="cancelled"} 1.0' in scraped
    assert not [line for line in scraped.splitlines() if line.startswith("appliance_requests_rejected_total{")]
    assert not in_loop.gateway.inflight and in_loop.gateway.limiter.in_flight(1) == 0


async def test_a_messages_client_gone_before_its_body_was_read_gets_the_same(
    in_loop: InLoop, db: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """The Messages API restates error bodies in Anthropic's shape; the empty 499 is none, and is left as it is."""
    key = await new_key(in_loop.http)
    statuses: list[int] = []
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.ERROR):
        await call_then_disconnect(in_loop.app, key, body, mid_body=True, statuses=statuses, path="/v1/messages")
    await in_loop.gateway.writer.flush()
    assert statuses == [499]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    (row,) = rows(db, "SELECT status, error, endpoint FROM requests")
    assert (row["status"], row["endpoint"]) == ("cancelled", "messages") and "disconnected" in row["error"]


async def test_non_stream_disconnect_mid_generation(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http)

    # Leave once a few tokens exist, however slow the machine: a fixed delay may pass before the first one.
    def some_generated() -> bool:
        return any(n >= 5 for n in in_loop.fake.generated.values())

    await call_then_disconnect(in_loop.app, key, {**CHAT, "max_tokens": 100, "ignore_eos": True}, until=some_generated)
    await in_loop.gateway.writer.flush()
    (row,) = rows(db, "SELECT status, completion_tokens FROM requests")
    assert row["status"] == "cancelled" and 0 < row["completion_tokens"] < 100


async def test_engine_death_fails_requests_then_service_resumes(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http)
    body = {**CHAT, "max_tokens": 100, "ignore_eos": True}

    async def kill_soon() -> None:  # once both generate (past the gate), however slow the machine
        await until(lambda: len(in_loop.fake.generated) == 2 and min(in_loop.fake.generated.values()) >= 1, "both")
        in_loop.fake.kill()

    killer = asyncio.create_task(kill_soon())
    streamed, plain = await asyncio.gather(
        in_loop.http.post("/v1/chat/completions", json={**body, "stream": True}, headers=bearer(key)),
        in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)),
    )
    await killer
    assert_openai_error(plain, 503, "engine_unavailable")
    events = sse_events(streamed.text)
    assert events[-1]["error"]["code"] == "engine_unavailable" and "[DONE]" not in events
    assert_openai_error(await in_loop.http.get("/ready"), 503, "engine_unavailable")
    refused = await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert_openai_error(refused, 503)
    await in_loop.fake.restart()
    assert (await in_loop.http.get("/ready")).status_code == 200
    assert (await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 200
    statuses = [r["status"] for r in rows(db, "SELECT status FROM requests ORDER BY arrival_at")]
    assert sorted(statuses[:2]) == ["failed", "failed"] and statuses[2:] == ["rejected", "finished"]
    assert rows(db, "SELECT reserved_tokens FROM key_usage")[0]["reserved_tokens"] == 0


async def test_drain_lets_requests_finish_and_refuses_new_ones(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http)
    body = {**CHAT, "max_tokens": 25, "ignore_eos": True, "stream": True}
    running = asyncio.create_task(in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
    await until(lambda: in_loop.fake.generated, "the request to generate")
    draining = asyncio.create_task(in_loop.gateway.inflight.drain(timeout=5))
    await asyncio.sleep(0.05)
    assert_openai_error(await in_loop.http.get("/ready"), 503, "not_ready")
    late = await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert "draining" in assert_openai_error(late, 503)["message"]
    assert sse_events((await running).text)[-1] == "[DONE]"
    await draining
    statuses = [r["status"] for r in rows(db, "SELECT status FROM requests ORDER BY arrival_at")]
    assert statuses == ["finished", "rejected"]


async def test_drain_timeout_aborts_and_finalizes_the_rest(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http)
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True}
    streamed = asyncio.create_task(
        in_loop.http.post("/v1/chat/completions", json={**body, "stream": True}, headers=bearer(key))
    )
    plain = asyncio.create_task(in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
    # Both generating before the drain, however long a garbage collection takes (a fixed 0.1 s was not always).
    while len(in_loop.fake.generated) < 2 or min(in_loop.fake.generated.values()) < 1:
        await asyncio.sleep(0.01)
    await in_loop.gateway.inflight.drain(timeout=0.2)
    assert sse_events((await streamed).text)[-1]["error"]["code"] == "aborted"
    assert_openai_error(await plain, 503, "aborted")
    found = rows(db, "SELECT status, error, completion_tokens FROM requests")
    assert [r["status"] for r in found] == ["interrupted", "interrupted"]
    assert all("drain timeout" in r["error"] and 0 < r["completion_tokens"] < 400 for r in found)
    assert rows(db, "SELECT reserved_tokens FROM key_usage")[0]["reserved_tokens"] == 0


async def test_shutdown_with_requests_in_flight_finalizes_them(app: Litestar, fake: Any, db: Any) -> None:
    from tests.web.conftest import lifespan, wait_ready

    fake.token_delay = 0.02
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance") as http:
            await wait_ready(http)
            key = await new_key(http)
            body = {**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True}
            pending = asyncio.create_task(http.post("/v1/chat/completions", json=body, headers=bearer(key)))
            await until(lambda: fake.generated, "the request to generate")
    # the drain timeout of the test config is 2 s: the request was aborted, its row finalized
    await pending
    (row,) = rows(db, "SELECT status FROM requests")
    assert row["status"] == "interrupted" and fake.shutdown_called
