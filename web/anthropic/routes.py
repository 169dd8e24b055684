"""POST /v1/messages and /v1/messages/count_tokens behind the API-key guard (x-api-key or Bearer). A message runs
through the shared generation pipeline (web/generation/pipeline.py); only its shapes are Anthropic's (errors:
web/anthropic/errors.py)."""

from collections.abc import Mapping
from typing import Any, ClassVar

from litestar import Request, Response, Router, post
from litestar.types import Guard

from web import deps
from web.anthropic import errors, service
from web.anthropic.formatting import content_of, stop_reason, usage_of
from web.anthropic.schemas import MessageBody, MessagesRequest, TokenCount, encoder
from web.anthropic.streaming import MessageFrames
from web.backends.protocol import Served
from web.errors import AppError
from web.generation.intake import read_body
from web.generation.pipeline import Dialect, serve
from web.generation.prompts import Ask
from web.generation.run import Generation
from web.generation.stream import Collected
from web.history.record import RequestLog

AnyRequest = Request[Any, Any, Any]


class MessagesDialect(Dialect[MessagesRequest]):
    endpoint = "messages"
    id_prefix = "msg_"
    done = b""  # message_stop ends the stream
    # The engine names its fields as SamplingParams does; the client reads Anthropic's names.
    param_names: ClassVar[Mapping[str, str]] = {"stop": "stop_sequences"}

    def decode(self, raw: bytes) -> MessagesRequest:
        return service.decode_messages(raw)

    def describe(self, body: MessagesRequest, log: RequestLog) -> bool:
        log.model, log.stream = body.model, body.stream
        log.user = body.metadata.user_id if body.metadata else None
        return body.stream

    async def ask(self, body: MessagesRequest, served: Served) -> Ask:
        return await service.message_ask(body, served)

    def frames(self, body: MessagesRequest, generation: Generation) -> MessageFrames:
        log = generation.log
        return MessageFrames(generation, log.id, log.model, generation.tools)

    def error_frame(self, error: AppError) -> bytes:
        return errors.event_of(error)

    async def reply(self, body: MessagesRequest, generation: Generation, done: Collected) -> bytes:
        log = generation.log
        content, called = content_of(done.text, generation.tools)
        reason, sequence = stop_reason(done.final, called)
        return encoder.encode(MessageBody(log.id, log.model, content, reason, sequence, usage_of(log)))

    def headers(self, log: RequestLog) -> dict[str, str]:
        """Anthropic's clients read request-id (the SDK's `_request_id`), OpenAI's x-request-id: the history id."""
        return {"request-id": log.id, "x-request-id": log.id}


MESSAGES = MessagesDialect()


@post("/messages", status_code=200)
async def create_message(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    return await serve(request, MESSAGES, prompts, gate, ledger, generations)


@post("/messages/count_tokens", status_code=200)
async def count_tokens(request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate) -> Response[Any]:
    """The prompt's tokens as /v1/messages would count them; nothing is admitted, recorded or charged."""
    body = service.decode_count(await read_body(request))
    gate.check()
    ask = service.count_ask(body, prompts.served(body.model))
    prepared = await prompts.prepare(ask, request.state.api_key)
    return Response(encoder.encode(TokenCount(len(prepared.prompt_ids))), media_type="application/json")


def anthropic_router(authenticate: Guard) -> Router:
    """The Messages API behind `authenticate` (the API-key guard, which takes x-api-key too)."""
    return Router(path="/v1", route_handlers=[create_message, count_tokens], guards=[authenticate])
