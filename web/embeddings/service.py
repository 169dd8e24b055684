"""One embedding request, whichever dialect decoded it: the model it names checked, its inputs' tokens reserved
and its history row written (the ledger), the vectors from the embedding model's process, the row settled to the
tokens the inputs took. Nothing is generated, so the row's prompt tokens are its whole charge."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request

from engine import AsyncEmbeddingClient, EmbeddingModelInfo, Embeddings, EngineError, EngineState, InvalidRequestError
from web.errors import AppError, ModelNotFound, ServiceUnavailable, from_engine_error
from web.generation.intake import new_log, read_body
from web.generation.prompts import shown
from web.history.record import RequestLog, Status
from web.keys.info import KeyInfo
from web.ledger import Ledger

SETTING = "APPLIANCE_EMBEDDING_MODEL"
BACKEND = "embedding"  # the history rows' backend: the embedding model's own process


@dataclass(frozen=True, slots=True)
class EmbeddingAsk:
    """What a dialect decoded: texts or token-id lists, the dimensions asked for, whether to cut long inputs."""

    inputs: Sequence[str | list[int]]
    dimensions: int | None = None
    truncate: bool = False


class Embedder:
    """The gateway's embedding model (None where the operator configured none) behind the ledger."""

    def __init__(self, client: AsyncEmbeddingClient | None, ledger: Ledger) -> None:
        self.client = client
        self.ledger = ledger

    @property
    def info(self) -> EmbeddingModelInfo | None:
        """The model being served, once its process is ready."""
        return self.client.model_info if self.client is not None else None

    def served(self, model: str, aliases: Sequence[str] = ()) -> EmbeddingModelInfo:
        """The embedding model a request names (or one of `aliases` of its name, a dialect's spellings), or why
        it cannot be served: 404 when none is configured or the name is another's, 503 while it is not ready."""
        client = self.client
        if client is None:
            raise ModelNotFound(
                f"this server serves no embedding model: the operator set {SETTING}=none (set it to 'default' or a "
                "model directory to serve embeddings)",
                param="model",
            )
        info = client.model_info
        if info is None or client.state != EngineState.READY:
            raise ServiceUnavailable(
                f"the embedding model is not ready (state: {client.state})", code="engine_unavailable"
            )
        if model != info.name and model not in aliases:
            raise ModelNotFound(
                f"the embedding model {shown(model)} does not exist; this server embeds with '{info.name}'",
                param="model",
            )
        return info

    async def admit(self, log: RequestLog, key: KeyInfo, ask: EmbeddingAsk, info: EmbeddingModelInfo) -> None:
        """The inputs' tokens at most reserved and the queued row written (inside the ledger's `refusals`)."""
        prompt_text = msgspec.json.encode(list(ask.inputs)).decode() if self.ledger.store_text else None
        await self.ledger.admit_tokens(log, key, reservation(ask.inputs, info), prompt_text)

    async def run(self, log: RequestLog, ask: EmbeddingAsk) -> Embeddings:
        """An admitted request embedded and settled: charged the tokens its inputs took, or nothing when the
        model refused it (an input too long, a token id outside the vocabulary)."""
        assert self.client is not None  # served() said so
        try:
            result = await self.client.embed(ask.inputs, dimensions=ask.dimensions, truncate=ask.truncate)
        except BaseException as exc:
            await self._settle_refused(log, exc)
            raise _app_error(exc) if isinstance(exc, EngineError) else exc from None
        log.prompt_tokens = result.prompt_tokens
        log.scheduled_mono = log.first_token_mono = log.finished_mono = time.monotonic()
        log.status, log.finish_reason, log.backend = Status.FINISHED, "stop", BACKEND
        await self.ledger.settle(log)
        return result

    async def _settle_refused(self, log: RequestLog, exc: BaseException) -> None:
        """The row of an admitted request the model refused, or that failed or was cancelled: nothing charged."""
        log.finished_mono, log.backend = time.monotonic(), BACKEND
        if isinstance(exc, InvalidRequestError):
            log.status, log.error = Status.REJECTED, str(exc)
        elif isinstance(exc, asyncio.CancelledError):
            log.status, log.error = Status.CANCELLED, "the client disconnected"
        else:
            log.status, log.error = Status.FAILED, str(exc) or type(exc).__name__
        await asyncio.shield(self.ledger.settle(log))


def reservation(inputs: Sequence[str | list[int]], info: EmbeddingModelInfo) -> int:
    """An upper bound of the inputs' tokens, known before they are tokenized: a WordPiece or BPE token covers one
    character at least, and no input counts more than the model takes."""
    return sum(min(len(item), info.max_input_tokens) for item in inputs)


def _app_error(exc: EngineError) -> AppError:
    """The embedding model's refusal; one of `input`'s length names the field (the engine says prompt)."""
    error = from_engine_error(exc)
    if error.param in ("prompt", "messages"):
        error.param = "input"
    return error


async def serve_embeddings(
    request: Request[Any, Any, Any],
    embedder: Embedder,
    ledger: Ledger,
    endpoint: str,
    decode: Callable[[bytes, RequestLog], tuple[str, Callable[[EmbeddingModelInfo], EmbeddingAsk]]],
) -> tuple[RequestLog, EmbeddingModelInfo, Embeddings]:
    """One embedding request of any dialect: `decode` reads the body into the model it names and a function of
    the served model giving the ask (its validation may need the model's limits)."""
    log = new_log(request, endpoint, "emb-")
    try:
        async with ledger.refusals(log):
            model, ask_for = decode(await read_body(request), log)
            info = embedder.served(model)
            ask = ask_for(info)
            key = await ledger.payer(log, request.state.api_key, request.headers)
            await embedder.admit(log, key, ask, info)
        return log, info, await embedder.run(log, ask)
    except AppError as exc:
        exc.headers["x-request-id"] = log.id
        raise
