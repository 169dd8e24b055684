"""Every history row names the backend that served it (issue 11): the console's table, its backend filter, the CSV
export and /admin/api/requests all show it; migration 0006 adds the column and takes it away again, keeping rows."""

from __future__ import annotations

import csv
import io
import re
import time
from datetime import datetime
from itertools import count
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tests.web.conftest import ADMIN, MODEL, InLoop, assert_openai_error, bearer, new_key, sign_in
from web.app import Gateway
from web.db import create_db_engine, downgrade_schema, sqlite_url, upgrade_schema
from web.history.record import BACKEND_MAX, INSERT_REQUEST, RequestLog
from web.models import utcnow

REMOTE = "10.0.0.5:8000"
_ids = count()


async def served(gateway: Gateway, backend: str | None, *, first: bool = True, finish: bool = True) -> str:
    """A request's row as the ledger writes it once the router picked `backend` for it: queued at admission,
    running at its first token (`first`), finished (or failed, without a first token) at its end. Returns its id."""
    now = time.monotonic()
    log = RequestLog(f"req-{next(_ids)}", None, MODEL, "chat.completions", True, utcnow(), now)
    row = log.queued_values()

    async def admit(conn: AsyncConnection) -> None:
        await conn.execute(INSERT_REQUEST, row)

    assert await gateway.writer.submit(admit)
    log.backend = backend  # admitted first, then routed
    if first:
        log.scheduled_mono = log.first_token_mono = now + 0.01
        gateway.ledger.mark_running(log)
        log.status, log.finish_reason, log.completion_tokens = "finished", "stop", 3
    else:
        log.status, log.error = "failed", "the backend went away"
    if finish:
        log.finished_mono = now + 0.02
        await gateway.ledger.settle(log)
    assert await gateway.writer.flush(5)
    return log.id


def _table_backends(html: str) -> list[str]:
    return re.findall(r'<td class="backend">([^<]*)</td>', html)


def _select_backends(html: str) -> list[str]:
    select = re.search(r'<select name="backend">(.*?)</select>', html, re.S)
    assert select, html
    return re.findall(r'<option value="([^"]*)"', select.group(1))


async def test_a_rows_backend_shows_in_the_console_the_csv_and_the_api_and_each_filter_narrows(
    in_loop: InLoop,
) -> None:
    gateway = in_loop.gateway
    remote = await served(gateway, REMOTE)
    embedded = await served(gateway, "embedded")
    await served(gateway, None)  # a row from before 0006: it names no backend
    http = in_loop.http

    listed = (await http.get("/admin/api/requests", headers=ADMIN)).json()
    assert {r["id"]: r["backend"] for r in listed["data"]}.get(remote) == REMOTE
    only = (await http.get("/admin/api/requests", params={"backend": REMOTE}, headers=ADMIN)).json()
    assert (only["total"], [r["id"] for r in only["data"]]) == (1, [remote])
    detail = (await http.get(f"/admin/api/requests/{embedded}", headers=ADMIN)).json()
    assert detail["backend"] == "embedded"

    await sign_in(http)
    page = (await http.get("/admin/history")).text
    assert sorted(_table_backends(page)) == ["10.0.0.5:8000", "embedded", "–"]
    assert _select_backends(page) == ["", REMOTE, "embedded"]  # any backend, then the backends seen
    narrowed = await http.get("/admin/history", params={"backend": "embedded"})
    assert _table_backends(narrowed.text) == ["embedded"]
    assert '<option value="embedded" selected>' in narrowed.text
    assert f'<dd class="backend">{REMOTE}</dd>' in (await http.get(f"/admin/history/{remote}")).text

    exported = list(csv.DictReader(io.StringIO((await http.get("/admin/history.csv")).text)))
    assert {r["id"]: r["backend"] for r in exported} == {remote: REMOTE, embedded: "embedded", **_no_backend(exported)}
    filtered = list(csv.DictReader(io.StringIO((await http.get(f"/admin/history.csv?backend={REMOTE}")).text)))
    assert [r["id"] for r in filtered] == [remote]


def _no_backend(rows: list[dict[str, str]]) -> dict[str, str]:
    return {r["id"]: "" for r in rows if not r["backend"]}


