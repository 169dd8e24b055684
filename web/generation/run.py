"""One admitted request in flight: started on the engine at once, iterates its deltas, keeps its history record
current, and closes exactly once (finished, cancelled, failed or interrupted) through the ledger, which settles
the key's quota to the tokens charged."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from engine import EngineError, InvalidRequestError, QueueFullError, QueuePosition, RequestOutput
from web.errors import AppError, ServiceUnavailable, from_engine_error
from web.generation.backend import EngineClient
from web.generation.inflight import InFlight
from web.generation.policy import Prepared
from web.history.record import RequestLog
from web.ledger import CHECKPOINT_S, Ledger
from web.system.metrics import Metrics

logger = logging.getLogger("web.generation")


class Generations:
    """Starts admitted requests on the engine; each is a Generation, in flight until it closes."""

    def __init__(
        self, client: EngineClient, ledger: Ledger, inflight: InFlight, metrics: Metrics, store_text: bool = False
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.inflight = inflight
        self.metrics = metrics
        self.store_text = store_text

    def start(self, log: RequestLog, prepared: Prepared) -> Generation:
        """The engine queues the request now; its refusals (queue full, a dead engine) come with `first()`."""
        stream = self.client.generate(
            prepared.prompt_ids,
            prepared.params,
            request_id=log.id,
            arrival_time=log.arrival_mono,
            tenant=prepared.tenant,
        )
        generation = Generation(self, log, stream)
        self.inflight.add(generation)
        return generation


class Generation:
    """Iterate it for the deltas after `first()`; the final delta has finished=True."""

    def __init__(self, owner: Generations, log: RequestLog, stream: AsyncIterator[RequestOutput]) -> None:
        self._owner = owner
        self.log = log
        self._stream = stream
        self._closed = False
        self._text: list[str] | None = [] if owner.store_text else None
        self._last_token_mono: float | None = None
        self._checkpointed = log.arrival_mono  # the first checkpoint comes a second after arrival
        self._observe_gap = owner.metrics.inter_token_observer()
        self.abort_reason: str | None = None
        self.final: RequestOutput | None = None

    @property
    def request_id(self) -> str:
        return self.log.id

    @property
    def finished(self) -> bool:
        return self.final is not None

    def queue_position(self) -> QueuePosition | None:
        """Where the request waits for a seat; None once it runs (or where the engine cannot say)."""
        return self._owner.client.queue_position(self.request_id)

    async def first(self) -> RequestOutput:
        """The first delta; engine refusals (queue full, context length, dead) become AppErrors here."""
        out = await self._next(first=True)
        self._owner.ledger.mark_running(self.log)
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
                self._owner.metrics.observe_rejected(error.code or error.type)
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
            if now - self._checkpointed >= CHECKPOINT_S and not out.finished:
                self._checkpointed = now
                self._owner.ledger.checkpoint(log, now)
        if self._text is not None and out.text:
            self._text.append(out.text)
        if out.finished:
            self.final = out
            log.finish_reason = out.finish_reason
            log.finished_mono = now
        if out.finished or out.timings is not None:  # the first delta's timings too: a cancel may come before the end
            log.apply_engine_result(out.usage, out.timings)

    async def abort(self, reason: str) -> None:
        """Ask the engine to stop this request; its consumer then sees a final delta with reason "abort"."""
        self.abort_reason = reason
        await self._owner.client.abort(self.request_id)

    async def close(self, status: str | None = None, error: str | None = None) -> None:
        """Finalize once: stop the engine request if it still runs, then settle it in the ledger.

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
            log.assume_scheduled_by_first_token()
            if self._text is not None:
                log.response_text = "".join(self._text)
            self._owner.inflight.discard(self.request_id)
            await self._owner.ledger.settle(log)

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
