"""What the robustness suites share: streaming clients that keep what the server told them, and the server's state
read where it lives: the SQLite file, the admin stats, the engine process. The suites that leave their server
running use the run's shared one (tests/conftest.py `server`); the ones that kill or stop a server start their own."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.figures import record
from tests.waiting import until
from tests.web.conftest import ADMIN
from tests.web.server import Server
from web.history.record import TERMINAL

MODEL = "random:tiny"
FAULTS = "faults"  # the figures file of the fault suites


@contextmanager
def fault(case: str) -> Iterator[dict[str, int | float]]:
    """Count one fault injected for the faults suite's figures, and survived if the block ends without an error;
    the block may add figures of its own to the dict it gets."""
    figures: dict[str, int | float] = {}
    record(FAULTS, case, {"faults injected": 1, "faults survived": 0})
    survived = 0
    try:
        yield figures
        survived = 1
    finally:
        record(FAULTS, case, {**figures, "faults survived": survived})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Count the checks that fail on a known bug (strict xfail, BUGS.md) among the faults suite's figures; every
    test writes its 0 or 1, so a check whose mark came off stops counting."""
    report: pytest.TestReport = yield
    if report.when == "call":
        failing = int(report.skipped and hasattr(report, "wasxfail"))
        record(FAULTS, item.name, {"checks failing on known bugs (xfail, BUGS.md)": failing})
    return report


def db_path(server: Server) -> Path:
    return server.data_dir / "appliance.db"


def query(server: Server, sql: str, *args: Any) -> list[sqlite3.Row]:
    """Rows read straight from the server's SQLite file, on a connection of our own."""
    with closing(sqlite3.connect(db_path(server), timeout=30)) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, args))


def key_id(server: Server, key: str) -> int:
    (row,) = query(server, "SELECT id FROM api_keys WHERE prefix = ?", key[:10])
    return int(row["id"])


def admin_stats(server: Server) -> dict[str, Any]:
    response = httpx.get(server.url + "/admin/api/stats", headers=ADMIN, timeout=10)
    response.raise_for_status()
    return dict(response.json())


def idle_stats(server: Server) -> dict[str, Any] | None:
    """The admin stats if nothing is in flight and the engine runs nothing and holds no KV block, else None."""
    stats = admin_stats(server)
    engine = stats["engine"]
    busy = engine is None or stats["in_flight"] or engine["running"] or engine["waiting"] or engine["kv_blocks_used"]
    return None if busy else stats


async def wait_idle(server: Server, timeout: float = 20.0) -> dict[str, Any]:
    return dict(await until(lambda: idle_stats(server), "the engine to be idle (no request, no KV block)", timeout))


def rows_of(server: Server, key: str) -> list[sqlite3.Row]:
    return query(server, "SELECT * FROM requests WHERE key_id = ? ORDER BY arrival_at", key_id(server, key))


async def settled_rows(server: Server, key: str, expected: int, timeout: float = 20.0) -> list[sqlite3.Row]:
    """The key's history rows once `expected` of them are all terminal (the history writer batches, so they may
    lag), or whatever is there after `timeout`: the caller's assertions say what is wrong."""
    deadline = time.monotonic() + timeout
    while True:
        rows = rows_of(server, key)
        if (len(rows) >= expected and all(r["status"] in TERMINAL for r in rows)) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


def quota_of(server: Server, key: str) -> sqlite3.Row:
    (row,) = query(server, "SELECT * FROM key_usage WHERE key_id = ?", key_id(server, key))
    return row


def charged(rows: list[sqlite3.Row]) -> int:
    """What the quota should hold for these rows: generated tokens, plus the prompt once output began."""
    return sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows if r["completion_tokens"])


def engine_process(server: Server) -> psutil.Process:
    """The engine core: the server's worker process that runs engine.process (engine.worker)."""
    children = psutil.Process(server.process.pid).children()
    return next(p for p in children if "engine.process:run_engine_process" in p.cmdline())


@dataclass
class Reply:
    """What one client got: the HTTP status (0: none came), the SSE events or the error body, and a transport
    error if the connection failed (before the status, or mid-stream after some events)."""

    status: int
    events: list[Any] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False
    broken: str | None = None

    @property
    def request_id(self) -> str | None:
        return next((e["id"] for e in self.events if isinstance(e, dict) and "id" in e), None)

    @property
    def usage(self) -> dict[str, int] | None:
        return next((e["usage"] for e in reversed(self.events) if isinstance(e, dict) and e.get("usage")), None)

    @property
    def in_band_error(self) -> dict[str, Any] | None:
        return next((e["error"] for e in self.events if isinstance(e, dict) and "error" in e), None)


def error_of(body: bytes) -> dict[str, Any] | None:
    """The `error` object of an OpenAI-shaped error body, or None for any other body."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    shaped = isinstance(error, dict) and set(error) == {"message", "type", "param", "code"} and error["message"]
    return error if shaped else None


async def stream(http: httpx.AsyncClient, path: str, key: str, body: dict[str, Any]) -> Reply:
    """POST a streamed request and read it to the end, or to the connection's end."""
    headers = {"Authorization": f"Bearer {key}"}
    reply = Reply(0)
    try:
        async with http.stream("POST", path, json={**body, "stream": True}, headers=headers) as response:
            reply.status = response.status_code
            if response.status_code != 200:
                reply.error = error_of(await response.aread())
                return reply
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        reply.done = True
                    else:
                        reply.events.append(json.loads(data))
    except httpx.TransportError as exc:  # what came before is kept
        reply.broken = repr(exc)
    return reply


class RawCall:
    """One request on its own TCP connection, so a test decides exactly when the client goes away and knows
    how many bytes it had received by then."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.received = bytearray()
        self.first_event = asyncio.Event()  # the first SSE `data:` event (a ": waiting" notice of the queue is none)
        self._reading = asyncio.create_task(self._read(reader))

    @classmethod
    async def open(cls, server: Server, path: str, key: str, body: dict[str, Any], body_part: float = 1.0) -> RawCall:
        """`body_part`: the share of the body sent (the rest never comes)."""
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        raw = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
        )
        writer.write(head.encode() + raw[: int(len(raw) * body_part)])
        await writer.drain()
        return cls(reader, writer)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(65536):
            self.received += chunk
            if b"data: " in self.received:
                self.first_event.set()

    @property
    def events(self) -> int:
        return self.received.count(b"data: ")

    async def cut(self) -> int:
        """Close the connection; returns the bytes received before."""
        received = len(self.received)
        self._reading.cancel()
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()
        return received


def async_client(server: Server, connections: int = 100, timeout: float = 120.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=server.url, limits=limits, timeout=timeout)


async def gather_limited(concurrency: int, jobs: list[Any]) -> list[Any]:
    """Run coroutines with at most `concurrency` at a time; results in order, exceptions returned as values."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs), return_exceptions=True)
