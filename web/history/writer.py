"""One writer task that applies history updates and quota settlements in batches, one short transaction each.

At 100 concurrent streams a commit per event would make SQLite's single writer the bottleneck; a batch
commits whatever piled up during the previous commit. A caller may await its write (a request settles its
quota before its response ends, so the client's next request sees it) or not (the running mark).

While the database refuses writes (locked past the busy timeout, disk full, I/O error) they stay queued, in
order, and are retried with backoff until they commit; a caller awaiting one is let go after its first try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("web.history")

Write = Callable[[AsyncConnection], Awaitable[None]]
OnError = Callable[[str], None]
MAX_BATCH = 512
# Writes held while the database refuses them. Admission needs the database too, so during an outage only
# refusals and the requests already in flight add writes; beyond this many, new ones are dropped (and counted).
MAX_BACKLOG = 10_000
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
STOP_GRACE_S = 10.0  # how long stop() keeps retrying before it gives up on what the database still refuses
# SQLite's primary result codes that say "not now" rather than "never": busy, locked, out of memory, read-only
# (a filesystem remounted), I/O error, disk full, cannot open, lock protocol.
_TRANSIENT_SQLITE_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})
# PostgreSQL's SQLSTATE classes that say the same: connection exception, transaction rollback (serialization,
# deadlock), insufficient resources (disk full, out of memory, too many connections), operator intervention
# (shutdown, starting up), system error (I/O); and 55P03, a lock not available.
_TRANSIENT_SQLSTATES = ("08", "40", "53", "57P", "58")


def is_transient(exc: BaseException) -> bool:
    """Whether the database refused a write for now (worth retrying) rather than for good (a bad write)."""
    # A database server that is down, restarting or unreachable: asyncpg's connect raises the socket's OSError
    # as it is, a connection lost mid-statement invalidates it.
    if isinstance(exc, DisconnectionError | PoolTimeout | OSError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_TRANSIENT_SQLSTATES) or sqlstate == "55P03"
    if not isinstance(exc, OperationalError):
        return False
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is None or code & 0xFF in _TRANSIENT_SQLITE_CODES  # other drivers: their OperationalError


def describe(exc: BaseException) -> str:
    """The driver's own words for a database error, for the log: SQLAlchemy's text adds the statement and its
    parameters, which hold what clients sent."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return f"{type(exc.orig).__name__}: {exc.orig}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(slots=True)
class _Pending:
    write: Write
    done: asyncio.Future[bool]