async def test_a_request_through_the_api_names_the_engine_that_served_it(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (await in_loop.http.post("/v1/chat/completions", json=chat, headers=bearer(key))).status_code == 200
    assert await in_loop.gateway.writer.flush(5)
    (row,) = (await in_loop.http.get("/admin/api/requests", headers=ADMIN)).json()["data"]
    assert (row["status"], row["backend"]) == ("finished", "embedded")


async def test_a_running_or_failed_request_names_its_backend_and_a_long_name_is_cut_to_the_column(
    in_loop: InLoop,
) -> None:
    running = await served(in_loop.gateway, REMOTE, finish=False)
    found = (await in_loop.http.get(f"/admin/api/requests/{running}", headers=ADMIN)).json()
    assert (found["status"], found["backend"]) == ("running", REMOTE)
    failed = await served(in_loop.gateway, REMOTE, first=False)  # it failed there before any output
    found = (await in_loop.http.get(f"/admin/api/requests/{failed}", headers=ADMIN)).json()
    assert (found["status"], found["backend"]) == ("failed", REMOTE)
    long = "h" * 150 + ":8000"
    cut = await served(in_loop.gateway, long)
    found = (await in_loop.http.get(f"/admin/api/requests/{cut}", headers=ADMIN)).json()
    assert found["backend"] == long[:BACKEND_MAX]


async def test_a_backend_filter_that_names_no_backend_is_refused_plainly(in_loop: InLoop) -> None:
    http = in_loop.http
    for bad in ("a\x00b", "x" * (BACKEND_MAX + 1), ""):
        response = await http.get("/admin/api/requests", params={"backend": bad}, headers=ADMIN)
        assert_openai_error(response, 400, param="backend")
    await sign_in(http)
    page = await http.get("/admin/history", params={"backend": "a\x00b"})
    assert page.status_code == 200 and "unknown backend" in page.text
    assert (await http.get("/admin/history.csv", params={"backend": "a\x00b"})).status_code == 400


# -- migration 0006, both ways (tests/postgres runs the same on PostgreSQL) ---------------------------------------

_requests = sa.table(
    "requests",
    *(sa.column(name) for name in ("id", "model", "endpoint", "stream", "status", "prompt_tokens")),
    *(sa.column(name) for name in ("completion_tokens", "cached_tokens", "reserved_tokens")),
    sa.column("arrival_at", sa.DateTime()),
)


async def _columns(engine: AsyncEngine) -> tuple[set[str], set[str | None]]:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda c: (
                {col["name"] for col in sa.inspect(c).get_columns("requests")},
                {ix["name"] for ix in sa.inspect(c).get_indexes("requests")},
            )
        )


async def backend_column_round_trip(engine: AsyncEngine) -> None:
    """0005 -> 0006 keeps the rows (with no backend), 0006 -> 0005 drops the column and its index, rows kept."""
    await upgrade_schema(engine, "0005")
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(_requests).values(
                id="old", model="m", endpoint="chat.completions", stream=False, status="finished",
                prompt_tokens=1, completion_tokens=1, cached_tokens=0, reserved_tokens=0,
                arrival_at=datetime(2026, 11, 30, 12, 0),
            )
        )  # fmt: skip
    await upgrade_schema(engine)
    columns, indexes = await _columns(engine)
    assert "backend" in columns and "ix_requests_backend_arrival_at" in indexes
    async with engine.begin() as conn:
        assert (await conn.execute(sa.text("SELECT backend FROM requests WHERE id = 'old'"))).scalar_one() is None
        await conn.execute(sa.text("UPDATE requests SET backend = 'embedded'"))
    await downgrade_schema(engine, "0005")
    columns, indexes = await _columns(engine)
    assert "backend" not in columns and "ix_requests_backend_arrival_at" not in indexes
    async with engine.connect() as conn:
        assert (await conn.execute(sa.text("SELECT id FROM requests"))).scalars().all() == ["old"]
    await upgrade_schema(engine)
    assert "backend" in (await _columns(engine))[0]


async def test_migration_0006_adds_the_column_and_takes_it_away_keeping_the_rows(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "m.db"))
    try:
        await backend_column_round_trip(engine)
    finally:
        await engine.dispose()
