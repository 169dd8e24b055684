"""Issue 12 on the request path: each request reaches the engine as its key's tenant (id, weight, class), and a
streamed request that waits for a seat tells its client where it stands with SSE comments."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from engine import Tenant
from tests.web.conftest import ADMIN, InLoop, assert_openai_error, bearer, new_key, rows, sse_events
from tests.web.fakes import FakeEngineClient
from tests.web.test_lifecycle import call_then_disconnect

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_each_request_reaches_the_engine_as_its_keys_tenant(client: Any, fake: FakeEngineClient) -> None:
    chat_key = await new_key(client, "chat")
    batch_key = await new_key(client, "nightly", weight=0.5, priority="batch")
    listed = {k["name"]: k["id"] for k in (await client.get("/admin/api/keys", headers=ADMIN)).json()}
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer(chat_key))).status_code == 200
    body = {"model": "fake-model", "prompt": "go", "max_tokens": 2, "stream": True}
    assert (await client.post("/v1/completions", json=body, headers=bearer(batch_key))).status_code == 200
    assert list(fake.tenants.values()) == [
        Tenant(str(listed["chat"]), 1.0, "interactive"),
        Tenant(str(listed["nightly"]), 0.5, "batch"),
    ]
    await client.patch(f"/admin/api/keys/{listed['nightly']}", json={"weight": 4}, headers=ADMIN)
    assert (await client.post("/v1/completions", json=body, headers=bearer(batch_key))).status_code == 200
    assert list(fake.tenants.values())[-1] == Tenant(str(listed["nightly"]), 4.0, "batch"), "a change applies at once"


def comments_and_events(text: str) -> tuple[list[str], list[Any]]:
    """The SSE comments of a stream (what OpenAI clients skip), and the data of its events."""
    comments = [block[1:].strip() for block in text.split("\n\n") if block.startswith(":")]
    data = "\n\n".join(block for block in text.split("\n\n") if block.strip() and not block.startswith(":"))
    return comments, sse_events(data + "\n\n")


async def test_a_queued_stream_is_told_its_place_about_once_a_second(client: Any, fake: FakeEngineClient) -> None:
    fake.queue_wait, fake.queue_ahead = 2.5, 2
    key = await new_key(client)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
    assert response.status_code == 200
    comments, events = comments_and_events(response.text)
    assert comments == ["queued position=3 eta=2", "queued position=3 eta=1"], response.text
    assert events[0]["choices"][0]["delta"]["role"] == "assistant" and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"]) == "t0 t1 t2 "


async def test_a_stream_served_at_once_has_no_comments(client: Any, fake: FakeEngineClient) -> None:
    key = await new_key(client)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
    assert response.status_code == 200 and not response.text.startswith(":")
    assert sse_events(response.text)[-1] == "[DONE]"


async def test_a_refusal_before_the_wait_keeps_its_status(client: Any, fake: FakeEngineClient) -> None:
    fake.queue_wait, fake.reject_next = 2.5, "queue_full"
    key = await new_key(client)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
    assert_openai_error(response, 503)


async def test_an_engine_dying_while_a_stream_waits_is_said_in_band(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.queue_wait, in_loop.fake.queue_ahead = 2.5, 0
    key = await new_key(in_loop.http)
    in_loop.fake.token_delay = 0.01
    asyncio.get_running_loop().call_later(1.5, in_loop.fake.kill)
    response = await in_loop.http.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
    assert response.status_code == 200
    comments, events = comments_and_events(response.text)
    assert comments[0] == "queued position=1 eta=2" and len(comments) <= 2
    assert [e["error"]["code"] for e in events] == ["engine_unavailable"]
    await in_loop.gateway.writer.flush()
    assert [r["status"] for r in rows(db, "SELECT status FROM requests")] == ["failed"]
    assert rows(db, "SELECT reserved_tokens FROM key_usage")[0]["reserved_tokens"] == 0


async def test_a_client_leaving_while_queued_cancels_the_request(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.queue_wait = 5.0
    key = await new_key(in_loop.http)
    chunks = await call_then_disconnect(in_loop.app, key, {**CHAT, "stream": True}, after_chunks=1)
    assert chunks[0].startswith(b": queued position=1")
    await in_loop.gateway.writer.flush()
    assert [r["status"] for r in rows(db, "SELECT status FROM requests")] == ["cancelled"]
    assert in_loop.fake.closed_early == list(in_loop.fake.tenants), "the engine request was stopped"
    assert rows(db, "SELECT reserved_tokens FROM key_usage")[0]["reserved_tokens"] == 0
