"""Clients that go away on a real server, several at once: before their first byte (queued or mid-prefill) and
mid-decode, streamed or not. The engine must end up idle with every KV block back, each row cancelled, and the
quota holding exactly the tokens charged (the prompt counts once output began; test_lifecycle.py has the rule)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.robustness.conftest import (
    MODEL,
    RawCall,
    charged,
    fault,
    quota_of,
    rows_of,
    settled_rows,
    until,
    wait_idle,
)
from tests.web.server import Server

pytestmark = pytest.mark.slow
VOCAB = 49_152


async def first_to_answer(calls: list[RawCall], timeout: float) -> None:
    waiters = [asyncio.create_task(c.first_event.wait()) for c in calls]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def test_disconnect_before_the_first_byte_frees_the_kv_cache(server: Server) -> None:
    """Twelve 1,900-token prompts at once; all clients leave the moment the first one is answered, so the others
    are cut while queued or mid-prefill (the engine prefills 512 tokens a step)."""
    key = server.new_key("cut-in-prefill")
    rng = random.Random(2)
    with fault("client disconnect mid-prefill") as figures:
        calls = []
        for _ in range(12):
            prompt = [rng.randrange(3, VOCAB) for _ in range(1_900)]
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 100, "ignore_eos": True, "stream": True}
            calls.append(await RawCall.open(server, "/v1/completions", key, body))
        await first_to_answer(calls, timeout=60)
        for call in calls:
            await call.cut()
        # Cut before any output: a stream queued for a second has had a ": waiting" notice, never a `data:` event.
        received = [call.events for call in calls]
        unanswered = received.count(0)
        figures["requests cut before their first byte"] = unanswered

        idle = await wait_idle(server)
        rows = await settled_rows(server, key, len(calls))
        usage = quota_of(server, key)
        assert unanswered >= 6, received  # most of them never saw a byte
        assert idle["engine"]["kv_blocks_used"] == 0 and idle["engine"]["running"] == 0
        ends = [(r["status"], r["error"]) for r in rows]
        assert [r["status"] for r in rows] == ["cancelled"] * len(calls), ends
        assert all("disconnected" in r["error"] for r in rows), ends
        assert sum(1 for r in rows if r["completion_tokens"] == 0) >= unanswered - 1  # at most one raced its cut
        assert (usage["used_tokens"], usage["reserved_tokens"]) == (charged(rows), 0)


async def test_a_client_gone_mid_body_is_cancelled_not_refused(server: Server) -> None:
    """A client that leaves before its body is read (a slow handler under load meets uvicorn's http.disconnect
    even with the whole body buffered) is no bad input: a cancelled row, no refusal, nothing charged."""
    key = server.new_key("cut-in-body")
    with fault("client disconnect mid-body"):
        body = {"model": MODEL, "prompt": "never read", "max_tokens": 10, "stream": True}
        call = await RawCall.open(server, "/v1/completions", key, body, body_part=0.5)
        await asyncio.sleep(0.2)  # the handler is waiting for the rest of the body
        assert await call.cut() == 0
        (row,) = await settled_rows(server, key, 1)
        assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == ("cancelled", 0, 0), dict(row)
        assert "disconnected" in row["error"]
        usage = quota_of(server, key)
        assert (usage["used_tokens"], usage["reserved_tokens"]) == (0, 0)


async def test_disconnect_mid_decode_frees_the_kv_cache_and_charges_the_tokens(server: Server) -> None:
    """Six streams and two plain requests, cut once every one has produced output (its row is running)."""
    key = server.new_key("cut-in-decode")
    body = {"model": MODEL, "max_tokens": 1_500, "ignore_eos": True}
    with fault("client disconnect mid-decode") as figures:
        streams = [
            await RawCall.open(server, "/v1/chat/completions", key, {
                **body, "stream": True, "messages": [{"role": "user", "content": f"count to {i}"}]
            })
            for i in range(6)
        ]  # fmt: skip
        plain = [await RawCall.open(server, "/v1/completions", key, {**body, "prompt": [7, 8, i]}) for i in range(2)]
        await until(lambda: all(s.events >= 3 for s in streams), "three events on every stream")
        await until(lambda: [r["status"] for r in rows_of(server, key)] == ["running"] * 8, "8 running rows")
        for call in streams + plain:
            await call.cut()
        figures["requests cut mid-decode"] = len(streams) + len(plain)

        idle = await wait_idle(server)
        rows = await settled_rows(server, key, 8)
        usage = quota_of(server, key)
        assert idle["engine"]["kv_blocks_used"] == 0 and idle["in_flight"] == 0
        assert [r["status"] for r in rows] == ["cancelled"] * 8
        assert all(1 <= r["completion_tokens"] < 1_500 for r in rows), [r["completion_tokens"] for r in rows]
        assert usage["used_tokens"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
        assert usage["reserved_tokens"] == 0
