"""The appliance on PostgreSQL (issue 11): migrations both ways, the request path with its quota and history,
the console's queries, two gateways sharing one database without overspending a quota, and the URL's password
kept out of logs and command output."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect

from tests.postgres.conftest import fetch, gateway_config, gateways
from tests.postgres.server import PASSWORD
from tests.waiting import until
from tests.web.conftest import ADMIN, bearer, new_key, sign_in, sse_events
from tests.web.fakes import FakeEngineClient
from web.app import build_gateway
from web.console.samples import WINDOWS, buckets
from web.db import create_db_engine, downgrade_schema, upgrade_schema
from web.models import Base, EngineSample, utcnow

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
PROMPT_TOKENS = 19  # the fake tokenizer's chat template around "hi"


def _schema(connection: Connection) -> tuple[set[str], list[object]]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return set(inspect(connection).get_table_names()), list(compare_metadata(context, Base.metadata))


async def test_migrations_go_up_and_down_and_match_the_models(pg_url: str) -> None:
    engine = create_db_engine(pg_url)
    try:
        await upgrade_schema(engine)
        await downgrade_schema(engine, "base")
        async with engine.connect() as conn:
            tables, _ = await conn.run_sync(_schema)
        assert tables == {"alembic_version"}
        await upgrade_schema(engine)
        async with engine.connect() as conn:
            tables, diff = await conn.run_sync(_schema)
        assert set(Base.metadata.tables) < tables
        assert diff == []
    finally:
        await engine.dispose()


async def test_a_request_streams_is_charged_and_recorded(pg_url: str) -> None:
    async with gateways(pg_url, 1) as (one,):
        key = await new_key(one.http, quota_tokens=3 * 10**9, quota_period="day")  # beyond a 32-bit integer
        streamed = await one.http.post(
            "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 8}, headers=bearer(key)
        )
        assert streamed.status_code == 200
        events = sse_events(streamed.text)
        assert events[-1] == "[DONE]"
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        assert text
        plain = await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert plain.status_code == 200
        await one.gateway.writer.flush()

    rows = await fetch(pg_url, "SELECT status, stream, prompt_tokens, completion_tokens FROM requests ORDER BY 1")
    assert [tuple(r) for r in rows] == [("finished", True, PROMPT_TOKENS, 5), ("finished", False, PROMPT_TOKENS, 5)]
    (usage,) = await fetch(pg_url, "SELECT used_tokens, reserved_tokens, total_requests FROM key_usage")
    assert tuple(usage) == (2 * (PROMPT_TOKENS + 5), 0, 2)


async def test_an_exhausted_quota_is_refused_and_recorded(pg_url: str) -> None:
    async with gateways(pg_url, 1) as (one,):
        key = await new_key(one.http, quota_tokens=PROMPT_TOKENS + 3, quota_period="none")
        first = await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert first.json()["usage"]["completion_tokens"] == 3  # ran with the 3 tokens the quota had left
        refused = await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert refused.status_code == 429, refused.text
        await one.gateway.writer.flush()
    rows = await fetch(pg_url, "SELECT status, finish_reason FROM requests ORDER BY arrival_at")
    assert [tuple(r) for r in rows] == [("finished", "length"), ("rejected", None)]


async def test_the_console_and_the_jobs_run_their_queries(pg_url: str) -> None:
    async with gateways(pg_url, 1) as (one,):
        key = await new_key(one.http, quota_tokens=1000, quota_period="day")
        assert (await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 200
        await one.gateway.writer.flush()
        # The gateway's own retention and rollover runs (1 s after start, then hourly/each minute) would race the
        # calls below on a slow machine (CI once saw its prune find the old sample gone): the test runs them itself.
        await one.gateway.jobs.stop()
        now = utcnow()
        async with one.gateway.sessions.begin() as session:
            for seconds, free in ((30, 5 << 30), (20, 4 << 30), (8 * 86400, 1)):  # 24 GiB of RAM; one long gone
                session.add(_sample(now - timedelta(seconds=seconds), free))
        found, kind = await buckets(one.gateway.sessions, WINDOWS["1h"], now)
        assert kind == "RAM"
        assert len(found) in (1, 2) and min(b.memory_free_bytes for b in found) == 4 << 30
        assert all(b.memory_total_bytes == 24 << 30 for b in found)

        await sign_in(one.http)
        for page in ("/admin", "/admin/history", "/admin/keys", "/admin/history.csv"):
            response = await one.http.get(page)
            assert response.status_code == 200, (page, response.text[:500])
        listed = await one.http.get("/admin/api/requests", params={"status": "finished"}, headers=ADMIN)
        assert [r["status"] for r in listed.json()["data"]] == ["finished"], listed.text

        await fetch(pg_url, "UPDATE key_usage SET period_start = period_start - interval '2 days'")
        assert await one.gateway.keys.roll_over_all() == 1
        await fetch(pg_url, "UPDATE requests SET arrival_at = arrival_at - interval '400 days'")
        assert await one.gateway.history.prune(30, 7) == (1, 1)
    (usage,) = await fetch(pg_url, "SELECT used_tokens FROM key_usage")
    assert usage["used_tokens"] == 0


def _sample(at: Any, free: int) -> EngineSample:
    return EngineSample(
        at=at, running=1, waiting=0, kv_usage=0.5, kv_blocks_used=8, kv_blocks_total=64, memory_kind="RAM",
        memory_total_bytes=24 << 30, memory_free_bytes=free, weights_bytes=270 << 20, kv_pool_bytes=1 << 30,
        queue_wait_p95_s=None, tokens_per_s=12.0, preemptions=0,
    )  # fmt: skip


async def test_a_restart_interrupts_what_was_in_flight(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateways(pg_url, 1) as (one,):
        one.fake.token_delay = 0.05
        key = await new_key(one.http, quota_tokens=1000, quota_period="none")
        body = {**CHAT, "max_tokens": 400, "ignore_eos": True}
        running = asyncio.create_task(one.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
        await until(lambda: one.gateway.inflight, "the request admitted (its reservation and row written)")
        # The process dies: no settle ever runs (the writer is left as it is).
        monkeypatch.setattr(one.gateway.ledger, "settle", _never)
        await one.gateway.inflight.drain(timeout=0.1)
        running.cancel()
    gateway = build_gateway(gateway_config(pg_url, 0), FakeEngineClient())  # the same gateway, started again
    interrupted = await gateway.ledger.recover()
    await gateway.db.dispose()
    assert interrupted == 1
    (row,) = await fetch(pg_url, "SELECT status FROM requests")
    assert row["status"] == "interrupted"
    (usage,) = await fetch(pg_url, "SELECT reserved_tokens FROM key_usage")
    assert usage["reserved_tokens"] == 0


async def _never(*_: Any) -> None:
    return None


async def test_two_gateways_share_keys_and_history_and_never_overspend_a_quota(pg_url: str) -> None:
    async with gateways(pg_url, 2) as (a, b):
        for gateway in (a, b):
            gateway.fake.token_delay = 0.005
        key = await new_key(a.http, quota_tokens=1000, quota_period="none")  # made on a, used on both
        body = {**CHAT, "max_tokens": 20, "ignore_eos": True}  # 19 + 20 = 39 each

        async def one(via: Any) -> int:
            response = await via.http.post("/v1/chat/completions", json=body, headers=bearer(key))
            return response.status_code

        codes = await asyncio.gather(*(one(a if i % 2 else b) for i in range(60)))
        for gateway in (a, b):
            await gateway.gateway.writer.flush()
        seen_on_a = await a.http.get("/admin/api/requests", params={"limit": 100}, headers=ADMIN)
        assert len(seen_on_a.json()["data"]) == 60  # b's rows too

    # 25 run whole (975 tokens), one more with the 25 left (6 after its prompt), the other 34 are refused.
    assert codes.count(200) == 26 and codes.count(429) == 34
    rows = await fetch(pg_url, "SELECT status, prompt_tokens + completion_tokens AS charged FROM requests")
    assert len(rows) == 60 and {r["status"] for r in rows} == {"finished", "rejected"}
    charged = sum(r["charged"] for r in rows if r["status"] == "finished")
    (usage,) = await fetch(pg_url, "SELECT used_tokens, reserved_tokens, total_requests FROM key_usage")
    assert charged == usage["used_tokens"] == 1000
    assert usage["reserved_tokens"] == 0


async def test_the_urls_password_never_reaches_a_log(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateways(pg_url, 1) as (one,):
        key = await new_key(one.http)
        assert (await one.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 200
        await sign_in(one.http)
        for page in ("/admin", "/admin/keys", "/admin/history"):
            assert PASSWORD not in (await one.http.get(page)).text
    bad = pg_url.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(Exception) as refused:
        async with gateways(bad, 1):
            pass
    assert PASSWORD not in str(refused.value) and PASSWORD not in repr(refused.value)
    assert PASSWORD not in caplog.text

    env = {"APPLIANCE_DATABASE_URL": pg_url, "APPLIANCE_LOG_LEVEL": "debug"}
    for command in (["migrate"], ["doctor"]):
        done = _appliance(command, env)
        assert PASSWORD not in done.stdout + done.stderr
        assert "appliance:***@127.0.0.1" in done.stdout, done.stdout
    assert "is at the latest schema" in _appliance(["doctor"], env).stdout
    unreachable = _appliance(["doctor"], {**env, "APPLIANCE_DATABASE_URL": bad.replace(str(pg_port(bad)), "1")})
    assert "cannot read postgresql+asyncpg://appliance:***@127.0.0.1:1/" in unreachable.stdout, unreachable.stdout
    assert PASSWORD not in unreachable.stdout + unreachable.stderr


def pg_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _appliance(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli.main", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_ids_beyond_32_bits_name_no_key(pg_url: str) -> None:
    async with gateways(pg_url, 1) as (one,):
        missing = await one.http.get(f"/admin/api/keys/{2**40}", headers=ADMIN)
        assert missing.status_code == 404, missing.text
        listed = await one.http.get("/admin/api/requests", params={"key_id": 2**40}, headers=ADMIN)
        assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


async def test_a_gateway_restarting_leaves_the_others_requests_alone(pg_url: str) -> None:
    async with gateways(pg_url, 2) as (a, b):
        key = await new_key(a.http, quota_tokens=1000, quota_period="none")
        a.fake.token_delay = 0.05  # 2 s: b recovers and the test reads the reservation while a serves
        body = {**CHAT, "max_tokens": 40, "ignore_eos": True}
        on_a = asyncio.create_task(a.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
        await until(lambda: a.gateway.inflight, "the request admitted on a (its reservation written)")
        assert await b.gateway.ledger.recover() == 0  # b starts again after a crash while a serves
        (usage,) = await fetch(pg_url, "SELECT reserved_tokens FROM key_usage")
        assert usage["reserved_tokens"] == PROMPT_TOKENS + 40  # a's reservation still holds
        assert (await on_a).status_code == 200
        await a.gateway.writer.flush()
    (row,) = await fetch(pg_url, "SELECT status, gateway FROM requests")
    assert tuple(row) == ("finished", "gateway-0")
    (usage,) = await fetch(pg_url, "SELECT used_tokens, reserved_tokens, total_requests FROM key_usage")
    assert tuple(usage) == (PROMPT_TOKENS + 40, 0, 1)
