"""The one generation pipeline every API dialect's route runs, top to bottom: decode -> the model and the key's
policy -> one prepared value -> admitted (quota reserved, row written) and started -> streamed or collected; the
Generation settles the ledger when it closes. A dialect (Dialect) only decodes its body and formats the answer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from litestar import Request, Response

from engine import ContextLengthError, InvalidRequestError, QueuePosition, RequestOutput
from web.backends.protocol import Served
from web.errors import AppError, InvalidRequest
from web.generation.disconnect import CLIENT_CLOSED, ClientDisconnected
from web.generation.gate import EngineGate
from web.generation.intake import new_log, read_body
from web.generation.policy import trimmed_to
from web.generation.prompts import Ask, Prompts
from web.generation.run import Generation, Generations
from web.generation.stream import Collected, collect, queue_comment, start_stream
from web.history.record import RequestLog
from web.keys.info import KeyInfo
from web.ledger import Ledger

AnyRequest = Request[Any, Any, Any]
Body = TypeVar("Body")


class Frames(Protocol):
    """One stream's SSE frames: each delta's (`is_first`: the stream's first), then those after the last one."""

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]: ...

    async def closing(self) -> list[bytes]: ...


class Dialect(ABC, Generic[Body]):
    """What one API endpoint adds to the pipeline: its body, its validation into an Ask, its answer's shapes."""

    endpoint: ClassVar[str]  # the history row's endpoint: which API the request spoke
    id_prefix: ClassVar[str]  # of the history id, which the answer carries as its id
    done: ClassVar[bytes]  # the stream's last frame
    param_names: ClassVar[Mapping[str, str]] = {}  # the engine's field names as this API's body spells them
    media_type: ClassVar[str] = "text/event-stream"  # of a stream

    def waiting(self, position: QueuePosition | None) -> bytes:
        """The frame that tells a streamed request still queued where it waits (SSE: a comment)."""
        return queue_comment(position)

    @abstractmethod
    def decode(self, raw: bytes) -> Body: ...

    @abstractmethod
    def describe(self, body: Body, log: RequestLog) -> bool:
        """Note the body's model, stream and user on the row; whether it streams."""

    @abstractmethod
    async def ask(self, body: Body, served: Served) -> Ask:
        """The body validated into the pipeline's terms, for the model that serves it."""

    @abstractmethod
    def frames(self, body: Body, generation: Generation) -> Frames: ...

    @abstractmethod
    def error_frame(self, error: AppError) -> bytes:
        """A refusal once the stream has started (its status line is gone)."""

    @abstractmethod
    async def reply(self, body: Body, generation: Generation, done: Collected) -> bytes:
        """The JSON answer of a request that does not stream."""

    def headers(self, log: RequestLog) -> dict[str, str]:
        """The headers that name the history row on every answer, refusals included."""
        return {"x-request-id": log.id}


async def serve(
    request: AnyRequest,
    dialect: Dialect[Body],
    prompts: Prompts,
    gate: EngineGate,
    ledger: Ledger,
    generations: Generations,
) -> Response[Any]:
    """One generation request through the pipeline, answered in its dialect's shapes."""
    log = new_log(request, dialect.endpoint, dialect.id_prefix)
    with _named_refusals(log, dialect):
        async with ledger.refusals(log):
            body = dialect.decode(await read_body(request))
            streams = dialect.describe(body, log)
            key: KeyInfo = await ledger.payer(log, request.state.api_key, request.headers)
            gate.check()
            ask = await dialect.ask(body, prompts.served(log.model))
            with _engine_names(dialect):
                prepared = await prompts.prepare(ask, key)
            generation = await generations.admit(log, key, prepared)
            generation.access_state = request.scope.setdefault("state", {})  # its tokens, once settled
        if streams:
            frames = dialect.frames(body, generation)
            response = await start_stream(
                request,
                generation,
                frames.frames,
                frames.closing,
                dialect.error_frame,
                dialect.done,
                dialect.media_type,
                dialect.waiting,
            )
        else:
            try:
                done = await collect(request, generation)
            except ClientDisconnected:
                response = Response(b"", status_code=CLIENT_CLOSED)
            else:
                response = Response(await dialect.reply(body, generation, done), media_type="application/json")
    response.headers.update(dialect.headers(log) | trimmed_to(log))
    return response


@contextmanager
def _named_refusals(log: RequestLog, dialect: Dialect[Any]) -> Iterator[None]:
    """A refusal of a request that has a history row names the row, as its answers do."""
    try:
        yield
    except AppError as exc:
        exc.headers.update(dialect.headers(log))
        raise


@contextmanager
def _engine_names(dialect: Dialect[Any]) -> Iterator[None]:
    """The engine's refusal of a sampling field, naming the field as the dialect's body spells it."""
    try:
        yield
    except ContextLengthError:
        raise
    except InvalidRequestError as exc:
        param = dialect.param_names.get(exc.param or "", exc.param)
        raise InvalidRequest(str(exc), param=param) from None
