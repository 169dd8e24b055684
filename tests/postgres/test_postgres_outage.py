"""PostgreSQL going away under a running gateway (a crash, a restart, a failover): new requests get a 503 to retry,
the requests in flight still reach their clients, and their rows and quota charges are written once the database
is back, none lost."""

from __future__ import annotations

import asyncio

from tests.postgres.conftest import fetch, gateways
from tests.postgres.server import Server
from tests.waiting import until
from tests.web.conftest import assert_openai_error, bearer, new_key, sse_events

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
PROMPT_TOKENS = 19


async def test_a_database_restart_mid_stream_loses_no_row_and_no_charge(pg_server: Server, pg_url: str) -> None:
    async with gateways(pg_url, 1) as (one,):
        key = await new_key(one.http, quota_tokens=10_000, quota_period="none")
        one.fake.token_delay = 0.05  # 3 s each: the database stops while all three stream
        body = {**CHAT, "max_tokens": 60, "ignore_eos": True, "stream": True}
        streams = [
            asyncio.create_task(one.http.post("/v1/chat/completions", json=body, headers=bearer(key))) for _ in range(3)
        ]
        await until(lambda: len(one.gateway.inflight) == 3, "three streams admitted (their reservations written)")
        pg_server.stop()
        try:
            refused = await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
            assert_openai_error(refused, 503, "storage_unavailable")  # the key cannot be checked: retry later
            done = await asyncio.gather(*streams)
            assert one.gateway.writer.refusing  # the checkpoints and settles wait for the database
        finally:
            pg_server.start()
        assert all(sse_events(r.text)[-1] == "[DONE]" for r in done)
        assert await one.gateway.writer.flush(timeout=20)

    rows = await fetch(pg_url, "SELECT status, completion_tokens FROM requests")
    assert [tuple(r) for r in rows] == [("finished", 60)] * 3
    (usage,) = await fetch(pg_url, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert tuple(usage) == (3 * (PROMPT_TOKENS + 60), 0)
