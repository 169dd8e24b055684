"""The server process itself under load: SIGKILL, then a restart on the same data dir (nothing left queued or
running, no reservation held, the database intact); and SIGTERM (in-flight requests finish within the drain
timeout, new ones get 503, exit 0). Each test starts its own server, since each ends it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.robustness.conftest import (
    MODEL,
    Reply,
    async_client,
    engine_process,
    fault,
    query,
    quota_of,
    rows_of,
    settled_rows,
    stream,
    until,
)
from tests.web.server import Server, start_server

pytestmark = pytest.mark.slow
SEATS = 16  # max_num_seqs: beyond it requests wait queued, so the crash hits both queued and running rows
DRAIN_TIMEOUT = 30.0
# Each drained request's length: long enough that all 32 are seen running at once before SIGTERM. At 150 tokens
# random:tiny ran all 32 from admission to their end in 1.2 s, and once in CI the history showed them finished before
# the test had seen them all running (the rows come through the batch writer).
DRAINED_TOKENS = 600


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Servers a test starts; whatever it leaves running is stopped."""
    started: list[Server] = []
    yield started
    for srv in started:
        srv.stop()


def exited(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # gone, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def statuses(srv: Server) -> list[str]:
    return [r["status"] for r in query(srv, "SELECT status FROM requests ORDER BY arrival_at")]


async def test_server_sigkill_under_load_then_restart(tmp_path: Path, servers: list[Server]) -> None:
    data = tmp_path / "crash"
    first = start_server(data, max_num_seqs=str(SEATS))
    servers.append(first)
    first.wait_ready()
    keys = [first.new_key("crash-quota", quota_tokens=10_000_000, quota_period="day"), first.new_key("crash-free")]
    body = {"model": MODEL, "max_tokens": 1_500, "ignore_eos": True}
    engine = engine_process(first)
    with fault("server process SIGKILL under load, then restart") as figures:
        async with async_client(first) as http:

            def call(i: int) -> Any:  # one in four not streamed; the keys take turns
                key, numbered = keys[i % 2], {**body, "prompt": [3, i]}
                if i % 4 == 0:
                    return http.post("/v1/completions", json=numbered, headers={"Authorization": f"Bearer {key}"})
                return stream(http, "/v1/completions", key, numbered)

            pending = asyncio.gather(*(call(i) for i in range(40)), return_exceptions=True)
            # Every seat taken and every request in: under the fair policy a request whose seat was taken back for
            # the other key (its row already running) waits again, so more than SEATS rows may read running.
            await until(lambda: statuses(first).count("running") >= SEATS and len(statuses(first)) == 40, "load")
            held = sum(quota_of(first, key)["reserved_tokens"] for key in keys)
            first.process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(pending, 30)  # every client learns the server is gone; none hangs
        figures["requests in flight at server kill"] = 40
        at_kill = statuses(first)
        running = at_kill.count("running")
        assert held > 0 and running >= SEATS and at_kill.count("queued") == 40 - running
        await until(lambda: exited(engine), "the orphaned engine process to exit", 15)

        second = start_server(data, max_num_seqs=str(SEATS))
        servers.append(second)
        second.wait_ready()
        assert statuses(second) == ["interrupted"] * 40
        assert [r["reserved_tokens"] for r in query(second, "SELECT reserved_tokens FROM key_usage")] == [0, 0]
        assert query(second, "PRAGMA integrity_check")[0][0] == "ok"
        assert query(second, "PRAGMA foreign_key_check") == []
        async with async_client(second) as http:
            again = await stream(http, "/v1/completions", keys[0], {**body, "prompt": [2], "max_tokens": 4})
        assert again.done and statuses(second)[-1] == "finished"
        assert second.stop() == 0


async def test_sigterm_under_load_drains_then_exits_0(tmp_path: Path, servers: list[Server]) -> None:
    srv = start_server(tmp_path / "drain", drain_timeout=str(DRAIN_TIMEOUT))
    servers.append(srv)
    srv.wait_ready()
    key = srv.new_key("drain")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "max_tokens": DRAINED_TOKENS, "ignore_eos": True}
    usage = {"stream_options": {"include_usage": True}}
    with fault("SIGTERM under load") as figures:
        async with async_client(srv) as http:
            streams = [
                asyncio.create_task(stream(http, "/v1/completions", key, {**body, **usage, "prompt": [6, i]}))
                for i in range(24)
            ]
            plain = [
                asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": [8, i]}, headers=headers))
                for i in range(8)
            ]
            await until(lambda: [r["status"] for r in rows_of(srv, key)] == ["running"] * 32, "32 running")
            signalled = time.monotonic()
            srv.process.send_signal(signal.SIGTERM)
            await until(lambda: httpx.get(srv.url + "/ready").status_code == 503, "/ready to fail", 5)
            late = await http.post("/v1/completions", json={**body, "prompt": [1]}, headers=headers)
            late_stream = await stream(http, "/v1/completions", key, {**body, "prompt": [1]})
            streamed: list[Reply] = await asyncio.gather(*streams)
            answered: list[httpx.Response] = await asyncio.gather(*plain)
        code = await asyncio.to_thread(srv.process.wait, DRAIN_TIMEOUT + 30)
        took = time.monotonic() - signalled
        figures["requests drained on SIGTERM"] = sum(r.done for r in streamed) + sum(
            r.status_code == 200 for r in answered
        )

        assert code == 0 and took < DRAIN_TIMEOUT
        assert all(r.done and r.usage and r.usage["completion_tokens"] == DRAINED_TOKENS for r in streamed)
        assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == DRAINED_TOKENS for r in answered)
        assert late.status_code == 503 and "draining" in late.json()["error"]["message"]
        assert late_stream.status == 503 and late_stream.error and "draining" in late_stream.error["message"]
        rows = await settled_rows(srv, key, 34)
        assert [r["status"] for r in rows] == ["finished"] * 32 + ["rejected"] * 2
        final = quota_of(srv, key)
        assert final["reserved_tokens"] == 0
        assert final["used_tokens"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
