"""The database unable to take writes for a while, on a real server: locked (another process holds an EXCLUSIVE
transaction past the server's busy timeout) and full (the database lives on a tiny tmpfs that is filled up).
Each scenario runs once; the tests below check one promise each against what it saw."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.figures import record
from tests.robustness.conftest import (
    FAULTS,
    MODEL,
    Reply,
    async_client,
    charged,
    error_of,
    quota_of,
    rows_of,
    settled_rows,
    stream,
    until,
)
from tests.web.conftest import ADMIN
from tests.web.server import Server, start_server
from web.history.record import TERMINAL

pytestmark = pytest.mark.slow
BUSY_TIMEOUT = 10.0  # web/db.py: PRAGMA busy_timeout=10000
CAP = 2  # max_concurrent of the key whose requests are refused
SHORT = {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 4}
LONG = {"model": MODEL, "max_tokens": 300, "ignore_eos": True, "stream_options": {"include_usage": True}}
ERROR_IN_LOG = {"locked": "database is locked", "full": "database or disk is full"}


@dataclass
class StorageFault:
    """What clients and the server showed around one storage fault."""

    kind: str
    server: Server
    capped_key: str  # max_concurrent=CAP; its requests are the ones refused during the fault
    free_key: str
    log_from: int
    in_flight: list[Reply] = field(default_factory=list)  # streams running when the fault began
    refused: list[httpx.Response] = field(default_factory=list)  # the capped key's requests during the fault
    refused_stream: Reply | None = None  # a stream asked for during the fault
    probes: list[httpx.Response] = field(default_factory=list)  # /health and /metrics during the fault
    late: list[httpx.Response] = field(default_factory=list)  # sent while locked, but within the busy timeout
    after_capped: httpx.Response | None = None  # the next requests, once storage works again
    after_free: httpx.Response | None = None

    @classmethod
    def begin(cls, kind: str, srv: Server) -> StorageFault:
        capped, free = srv.new_key(f"{kind}-capped", max_concurrent=CAP), srv.new_key(kind)
        return cls(kind, srv, capped, free, log_from=len(srv.log()))

    def log(self) -> str:
        return self.server.log()[self.log_from :]

    def metrics(self) -> str:
        return httpx.get(self.server.url + "/metrics", headers=ADMIN).text

    def bare_errors(self) -> int:
        """Error answers without an OpenAI-shaped body."""
        answers = [*self.refused, *self.probes, *self.late, self.after_capped, self.after_free]
        bare = sum(1 for r in answers if r is not None and r.status_code >= 400 and error_of(r.content) is None)
        refused = self.refused_stream
        return bare + (refused is not None and refused.status >= 400 and refused.error is None)


async def start_long_streams(http: httpx.AsyncClient, srv: Server, key: str, n: int) -> list[asyncio.Task[Reply]]:
    tasks = [asyncio.create_task(stream(http, "/v1/completions", key, {**LONG, "prompt": [21, i]})) for i in range(n)]
    await until(lambda: [r["status"] for r in rows_of(srv, key)] == ["running"] * n, f"{n} running rows")
    return tasks


async def refused_requests(http: httpx.AsyncClient, key: str) -> list[httpx.Response]:
    headers = {"Authorization": f"Bearer {key}"}
    return list(await asyncio.gather(*(http.post("/v1/completions", json=SHORT, headers=headers) for _ in range(CAP))))


async def after(http: httpx.AsyncClient, found: StorageFault) -> None:
    found.after_capped = await http.post("/v1/completions", json=SHORT, headers=bearer(found.capped_key))
    found.after_free = await http.post("/v1/completions", json=SHORT, headers=bearer(found.free_key))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def locked(srv: Server) -> StorageFault:
    """Hold the write lock past the busy timeout: the capped key's requests, sent at once, outwait it; requests
    sent near its end wait less and must be served."""
    found = StorageFault.begin("locked", srv)
    async with async_client(srv) as http:
        streams = await start_long_streams(http, srv, found.free_key, 3)
        holder = sqlite3.connect(srv.data_dir / "appliance.db", isolation_level=None, timeout=30)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            refused = asyncio.ensure_future(refused_requests(http, found.capped_key))
            await asyncio.sleep(BUSY_TIMEOUT - 1)
            late = asyncio.gather(*(http.post("/v1/completions", json=SHORT, headers=bearer(found.free_key))
                                    for _ in range(2)))  # fmt: skip
            found.probes = [await http.get("/health"), await http.get("/metrics", headers=ADMIN)]
            # Held until the capped key's requests are refused: a loaded box's busy timeout may run late.
            found.refused = await refused
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        found.late = list(await late)
        found.in_flight = list(await asyncio.gather(*streams))
        await after(http, found)
    return found


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("filling a disk needs a small tmpfs, and mounting one needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


def fill(directory: Path) -> Path:
    """Write zeros until the filesystem says no space is left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 4096, 512):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


