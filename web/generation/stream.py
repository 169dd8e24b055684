"""Serving an admitted Generation, whichever dialect formats it: collected to its end, or streamed as Server-Sent
Events (a queued request told where it waits); the Generation settles the ledger when it closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from engine import Logprob, QueuePosition, RequestOutput
from web.errors import AppError
from web.generation.disconnect import CLIENT_CLOSED, ClientDisconnected, unless_disconnected
from web.generation.run import Generation
from web.history.record import Status

logger = logging.getLogger("web.generation")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The engine refuses (queue full, context length) at its next step, in milliseconds: a first delta still missing
# after this long means the request waits for a seat, and the stream starts so the client can be told where.
QUEUE_NOTICE_S = 1.0


@dataclass(slots=True)
class CollectedChoice:
    text: str
    logprobs: list[Logprob] | None
    final: RequestOutput


@dataclass(slots=True)
class Collected:
    choices: list[CollectedChoice]  # by index

    @property
    def text(self) -> str:
        """The first choice's text: the whole answer of an API without n."""
        return self.choices[0].text

    @property
    def final(self) -> RequestOutput:
        return self.choices[0].final


async def collect(request: Request[Any, Any, Any], generation: Generation) -> Collected:
    """Run a non-streamed request to its end; a client that leaves meanwhile aborts it."""

    n = len(generation.finals)
    parts: list[list[str]] = [[] for _ in range(n)]
    logprobs: list[list[Logprob] | None] = [None] * n

    def take(out: RequestOutput) -> None:
        i = generation.index_of(out)
        parts[i].append(out.text)
        if out.logprobs is not None:
            logprobs[i] = (logprobs[i] or []) + out.logprobs

    async def run() -> Collected:
        take(await generation.first())
        async for out in generation:
            take(out)
        finals = [f for f in generation.finals if f is not None]
        assert len(finals) == n
        return Collected([CollectedChoice("".join(p), lp, f) for p, lp, f in zip(parts, logprobs, finals, strict=True)])

    try:
        collected = await unless_disconnected(request.receive, run())
    finally:
        await generation.close()
    if generation.aborted:
        raise generation.error_for_abort()
    return collected


def queue_comment(position: QueuePosition | None) -> bytes:
    """An SSE comment (OpenAI's clients skip it) saying where a waiting request stands; without a position (not
    yet in the engine's snapshot, or prefilling) it only keeps the connection alive."""
    if position is None:
        return b": waiting\n\n"
    eta = "" if position.eta_s is None else f" eta={math.ceil(position.eta_s)}"
    return f": queued position={position.position}{eta}\n\n".encode()


async def _refused_or_waiting(first: asyncio.Future[RequestOutput]) -> None:
    """Raise the refusal if one comes within QUEUE_NOTICE_S; otherwise return with `first` done or still running."""
    await asyncio.wait((first,), timeout=QUEUE_NOTICE_S)
    if first.done() and (error := first.exception()) is not None:
        raise error


async def start_stream(
    request: Request[Any, Any, Any],
    generation: Generation,
    frames: Callable[[RequestOutput, bool], list[bytes]],
    closing: Callable[[], Awaitable[list[bytes]]],
    error_frame: Callable[[AppError], bytes],
    done: bytes,
    media_type: str = "text/event-stream",
    waiting: Callable[[QueuePosition | None], bytes] = queue_comment,
) -> Response[Any]:
    """Wait a moment for the first delta, so refusals still get their HTTP status, then stream SSE frames; a
    request still queued by then gets the status 200 and a comment about once a second saying where it stands
    until its first delta (a refusal after that comes in-band, as for an engine that dies mid-stream).

    `frames(out, is_first)` turns a delta into SSE frames; `closing()` gives the frames after the last delta;
    `error_frame` and `done` are the dialect's (OpenAI's: an "error" event, then [DONE]); so are `media_type` and
    `waiting`, the frame that tells a queued client where it stands (empty: the stream's format has no comments,
    and the client only sees its status line until the first delta)."""
    pending = asyncio.ensure_future(generation.first())

    async def finish() -> None:
        # A first() still waiting iterates the engine stream: stop it before close() closes that stream.
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
        await generation.close()

    try:
        await unless_disconnected(request.receive, _refused_or_waiting(pending))
    except ClientDisconnected:
        await finish()
        return Response(b"", status_code=CLIENT_CLOSED)
    except BaseException:
        # first() closes the request on its own failures; this is for anything else (a cancelled handler):
        # the key's slot and reservation are given back and the row is finalized whatever happened.
        with anyio.CancelScope(shield=True):
            await finish()
        raise

    async def events() -> AsyncIterator[bytes]:
        # One write per delta: each write is a syscall (and a wake-up of the client), the main cost per token.
        try:
            while not pending.done():
                if notice := waiting(generation.queue_position()):
                    yield notice
                await asyncio.wait((pending,), timeout=QUEUE_NOTICE_S)
            yield b"".join(frames(pending.result(), True))  # a refusal that came late is raised here, in-band
            async for out in generation:
                if data := b"".join(frames(out, False)):
                    yield data
                    generation.relayed(out)
            await generation.close()  # quota settled before [DONE] (or queued while storage is down)
            if generation.aborted:
                yield error_frame(generation.error_for_abort())
            else:
                yield b"".join([*(await closing()), done])
        except AppError as exc:  # the engine died mid-stream: the status line is long gone, say it in-band
            yield error_frame(exc)
        except Exception:
            logger.exception("the stream of request %s failed", generation.request_id)
            error = AppError("internal server error")
            await generation.close(Status.FAILED, error.message)
            yield error_frame(error)
        finally:
            # A disconnect cancels this generator's scope; shield the finalization from that cancellation.
            with anyio.CancelScope(shield=True):
                await finish()

    # The background task runs after the body even when a disconnect interrupted it mid-send, where the
    # generator above may be left suspended; finish() is idempotent.
    return Stream(
        events(),
        media_type=media_type,
        headers=SSE_HEADERS,
        background=BackgroundTask(finish),
    )
