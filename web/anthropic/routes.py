"""POST /v1/messages and /v1/messages/count_tokens behind the API-key guard (x-api-key or Bearer). A message
takes the OpenAI routes' path, stage by stage: its history row is refused or admitted by the same ledger, it
runs as a Generation, and only its shapes are Anthropic's (errors: web/anthropic/errors.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from litestar import Request, Response, Router, post
from litestar.types import Guard

from web import deps
from web.anthropic import errors, service
from web.anthropic.formatting import content_of, stop_reason, usage_of
from web.anthropic.schemas import MessageBody, TokenCount, encoder
from web.anthropic.streaming import MessageFrames
from web.errors import AppError
from web.generation.intake import new_log, read_body
from web.history.record import RequestLog
from web.keys.service import KeyInfo
from web.openai.streaming import collect, start_stream

AnyRequest = Request[Any, Any, Any]
ENDPOINT = "messages"  # the history row's endpoint: which API the request spoke


def _ids(log: RequestLog) -> dict[str, str]:
    """Anthropic's clients read request-id (the SDK's `_request_id`), OpenAI's x-request-id: the history id."""
    return {"request-id": log.id, "x-request-id": log.id}


@contextmanager
def _named_refusals(log: RequestLog) -> Iterator[None]:
    """A refusal of a request that has a history row names the row, as its answers do."""
    try:
        yield
    except AppError as exc:
        exc.headers.update(_ids(log))
        raise


@post("/messages", status_code=200)
async def create_message(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    """decode -> the key's policy -> one prepared value -> admitted (quota reserved, row written) and started on
    the engine -> streamed or collected; the Generation settles the ledger when it closes."""
    key: KeyInfo = request.state.api_key
    log = new_log(request, ENDPOINT, "msg_")
    with _named_refusals(log):
        async with ledger.refusals(log):
            body = service.decode_messages(await read_body(request))
            log.model, log.stream = body.model, body.stream
            log.user = body.metadata.user_id if body.metadata else None
            gate.check()
            prepared = await service.prepare(prompts, body, key)
            generation = await generations.admit(log, key, prepared)
        if body.stream:
            frames = MessageFrames(generation, log.id, log.model, prepared.tools)
            response = await start_stream(request, generation, frames.frames, frames.closing, errors.event_of, b"")
            response.headers.update(_ids(log))
            return response
        done = await collect(request, generation)  # a client gone meanwhile: ClientDisconnected, a 499 (web/errors)
    content, called = content_of(done.text, prepared.tools)
    reason, sequence = stop_reason(done.final, called)
    message = MessageBody(log.id, log.model, content, reason, sequence, usage_of(log))
    return Response(encoder.encode(message), media_type="application/json", headers=_ids(log))


@post("/messages/count_tokens", status_code=200)
async def count_tokens(request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate) -> Response[Any]:
    """The prompt's tokens as /v1/messages would count them; nothing is admitted, recorded or charged."""
    body = service.decode_count(await read_body(request))
    gate.check()
    count = await service.count(prompts, body, request.state.api_key)
    return Response(encoder.encode(TokenCount(count)), media_type="application/json")


def anthropic_router(authenticate: Guard) -> Router:
    """The Messages API behind `authenticate` (the API-key guard, which takes x-api-key too)."""
    return Router(path="/v1", route_handlers=[create_message, count_tokens], guards=[authenticate])