@contextmanager
def full_disk_server(tmp: Path) -> Iterator[tuple[Server, Path]]:
    """A server whose database lives on a 4 MB tmpfs (its log and the model stay elsewhere)."""
    tiny = tmp / "tiny"
    mount_tmpfs(tiny, "4m")
    try:
        data = tmp / "data"
        data.mkdir()
        (data / "appliance.db").symlink_to(tiny / "appliance.db")  # SQLite follows it; -wal and -shm go there too
        srv = start_server(data)
        try:
            srv.wait_ready()
            assert (tiny / "appliance.db-wal").exists()
            yield srv, tiny
        finally:
            srv.kill()
    finally:
        subprocess.run(["umount", "-l", str(tiny)], check=False)


async def full(srv: Server, tiny: Path) -> StorageFault:
    """Fill the disk while streams run, send requests, free the disk, send more."""
    found = StorageFault.begin("full", srv)
    async with async_client(srv) as http:
        streams = await start_long_streams(http, srv, found.free_key, 3)
        filler = fill(tiny)
        found.refused = await refused_requests(http, found.capped_key)
        found.refused_stream = await stream(http, "/v1/completions", found.free_key, {**LONG, "prompt": [1]})
        found.probes = [await http.get("/health"), await http.get("/metrics", headers=ADMIN)]
        found.in_flight = list(await asyncio.gather(*streams))
        filler.unlink()
        await after(http, found)
    return found


CASES = {"locked": "database locked past the busy timeout", "full": "disk full"}


@pytest.fixture(scope="module")
def storage_fault(
    request: pytest.FixtureRequest, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StorageFault]:
    """Run the scenario `request.param` once for every test of this module that asks for it."""
    kind = request.param
    with ExitStack() as stack:
        if kind == "locked":
            srv, run = server, locked
        else:
            srv, tiny = stack.enter_context(full_disk_server(tmp_path_factory.mktemp("disk-full")))
            run = partial(full, tiny=tiny)
        record(FAULTS, CASES[kind], {"faults injected": 1})  # survived: test_requests_are_answered_...
        yield asyncio.run(run(srv))


BOTH = ["locked", "full"]


@pytest.mark.parametrize("storage_fault", BOTH, indirect=True)
def test_requests_are_answered_or_refused_cleanly(storage_fault: StorageFault) -> None:
    found = storage_fault
    bare = found.bare_errors()
    record(FAULTS, CASES[found.kind], {"5xx without an OpenAI error body (must be 0)": bare, "faults survived": 0})

    assert found.server.process.poll() is None  # nothing crashed
    assert bare == 0
    assert [r.status_code for r in found.probes] == [200, 200]  # /health and /metrics answer meanwhile
    assert all(r.done and r.usage for r in found.in_flight)  # streams running when it began were served in full
    assert found.after_free is not None and found.after_free.status_code == 200  # it serves again once storage does
    assert ERROR_IN_LOG[found.kind] in found.log()  # the cause is logged
    assert [r.status_code for r in found.late] == [200] * len(found.late)  # who waited less than the timeout
    record(FAULTS, CASES[found.kind], {"faults survived": 1})


@pytest.mark.parametrize("storage_fault", BOTH, indirect=True)
def test_refusals_are_503_and_recorded_in_history(storage_fault: StorageFault) -> None:
    found = storage_fault
    assert all(r.status_code == 503 and r.headers.get("retry-after") for r in found.refused), found.refused
    assert [r["status"] for r in rows_of(found.server, found.capped_key)].count("rejected") == CAP


@pytest.mark.parametrize("storage_fault", BOTH, indirect=True)
def test_refusals_give_back_the_concurrency_slot(storage_fault: StorageFault) -> None:
    assert storage_fault.after_capped is not None
    assert storage_fault.after_capped.status_code == 200, storage_fault.after_capped.text


@pytest.mark.parametrize("storage_fault", BOTH, indirect=True)
def test_database_errors_are_counted(storage_fault: StorageFault) -> None:
    counted = [line for line in storage_fault.metrics().splitlines() if line.startswith("appliance_db_errors_total")]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= 1


@pytest.mark.parametrize("storage_fault", BOTH, indirect=True)
def test_requests_in_flight_are_settled(storage_fault: StorageFault) -> None:
    """Rows and quota of the streams that ran through the fault end up like the clients saw them."""
    found = storage_fault
    rows = asyncio.run(settled_rows(found.server, found.free_key, 0, timeout=5))
    ids = {reply.request_id for reply in found.in_flight}
    usage = quota_of(found.server, found.free_key)
    assert [(r["status"], r["completion_tokens"]) for r in rows if r["id"] in ids] == [("finished", 300)] * len(ids)
    assert all(r["status"] in TERMINAL for r in rows)
    assert usage["reserved_tokens"] == 0
    # charged(): the stream refused during the fault has its rejected row now, with its prompt size, charged nothing
    assert usage["used_tokens"] == charged(rows)
