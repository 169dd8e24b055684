"""Fixtures for the web room: a temporary SQLite file, the fake engine client, the app under Litestar's
async test client, and helpers to make keys through the admin API."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.postgres.server import database_url_for
from tests.web.fakes import FakeEngineClient
from web.app import Gateway, app_of, build_gateway, create_app
from web.config import WebConfig

ADMIN_PASSWORD = "admin-password-for-tests"
METRICS_TOKEN = "metrics-token-for-tests"
ADMIN = {"Authorization": "Basic " + base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()}
MODEL = "fake-model"
_LOGIN_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def web_config(db_path: Path, **overrides: Any) -> WebConfig:
    values: dict[str, Any] = {
        "database_url": database_url_for(db_path),
        "admin_password": ADMIN_PASSWORD,
        "metrics_token": METRICS_TOKEN,
        "drain_timeout": 2.0,
        "default_max_tokens": 64,
    }
    values.update(overrides)
    return WebConfig(**values)


@pytest.fixture
def fake() -> FakeEngineClient:
    return FakeEngineClient()


@pytest.fixture
def gateway(fake: FakeEngineClient, db_path: Path) -> Gateway:
    return build_gateway(web_config(db_path), fake)


@pytest.fixture
def app(gateway: Gateway) -> Litestar:
    return app_of(gateway)


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=app) as test_client:
        await wait_ready(test_client)
        yield test_client


@asynccontextmanager
async def client_for(
    fake: FakeEngineClient, db_path: Path, *, ready: bool = True, **config: Any
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """A test client on an app with non-default settings."""
    async with AsyncTestClient(app=create_app(web_config(db_path, **config), fake)) as test_client:
        if ready:
            await wait_ready(test_client)
        yield test_client


@dataclass
class InLoop:
    """The app run inside the test's own event loop: requests are truly concurrent (Litestar's test client
    runs one request at a time) and the services can be called directly."""

    app: Litestar
    http: httpx.AsyncClient
    gateway: Gateway
    fake: FakeEngineClient


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    """The app's start-up and shutdown, kept in one task (pytest-asyncio tears fixtures down in another)."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    task = asyncio.create_task(run())
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    try:
        yield
    finally:
        stop.set()
        await task


@pytest.fixture
async def in_loop(app: Litestar, gateway: Gateway, fake: FakeEngineClient) -> AsyncIterator[InLoop]:
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance", timeout=30) as http:
            await wait_ready(http)
            yield InLoop(app, http, gateway, fake)


async def wait_ready(client: Any, attempts: int = 200) -> None:
    for _ in range(attempts):
        if (await client.get("/ready")).status_code == 200:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the app never became ready")


async def new_key(client: Any, name: str = "test", **limits: Any) -> str:
    response = await client.post("/admin/api/keys", json={"name": name, **limits}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return str(response.json()["key"])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def sse_events(text: str) -> list[Any]:
    """The data of each Server-Sent Event, JSON-decoded except the final [DONE]."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.fixture
def db(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection for checking what the app wrote (independent of the app's event loop)."""
    conn = sqlite3.connect(db_path, timeout=10)
    conn.row_factory = sqlite3.Row
    yield conn
    conn.close()


def rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[sqlite3.Row]:
    return list(conn.execute(sql, args))


def assert_openai_error(response: Any, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


async def sign_in(http: Any) -> None:
    """Into the console through its login form, as a browser does; the client keeps the session cookie."""
    page = await http.get("/admin/login")
    token = _LOGIN_TOKEN.search(page.text)
    assert token, page.text
    form = {"username": "admin", "password": ADMIN_PASSWORD, "csrf_token": token.group(1), "next": "/admin"}
    signed_in = await http.post("/admin/login", data=form, follow_redirects=False)
    assert signed_in.status_code == 303, signed_in.text
