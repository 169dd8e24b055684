"""One admitted request in flight: iterates the engine's deltas, keeps its history record current, and closes
exactly once (finished, cancelled, failed or interrupted) settling the key's quota to the tokens charged."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from engine import EngineError, InvalidRequestError, QueueFullError, RequestOutput
from web.errors import AppError, ServiceUnavailable, from_engine_error
from web.history.record import RequestLog

if TYPE_CHECKING:
    from web.state import Services

logger = logging.getLogger("web.generation")


class Generation:
    """Iterate it for the deltas after `first()`; the final delta has finished=True."""

    def __init__(
        self,
        services: Services,
        log: RequestLog,
        stream: AsyncIterator[RequestOutput],
        on_close: Callable[[Generation], None],
    ) -> None:
        self.services = services
        self.log = log
        self._stream = stream
        self._on_close = on_close
        self._closed = False
        self._text: list[str] | None = [] if services.config.store_text else None
        self._last_token_mono: float | None = None
        self._observe_gap = services.metrics.inter_token_observer()
        self.abort_reason: str | None = None
        self.final: RequestOutput | None = None

    @property
    def request_id(self) -> str:
        return self.log.id

    @property
    def finished(self) -> bool:
        return self.final is not None

    async def first(self) -> RequestOutput:
        """The first delta; engine refusals (queue full, context length, dead) become AppErrors here."""
        out = await self._next(first=True)
        self.services.history.mark_running(self.log)
        return out

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.final is not None:
            raise StopAsyncIteration
        return await self._next(first=False)

    async def _next(self, first: bool) -> RequestOutput:
        """The next delta. Any failure closes the request (its row says why) and leaves as an AppError; only a
        cancellation (the client went away) leaves the close to the caller."""
        try:
            out = await anext(self._stream)
        except EngineError as exc:
            error = from_engine_error(exc)
            refused = first and isinstance(exc, QueueFullError | InvalidRequestError)
            if refused:
                self.services.metrics.observe_rejected(error.code or error.type)
            await self.close("rejected" if refused else "failed", error.message)
            raise error from None
        except StopAsyncIteration:
            message = "the engine ended the request without " + ("output" if first else "a final output")
            await self.close("failed", message)
            raise ServiceUnavailable(message) from None
        except Exception:
            logger.exception("request %s failed", self.request_id)
            error = AppError("internal server error")
            await self.close("failed", error.message)
            raise error from None
        self._track(out)
        return out

    def _track(self, out: RequestOutput) -> None:
        now = time.monotonic()
        n = len(out.token_ids)
        log = self.log
        if n:
            if log.first_token_mono is None:
                log.first_token_mono = now
            elif self._last_token_mono is not None:
                self._observe_gap(now - self._last_token_mono, n)
            self._last_token_mono = now
            log.completion_tokens += n
        if self._text is not None and out.text:
            self._text.append(out.text)
        if out.finished:
            self.final = out
            log.finish_reason = out.finish_reason
            log.finished_mono = now
            log.apply_engine_result(out.usage, out.timings)

    async def abort(self, reason: str) -> None:
        """Ask the engine to stop this request; its consumer then sees a final delta with reason "abort"."""
        self.abort_reason = reason
        await self.services.client.abort(self.request_id)

    async def close(self, status: str | None = None, error: str | None = None) -> None:
        """Finalize once: stop the engine request if it still runs, then write the row and settle the quota (or,
        while the database refuses writes, leave both queued to the history writer, which retries them).

        status None means "decide from how it ended": finished, or interrupted after a shutdown abort, or
        cancelled when the consumer went away before the end (client disconnect)."""
        if self._closed:
            return
        self._closed = True
        log = self.log
        try:
            if self.final is None:
                await _close_quietly(self._stream)
        finally:
            if status is None:
                if self.final is None:
                    status, error = "cancelled", error or "the client disconnected"
                elif self.final.finish_reason == "abort":
                    status = "interrupted" if self.abort_reason else "cancelled"
                    error = error or self.abort_reason or "aborted"
                else:
                    status = "finished"
            log.status = status
            log.error = error
            if log.finished_mono is None:
                log.finished_mono = time.monotonic()
            if self._text is not None:
                log.response_text = "".join(self._text)
            self._on_close(self)
            self.services.metrics.observe_request(log)
            settled = self.services.history.finalize(log)
            if not self.services.writer.refusing:  # else it is queued until the database takes it
                await settled

    def error_for_abort(self) -> AppError:
        return ServiceUnavailable(
            f"the request was aborted: {self.abort_reason or 'stopped by the server'}", code="aborted"
        )


async def _close_quietly(stream: AsyncIterator[RequestOutput]) -> None:
    """Closing the engine's generator aborts the request; only a cancelled caller should stop it."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    # RuntimeError: the generator is being iterated elsewhere; its own finally aborts the request then.
    with contextlib.suppress(EngineError, RuntimeError):
        await aclose()
