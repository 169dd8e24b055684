"""One admitted request in flight: started on the engine at once (n engine requests for n choices), iterates
their deltas, keeps its one history record current, and closes exactly once (finished, cancelled, failed or
interrupted) through the ledger, which settles the key's quota to the tokens charged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from engine import EngineError, InvalidRequestError, QueueFullError, QueuePosition, RequestOutput, Usage
from web.backends.router import RoutedStream, Router
from web.errors import AppError, ServiceUnavailable, from_engine_error
from web.generation.inflight import InFlight
from web.generation.policy import Prepared
from web.history.record import RequestLog, Status
from web.keys.info import KeyInfo
from web.ledger import CHECKPOINT_S, Ledger
from web.system.metrics import Metrics
from web.tools import NO_TOOLS, ToolPlan

logger = logging.getLogger("web.generation")


class Generations:
    """Starts admitted requests on a backend (the router picks it); each is a Generation, in flight until it
    closes."""

    def __init__(
        self, router: Router, ledger: Ledger, inflight: InFlight, metrics: Metrics, store_text: bool = False
    ) -> None:
        self.router = router
        self.ledger = ledger
        self.inflight = inflight
        self.metrics = metrics
        self.store_text = store_text

    def start(self, log: RequestLog, prepared: Prepared) -> Generation:
        """The backend queues the request's choices now, together (the later ones find the prompt in the prefix
        cache); their refusals (queue full, a dead engine) come with the deltas."""
        streams = [
            self.router.generate(
                prepared.model,
                prepared.prompt_ids,
                params,
                request_id=choice_id(log.id, i),
                arrival_time=log.arrival_mono,
                tenant=prepared.tenant,
            )
            for i, params in enumerate(prepared.choices())
        ]
        generation = Generation(self, log, streams)
        generation.tools = prepared.tools
        self.inflight.add(generation)
        return generation

    async def admit(self, log: RequestLog, key: KeyInfo, prepared: Prepared) -> Generation:
        """Admit the request in the ledger and start it. A key without a quota cannot have its max_tokens cut by
        the reservation, so its request is queued on the backend first and waits for its seat while the
        database takes its row (that commit was a 43 ms p95 on a loaded appliance: time the first token no
        longer waits for); a refusal then stops it before any delta reaches the client. A key with a quota is
        reserved first, as it runs with what its quota has left."""
        if key.quota_tokens is not None:
            return self.start(log, await self.ledger.admit(log, key, prepared))
        held = self.ledger.hold(log, key, prepared)
        generation = self.start(log, held)
        generation.prefetch()
        try:
            await self.ledger.reserve(log, key, held)
        except BaseException:
            await generation.discard()
            raise
        return generation


def choice_id(request_id: str, index: int) -> str:
    """The engine request id of a choice: choice 0 runs under the history row's id."""
    return request_id if index == 0 else f"{request_id}.{index}"


