"""The requests in flight, and the drain at shutdown: stop admitting, let them finish for a while, then abort
and finalize the rest."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Protocol

from web.generation.gate import EngineGate
from web.history.record import Status
from web.ledger import Ledger

ABORT_GRACE_S = 5.0


class Live(Protocol):
    """What the drain needs of a request in flight (web.generation.run.Generation)."""

    @property
    def request_id(self) -> str: ...

    async def abort(self, reason: str) -> None: ...

    async def close(self, status: Status | None = None, error: str | None = None) -> None: ...


class InFlight:
    def __init__(self, gate: EngineGate, ledger: Ledger) -> None:
        self.gate = gate
        self.ledger = ledger
        self._live: dict[str, Live] = {}

    def add(self, live: Live) -> None:
        self._live[live.request_id] = live

    def discard(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Live]:
        return iter(list(self._live.values()))

    async def drain(self, timeout: float) -> None:
        """Stop admitting, let requests in flight finish for up to `timeout` s, then abort and finalize the rest."""
        self.gate.draining = True
        await self._wait(time.monotonic() + timeout)
        for live in self:
            await live.abort("the server is shutting down and the drain timeout passed")
        await self._wait(time.monotonic() + ABORT_GRACE_S)
        for live in self:
            await live.close(Status.INTERRUPTED, "the server shut down while the request was in flight")
        await self.ledger.flush(timeout=5.0)  # the writer's stop() retries what the database still refuses

    async def _wait(self, deadline: float) -> None:
        while self._live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
