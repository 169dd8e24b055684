"""The engine process SIGKILLed under load on a real server: every request in flight ends with a clear 503 (an
in-band SSE error where the stream had begun), rows are finalized failed with their tokens charged, /ready
fails, and the engine comes back by itself to serve new requests."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from tests.robustness.conftest import (
    MODEL,
    Reply,
    async_client,
    charged,
    engine_process,
    fault,
    quota_of,
    rows_of,
    settled_rows,
    stream,
    until,
    wait_idle,
)
from tests.web.server import Server

pytestmark = pytest.mark.slow
STREAMS, PLAIN = 24, 8


def is_openai_error(response: httpx.Response, status: int, code: str) -> bool:
    body = response.json()
    return (
        response.status_code == status
        and set(body["error"]) == {"message", "type", "param", "code"}
        and (body["error"]["code"] == code)
    )


async def test_engine_sigkill_under_load_fails_cleanly_then_recovers(server: Server) -> None:
    key = server.new_key("engine-kill")
    body = {"model": MODEL, "max_tokens": 1_500, "ignore_eos": True}
    old_engine = engine_process(server)
    with fault("engine process SIGKILL under load") as figures:
        async with async_client(server) as http:
            headers = {"Authorization": f"Bearer {key}"}
            streams = [
                asyncio.create_task(stream(http, "/v1/completions", key, {**body, "prompt": [9, i]}))
                for i in range(STREAMS)
            ]
            plain = [
                asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": [5, i]}, headers=headers))
                for i in range(PLAIN)
            ]
            total = STREAMS + PLAIN
            await until(lambda: [r["status"] for r in rows_of(server, key)] == ["running"] * total, "all running")
            old_engine.send_signal(signal.SIGKILL)
            figures["requests in flight at engine kill"] = total
            streamed: list[Reply] = await asyncio.gather(*streams)
            answered: list[httpx.Response] = await asyncio.gather(*plain)
            not_ready = await http.get("/ready")
            refused = await http.post("/v1/completions", json={**body, "prompt": [1]}, headers=headers)

        assert all(r.status == 200 and not r.done for r in streamed)  # never a [DONE] after a failure
        assert all((r.in_band_error or {}).get("code") == "engine_unavailable" for r in streamed), streamed[0]
        assert all(is_openai_error(r, 503, "engine_unavailable") for r in answered), answered[0].text
        assert is_openai_error(not_ready, 503, "engine_unavailable")  # down, or restarting after the crash
        assert is_openai_error(refused, 503, "engine_unavailable")

        rows = await settled_rows(server, key, total + 1)
        statuses = [r["status"] for r in rows]
        assert statuses == ["failed"] * total + ["rejected"], statuses
        assert all(r["error"] for r in rows)
        usage = quota_of(server, key)
        assert (usage["used_tokens"], usage["reserved_tokens"]) == (charged(rows), 0)

        server.wait_ready(timeout=120)  # nobody restarted it but the server itself
        assert engine_process(server).pid != old_engine.pid
        async with async_client(server) as http:
            after = await asyncio.gather(*(
                stream(http, "/v1/completions", key, {**body, "prompt": [4, i], "max_tokens": 8,
                                                      "stream_options": {"include_usage": True}})
                for i in range(8)
            ))  # fmt: skip
        assert all(r.done and r.usage and r.usage["completion_tokens"] == 8 for r in after)
        await wait_idle(server)
        figures["requests served after the engine came back"] = len(after)