class Generation:
    """Iterate it for the deltas of all choices after `first()`, in the order they come (`index_of` tells a
    delta's choice); each choice's last delta has finished=True, and `final` is the last one of all."""

    def __init__(self, owner: Generations, log: RequestLog, streams: list[RoutedStream]) -> None:
        self._owner = owner
        self.log = log
        self._streams = streams
        self._indexes = {choice_id(log.id, i): i for i in range(len(streams))}
        self._pending: dict[int, asyncio.Future[RequestOutput]] = {}  # n > 1: each live choice's next delta
        self._closed = False
        n = len(streams)
        self._text: list[list[str]] | None = [[] for _ in range(n)] if owner.store_text else None
        self._last_token_mono: list[float | None] = [None] * n
        self._counts = [0] * n  # tokens per choice
        self._usages: list[Usage | None] = [None] * n
        self.finals: list[RequestOutput | None] = [None] * n
        self._checkpointed = log.arrival_mono  # the first checkpoint comes a second after arrival
        self._observe_gap = owner.metrics.inter_token_observer()
        self.abort_reason: str | None = None
        self.tools: ToolPlan = NO_TOOLS  # how the answer's tool calls are read, the request's (web/tools)
        self.final: RequestOutput | None = None
        # The HTTP request's ASGI scope state, where the access log (web/system/access.py) reads "tokens".
        self.access_state: dict[str, Any] | None = None

    @property
    def request_id(self) -> str:
        return self.log.id

    @property
    def finished(self) -> bool:
        return self.final is not None

    @property
    def aborted(self) -> bool:
        """Whether the engine stopped a choice before its end (a shutdown, or an abort)."""
        return any(f is not None and f.finish_reason == "abort" for f in self.finals)

    def index_of(self, out: RequestOutput) -> int:
        """The choice a delta belongs to."""
        return self._indexes.get(out.request_id, 0)

    def relayed(self, out: RequestOutput) -> None:
        """The delta's frame is written: how long it was in the gateway, where a remote backend sent it."""
        stream = self._streams[self.index_of(out)]
        if stream.received_at is not None and stream.backend_name is not None:
            elapsed = time.perf_counter() - stream.received_at
            self._owner.metrics.relay.labels(stream.backend_name).observe(elapsed)

    def queue_position(self) -> QueuePosition | None:
        """Where the request waits for a seat; None once it runs (or where the engine cannot say)."""
        return self._owner.router.queue_position(self.request_id)

    async def first(self) -> RequestOutput:
        """The first delta; engine refusals (queue full, context length, dead) become AppErrors here. The row names
        the backend that serves it (choice 0's) from here on."""
        out = await self._next(first=True)
        self.log.backend = self._streams[0].backend_name
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
            index, out = await self._next_of_any()
        except EngineError as exc:
            error = from_engine_error(exc)
            refused = first and isinstance(exc, QueueFullError | InvalidRequestError)
            if refused:
                self._owner.metrics.observe_rejected(error.code or error.type)
            await self.close(Status.REJECTED if refused else Status.FAILED, error.message)
            raise error from None
        except StopAsyncIteration:
            message = "the engine ended the request without " + ("output" if first else "a final output")
            await self.close(Status.FAILED, message)
            raise ServiceUnavailable(message) from None
        except Exception:
            logger.exception("request %s failed", self.request_id)
            error = AppError("internal server error")
            await self.close(Status.FAILED, error.message)
            raise error from None
        self._track(index, out)
        return out

    def prefetch(self) -> None:
        """Start waiting for every choice's first delta now: the backend queues them before anyone reads."""
        for i, stream in enumerate(self._streams):
            self._pending[i] = asyncio.ensure_future(anext(stream))

    async def discard(self) -> None:
        """Stop a generation that was never admitted (its row could not be written): its choices are stopped on
        the backend and nothing is settled (the refusal writes the row)."""
        self._closed = True
        try:
            await self._stop_choices()
        finally:
            self._owner.inflight.discard(self.request_id)

    async def _next_of_any(self) -> tuple[int, RequestOutput]:
        """The next delta of whichever unfinished choice has one first (one choice: its stream, with no task,
        unless prefetched)."""
        if len(self._streams) == 1 and not self._pending:
            return 0, await anext(self._streams[0])
        for i, stream in enumerate(self._streams):
            if self.finals[i] is None and i not in self._pending:
                self._pending[i] = asyncio.ensure_future(anext(stream))
        await asyncio.wait(self._pending.values(), return_when=asyncio.FIRST_COMPLETED)
        index = min(i for i, task in self._pending.items() if task.done())
        return index, self._pending.pop(index).result()

    def _track(self, index: int, out: RequestOutput) -> None:
        now = time.monotonic()
        n = len(out.token_ids)
        log = self.log
        if n:
            last = self._last_token_mono[index]
            if log.first_token_mono is None:
                log.first_token_mono = now
            elif last is not None:
                self._observe_gap(now - last, n)
            self._last_token_mono[index] = now
            if now - self._checkpointed >= CHECKPOINT_S and not out.finished:
                # What was handed to the client so far: every earlier delta was written before this one was
                # taken; this delta (several tokens where the gateway fell behind the engine) is not yet.
                self._checkpointed = now
                self._owner.ledger.checkpoint(log, now)
            self._counts[index] += n
            log.completion_tokens += n
        if self._text is not None and out.text:
            self._text[index].append(out.text)
        if out.usage is not None:
            self._usages[index] = out.usage
            self._counts[index] = out.usage.completion_tokens
        if out.finished:
            self.finals[index] = out
        # The first delta's timings too (a cancel may come before the end); the schedule and first token are
        # choice 0's, the prompt is counted once and the completions summed (as OpenAI bills n > 1).
        if out.usage is not None or (index == 0 and out.timings is not None):
            log.apply_engine_result(self._usage(), out.timings if index == 0 else None)
        finals = [f for f in self.finals if f is not None] if out.finished else []
        if len(finals) == len(self.finals):
            self.final = out
            log.finish_reason = "abort" if self.aborted else finals[0].finish_reason
            ends = [f.timings.finished for f in finals if f.timings is not None]
            log.finished_mono = max((t for t in ends if t is not None), default=now)

    def _usage(self) -> Usage | None:
        """The engine's counts over all choices so far; the cached prompt tokens are the choice that computed the
        prompt's (the others found it in the cache)."""
        usages = [u for u in self._usages if u is not None]
        if not usages:
            return None
        return Usage(usages[0].prompt_tokens, sum(self._counts), min(u.cached_prompt_tokens for u in usages))

    async def abort(self, reason: str) -> None:
        """Ask the engine to stop this request; its consumer then sees a final delta with reason "abort"."""
        self.abort_reason = reason
        for request_id in self._indexes:
            await self._owner.router.abort(request_id)

    async def close(self, status: Status | None = None, error: str | None = None) -> None:
        """Finalize once: stop the engine request if it still runs, then settle it in the ledger.

        status None means "decide from how it ended": finished, or interrupted after a shutdown abort, or
        cancelled when the consumer went away before the end (client disconnect)."""
        if self._closed:
            return
        self._closed = True
        log = self.log
        try:
            await self._stop_choices()
        finally:
            if status is None:
                if self.final is None:
                    status, error = Status.CANCELLED, error or "the client disconnected"
                elif self.aborted:
                    status = Status.INTERRUPTED if self.abort_reason else Status.CANCELLED
                    error = error or self.abort_reason or "aborted"
                else:
                    status = Status.FINISHED
            log.status = status
            log.error = error
            log.backend = log.backend or self._streams[0].backend_name
            if log.finished_mono is None:
                log.finished_mono = time.monotonic()
            log.assume_scheduled_by_first_token()
            if self._text is not None:
                log.response_text = _stored_text(self._text)
            self._owner.inflight.discard(self.request_id)
            if self.access_state is not None:
                self.access_state["tokens"] = log.charged_tokens
            await self._owner.ledger.settle(log)

    async def _stop_choices(self) -> None:
        """Stop every choice still running: its pending next delta first, then its stream (which aborts it)."""
        for task in self._pending.values():
            task.cancel()
        await asyncio.gather(*self._pending.values(), return_exceptions=True)
        self._pending.clear()
        for stream, final in zip(self._streams, self.finals, strict=True):
            if final is None:
                await _close_quietly(stream)

    def error_for_abort(self) -> AppError:
        return ServiceUnavailable(
            f"the request was aborted: {self.abort_reason or 'stopped by the server'}", code="aborted"
        )


def _stored_text(texts: list[list[str]]) -> str:
    """The history's response text: the reply, or each choice's under its index."""
    if len(texts) == 1:
        return "".join(texts[0])
    return "\n\n".join(f"[choice {i}]\n" + "".join(parts) for i, parts in enumerate(texts))


async def _close_quietly(stream: AsyncIterator[RequestOutput]) -> None:
    """Closing the engine's generator aborts the request; only a cancelled caller should stop it."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    # RuntimeError: the generator is being iterated elsewhere; its own finally aborts the request then.
    with contextlib.suppress(EngineError, RuntimeError):
        await aclose()
