"""One request's deltas from the backend the router seats it on: `backend` is None until its first delta is asked
for (it may wait for a seat then); a failure before the first delta moves it once to another backend."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from engine import DEFAULT_TENANT, EngineDeadError, QueueFullError, RequestOutput, SamplingParams, Tenant
from web.backends.protocol import Backend
from web.backends.seats import Seated, Withdrawn

log = logging.getLogger("web.backends")

RETRIES = 1


class Seating(Protocol):
    """What a stream asks of the router that made it (web/backends/router.py)."""

    async def seat(self, stream: RoutedStream, exclude: frozenset[str]) -> Backend: ...

    def serving(self, model: str, exclude: frozenset[str]) -> bool: ...

    def released(self, stream: RoutedStream, backend: Backend) -> None: ...

    def first_token(self, backend: Backend, seconds: float) -> None: ...

    def generated(self, stream: RoutedStream, tokens: int) -> None: ...

    def ended(self, stream: RoutedStream) -> None: ...


class RoutedStream:
    def __init__(
        self,
        router: Seating,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> None:
        self._router = router
        self.model = model
        self.prompt_ids = prompt_ids
        self.request_id = request_id
        self._params = params
        self._arrival_time = arrival_time
        self.tenant = tenant
        self.entry = Seated(tenant or DEFAULT_TENANT)  # the fair queue's count of it
        self.backend: Backend | None = None
        self._stream: AsyncIterator[RequestOutput] | None = None
        self._started = False
        self._closed = False  # the router forgot it
        self._opened_at: float | None = None  # until its first token
        # When the gateway read the latest delta from a remote backend (perf_counter; None for the local engine):
        # the relay time, until its frame is written, is the latency the gateway adds.
        self.received_at: float | None = None

    @property
    def backend_name(self) -> str | None:
        return None if self.backend is None else self.backend.name

    def __aiter__(self) -> RoutedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._started:
            return await self._next()
        self._started = True
        return await self._first()

    async def _first(self) -> RequestOutput:
        tried: set[str] = set()
        while True:
            try:
                backend = await self._router.seat(self, frozenset(tried))
            except Withdrawn:  # aborted while waiting for a seat: it ends as an engine's aborted request does
                self._end()
                return RequestOutput(self.request_id, [], "", finished=True, finish_reason="abort")
            except BaseException:
                self._end()
                raise
            self._open(backend)
            tried.add(backend.name)
            try:
                return await self._next(retrying=True)
            except (EngineDeadError, QueueFullError) as exc:
                await self._release(close=False)
                if len(tried) > RETRIES or not self._router.serving(self.model, frozenset(tried)):
                    self._end()
                    raise
                log.warning(
                    "request %s: %s failed before any output, retried elsewhere: %s", self.request_id, backend.name, exc
                )

    def _open(self, backend: Backend) -> None:
        served = backend.models()[self.model]
        self.backend = backend
        self._stream = backend.generate(
            served, self.prompt_ids, self._params, self.request_id, self._arrival_time, self.tenant
        )
        self._opened_at = time.monotonic()

    async def _next(self, retrying: bool = False) -> RequestOutput:
        """The current backend's next delta; the stream ends with its last one, or with a failure (which a
        retry before the first delta handles instead)."""
        if self._stream is None:
            raise StopAsyncIteration
        try:
            out = await anext(self._stream)
            self.received_at = getattr(self._stream, "received_at", None)
        except (EngineDeadError, QueueFullError):
            if not retrying:
                await self._release(close=False)
                self._end()
            raise
        except BaseException:  # cancelled (the client went away), or anything else: the backend's request stops
            await self.aclose()
            raise
        if out.token_ids:
            self._router.generated(self, len(out.token_ids))
            if self._opened_at is not None and self.backend is not None:
                self._router.first_token(self.backend, time.monotonic() - self._opened_at)
                self._opened_at = None
        if out.finished:
            await self._release(close=False)
            self._end()
        return out

    async def _release(self, close: bool = True) -> None:
        """Give the seat back (the next waiting request may take it), closing the backend's stream if asked."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if self.backend is not None:
            self._router.released(self, self.backend)
        aclose = getattr(stream, "aclose", None)
        if close and aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._router.ended(self)

    async def aclose(self) -> None:
        """Closing early aborts the request on its backend (a remote one sees its connection close)."""
        await self._release()
        self._end()
