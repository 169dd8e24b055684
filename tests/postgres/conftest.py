"""A real PostgreSQL for the run (skipped, saying why, where none is installed; the Makefile installs Debian's),
a fresh database per test, and gateways on it (the web room's app with the fake engine, run in the test's loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.postgres.server import Server, binaries, running_server
from tests.web.conftest import InLoop, lifespan, wait_ready, web_config
from tests.web.fakes import FakeEngineClient
from web.app import app_of, build_gateway
from web.config import WebConfig


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    if binaries() is None:
        pytest.skip("no PostgreSQL here (initdb not found): apt-get install postgresql")
    with running_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Server) -> str:
    return pg_server.new_database()


@asynccontextmanager
async def gateways(url: str, count: int, **config: Any) -> AsyncIterator[list[InLoop]]:
    """`count` gateways on one database, started together (as a fleet's gateways are), each with its own fake
    engine and HTTP client."""
    async with AsyncExitStack() as stack:
        apps = []
        for i in range(count):
            fake = FakeEngineClient()
            gateway = build_gateway(gateway_config(url, i, **config), fake)
            apps.append((app_of(gateway), gateway, fake))
        # Started at once: each migrates the fresh database at start-up, one after another (an advisory lock).
        await asyncio.gather(*(stack.enter_async_context(lifespan(app)) for app, _, _ in apps))
        found = []
        for app, gateway, fake in apps:
            transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
            http = await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://appliance", timeout=30)
            )
            await wait_ready(http)
            found.append(InLoop(app, http, gateway, fake))
        yield found


def gateway_config(url: str, index: int, **config: Any) -> WebConfig:
    """The index-th gateway's config on `url` (web_config's path names a SQLite file: the database_url wins)."""
    return web_config(Path(), database_url=url, gateway_id=f"gateway-{index}", **config)


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """What the app wrote, read on a connection of the test's own."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()
