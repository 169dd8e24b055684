"""Issue 17's Q1 and Q2: max_tokens is an upper bound that a small quota lowers rather than refuses, and a 429
says what waiting can do (Retry-After where the limit ends; no promise of a reset that never comes)."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from tests.web.conftest import InLoop, assert_openai_error, bearer, new_key, rows

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
PROMPT_TOKENS = 22  # the fake tokenizer: one token per character of "<user>hello<assistant>"


async def test_a_request_runs_with_what_the_quota_has_left(client: Any, fake: Any, db: sqlite3.Connection) -> None:
    """Q1: with 500 tokens of quota, the chat page's first message (max_tokens 512) was refused for a month."""
    key = await new_key(client, quota_tokens=100, quota_period="month")
    response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 400}, headers=bearer(key))
    assert response.status_code == 200, response.text
    assert fake.requests[-1][2].max_tokens == 100 - PROMPT_TOKENS
    (row,) = rows(db, "SELECT status, max_tokens_requested, max_tokens_applied FROM requests")
    assert (row["status"], row["max_tokens_requested"]) == ("finished", 400)
    assert row["max_tokens_applied"] == 100 - PROMPT_TOKENS


async def test_the_lowered_request_ends_at_length(client: Any, fake: Any) -> None:
    key = await new_key(client, quota_tokens=PROMPT_TOKENS + 3, quota_period="day")
    body = {**CHAT, "max_tokens": 50, "ignore_eos": True}
    response = await client.post("/v1/chat/completions", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == 3


async def test_a_prompt_beyond_what_is_left_is_refused(client: Any, db: sqlite3.Connection) -> None:
    key = await new_key(client, quota_tokens=PROMPT_TOKENS, quota_period="day")
    refused = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    error = assert_openai_error(refused, 429, "insufficient_quota")
    assert "no room for a completion" in error["message"] and "retry-after" in refused.headers
    assert [r["status"] for r in rows(db, "SELECT status FROM requests")] == ["rejected"]


async def test_a_quota_that_never_resets_promises_no_reset(client: Any) -> None:
    """Q2: a spent key of period "none" was told to "wait for the reset"."""
    key = await new_key(client, quota_tokens=10, quota_period="none")
    refused = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    error = assert_openai_error(refused, 429, "insufficient_quota")
    assert "retry-after" not in refused.headers
    assert "reset" not in error["message"] and "administrator" in error["message"]


async def test_a_concurrency_refusal_says_when_to_retry(in_loop: InLoop) -> None:
    """Q2: the 429 of a key at its concurrency limit had no Retry-After."""
    in_loop.fake.token_delay = 0.05
    key = await new_key(in_loop.http, max_concurrent=1)
    first = asyncio.create_task(
        in_loop.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}, headers=bearer(key))
    )
    while not in_loop.gateway.inflight:
        await asyncio.sleep(0.005)
    refused = await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert_openai_error(refused, 429, "rate_limit_exceeded")
    assert refused.headers["retry-after"] == "1"
    assert (await first).status_code == 200
