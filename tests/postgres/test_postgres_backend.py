"""The history's backend column on PostgreSQL (issue 11): migration 0006 both ways keeping rows, a backend's name
longer than the column cut to fit rather than the whole row refused, and the backend filter and its choices."""

from __future__ import annotations

from tests.postgres.conftest import fetch, gateways
from tests.web.conftest import ADMIN
from tests.web.test_history_backend import REMOTE, backend_column_round_trip, served
from web.db import create_db_engine
from web.history.record import BACKEND_MAX


async def test_migration_0006_goes_up_and_down_keeping_the_rows(pg_url: str) -> None:
    engine = create_db_engine(pg_url)
    try:
        await backend_column_round_trip(engine)
    finally:
        await engine.dispose()


async def test_rows_name_their_backend_and_the_filter_and_its_choices_read_them(pg_url: str) -> None:
    long = "h" * 150 + ":8000"  # a host name may run to 253 characters; VARCHAR(100) refuses more
    async with gateways(pg_url, 1) as (one,):
        remote = await served(one.gateway, REMOTE)
        await served(one.gateway, long)
        await served(one.gateway, None)
        only = (await one.http.get("/admin/api/requests", params={"backend": REMOTE}, headers=ADMIN)).json()
        assert [r["id"] for r in only["data"]] == [remote]
        assert await one.gateway.history.backends() == [REMOTE, long[:BACKEND_MAX]]
    assert len(await fetch(pg_url, "SELECT id FROM requests")) == 3