class BatchWriter:
    def __init__(self, db: AsyncEngine, on_error: OnError | None = None) -> None:
        self.db = db  # Core connections: an ORM session per batch costs more CPU than the SQL it runs
        self._on_error = on_error  # told each failure by kind: "history_write" (kept, retried), "history_dropped"
        self._pending: deque[_Pending] = deque()
        self._task: asyncio.Task[None] | None = None
        self._inline: set[asyncio.Future[None]] = set()  # strong references: the loop keeps only weak ones
        self._wake = asyncio.Event()  # new writes, or stop()
        self._retry_now = asyncio.Event()  # cuts a backoff short: the database took a write elsewhere
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop_by: float | None = None
        self._refused_since: float | None = None  # monotonic time of the first refusal of the current outage
        self._overflowing = False
        self.batches = 0
        self.writes = 0

    @property
    def backlog(self) -> int:
        """Writes submitted and not yet committed (or dropped)."""
        return len(self._pending)

    @property
    def refusing(self) -> bool:
        """Whether the database refused the last try (the backlog waits for it); waiting for a write then means
        waiting for the database to recover."""
        return self._refused_since is not None

    def start(self) -> None:
        if self._task is None:
            self._stop_by = None
            self._task = asyncio.create_task(self._run(), name="history-writer")

    def submit(self, write: Write) -> asyncio.Future[bool]:
        """Queue a write, applied in order with every other. The future resolves True once it is committed,
        False once the database refused it for now (it stays queued and is retried) or it was dropped."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if len(self._pending) >= MAX_BACKLOG:
            self._drop_new(done)
            return done
        self._idle.clear()
        self._pending.append(_Pending(write, done))
        self._wake.set()
        if self._task is None:  # not started yet, or stopped: nobody else will apply it
            inline = asyncio.ensure_future(self._drain_inline())
            self._inline.add(inline)
            inline.add_done_callback(self._inline.discard)
        return done

    def retry_now(self) -> None:
        """The database just took a write elsewhere: retry what it refused without waiting out the backoff."""
        if self.refusing:
            self._retry_now.set()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far has been written, for up to `timeout` s; whether it was."""
        if self._task is None:
            await self._drain_inline()
            return not self._pending
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self._idle.is_set()

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Apply everything queued, retrying for up to `grace` s what the database refuses (the rest is dropped,
        logged and counted), then end the task; later writes are applied inline."""
        if self._task is not None:  # it takes writes submitted meanwhile too, until it ends
            self._stop_by = time.monotonic() + grace
            self._wake.set()
            self._retry_now.set()
            await self._task
            self._task = None
        await self._drain_inline()

    async def _run(self) -> None:
        delay = 0.0
        while True:
            if not self._pending:
                self._idle.set()
                if self._stop_by is not None:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if await self._write_head():
                delay = 0.0
                continue
            if self._stop_by is not None and time.monotonic() >= self._stop_by:
                self._drop_all("the server is stopping and the database still refuses writes")
                return
            delay = min(RETRY_MAX_S, max(RETRY_FIRST_S, 2 * delay))
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)

    async def _drain_inline(self) -> None:
        """Without the task (before start, after stop) nothing would retry: what the database refuses is dropped."""
        while self._pending:
            if not await self._write_head():
                self._drop_all("the database refuses writes and the history writer is not running")
        self._idle.set()

    async def _write_head(self) -> bool:
        """Try the oldest writes, in one transaction or else one at a time; whether any left the queue. A write
        the database refuses for now stays at the head, with those after it; one that fails otherwise is dropped."""
        batch = [self._pending.popleft() for _ in range(min(len(self._pending), MAX_BATCH))]
        try:
            await self._commit(batch)
        except Exception as exc:
            if is_transient(exc):
                self._refused(batch, exc)
                return False
            log.warning("a history batch of %d writes failed (%s); retrying one by one", len(batch), describe(exc))
            for i, item in enumerate(batch):
                try:
                    await self._commit([item])
                except Exception as alone:
                    if is_transient(alone):
                        self._refused(batch[i:], alone)
                        return i > 0
                    log.error(
                        "a history write failed and is dropped", exc_info=alone
                    )  # not the database's state: a bug
                    self._count("history_dropped")
                    _resolve(item, False)
        return True

    async def _commit(self, batch: list[_Pending]) -> None:
        async with self.db.begin() as conn:
            for item in batch:
                await item.write(conn)
        for item in batch:
            _resolve(item, True)
        self.batches += 1
        self.writes += len(batch)
        if self._refused_since is not None:
            log.warning(
                "history writes resumed after %.1f s of refusals; %d still queued",
                time.monotonic() - self._refused_since,
                len(self._pending),
            )
            self._refused_since = None
            self._overflowing = False

    def _refused(self, items: list[_Pending], exc: Exception) -> None:
        """Put `items` back at the head, in order, to be retried; their waiters are let go."""
        self._pending.extendleft(reversed(items))
        self._count("history_write")
        if self._refused_since is None:
            self._refused_since = time.monotonic()
            log.error(
                "the database refused history writes; %d kept, retried until it takes them: %s",
                len(items),
                describe(exc),
            )
        for item in items:
            _resolve(item, False)

    def _drop_all(self, why: str) -> None:
        log.error("%d history write(s) dropped: %s", len(self._pending), why)
        while self._pending:
            _resolve(self._pending.popleft(), False)
            self._count("history_dropped")
        self._idle.set()

    def _drop_new(self, done: asyncio.Future[bool]) -> None:
        if not self._overflowing:
            self._overflowing = True
            log.error("%d history writes are waiting for the database; newer ones are dropped", MAX_BACKLOG)
        self._count("history_dropped")
        done.set_result(False)

    def _count(self, kind: str) -> None:
        if self._on_error is not None:
            self._on_error(kind)


def _resolve(item: _Pending, committed: bool) -> None:
    if not item.done.done():
        item.done.set_result(committed)
