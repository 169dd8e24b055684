"""One writer task that applies history updates and quota settlements in batches, one short transaction each.

At 100 concurrent streams a commit per event would make SQLite's single writer the bottleneck; a batch
commits whatever piled up during the previous commit. A caller may await its write (a request settles its
quota before its response ends, so the client's next request sees it) or not (the running mark).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("web.history")

Write = Callable[[AsyncConnection], Awaitable[None]]
MAX_BATCH = 512


class BatchWriter:
    def __init__(self, db: AsyncEngine) -> None:
        self.db = db  # Core connections: an ORM session per batch costs more CPU than the SQL it runs
        self._queue: asyncio.Queue[tuple[Write, asyncio.Future[None]] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._inline: set[asyncio.Future[None]] = set()  # strong references: the loop keeps only weak ones
        self._idle = asyncio.Event()
        self._idle.set()
        self.batches = 0
        self.writes = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="history-writer")

    def submit(self, write: Write) -> asyncio.Future[None]:
        """Queue a write, applied in order with every other; the future resolves once it is committed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.clear()
        self._queue.put_nowait((write, done))
        if self._task is None:  # not started yet, or stopped: nobody else will apply it
            inline = asyncio.ensure_future(self._drain_inline())
            self._inline.add(inline)
            inline.add_done_callback(self._inline.discard)
        return done

    async def flush(self) -> None:
        """Wait until everything submitted so far has been written."""
        if self._task is None:
            await self._drain_inline()
            return
        await self._idle.wait()

    async def stop(self) -> None:
        """Apply everything queued, then end the task; later writes are applied inline."""
        task, self._task = self._task, None
        if task is not None:
            self._queue.put_nowait(None)
            await task
        await self._drain_inline()

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    await self._apply(batch)
                    return
                batch.append(nxt)
            await self._apply(batch)
            if self._queue.empty():
                self._idle.set()

    async def _drain_inline(self) -> None:
        while not self._queue.empty():
            items = [self._queue.get_nowait() for _ in range(min(self._queue.qsize(), MAX_BATCH))]
            await self._apply([item for item in items if item is not None])
        self._idle.set()

    async def _apply(self, batch: list[tuple[Write, asyncio.Future[None]]]) -> None:
        try:
            async with self.db.begin() as conn:
                for write, _ in batch:
                    await write(conn)
        except Exception:
            # One bad write must not lose the others: retry each alone and log what still fails.
            log.exception("a history batch of %d writes failed; retrying one by one", len(batch))
            for write, _ in batch:
                try:
                    async with self.db.begin() as conn:
                        await write(conn)
                except Exception:
                    log.exception("a history write failed and is dropped")
        for _, done in batch:
            if not done.done():
                done.set_result(None)
        self.batches += 1
        self.writes += len(batch)
