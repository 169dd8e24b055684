"""The /v1 routes: chat completions, completions and models, behind the API-key guard."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from litestar import Request, Response, Router, get, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath

from web.errors import InvalidRequest, PayloadTooLarge
from web.generation.admission import Prepared, admit
from web.generation.disconnect import ClientDisconnected
from web.generation.run import Generation
from web.history.record import RequestLog
from web.keys.guard import api_key_guard
from web.openai import formatting as fmt
from web.openai import service
from web.openai.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from web.openai.streaming import (
    CLIENT_CLOSED,
    ChatFrames,
    Collected,
    CompletionFrames,
    collect,
    created_now,
    start_stream,
    usage_of,
)
from web.state import Services, services_of

AnyRequest = Request[Any, Any, Any]


def _new_log(request: AnyRequest, endpoint: str, id_prefix: str) -> RequestLog:
    wall, mono = request.state.arrival
    client = request.client.host if request.client else None
    return RequestLog(
        id=id_prefix + uuid.uuid4().hex,
        key_id=request.state.api_key.id,
        model="",
        endpoint=endpoint,
        stream=False,
        arrival_at=wall,
        arrival_mono=mono,
        client_addr=client,
    )


async def _read_body(request: AnyRequest) -> bytes:
    try:
        return await request.body()
    except HTTPException as exc:  # Litestar's size limit and framing errors, recorded like any bad input
        if exc.status_code == 413:
            raise PayloadTooLarge("the request body is too large") from None
        raise InvalidRequest(f"the request body could not be read: {exc.detail}") from None


Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)
Frames = ChatFrames | CompletionFrames


async def _serve(
    request: AnyRequest,
    endpoint: str,
    id_prefix: str,
    decode_body: Callable[[bytes], Body],
    prepare: Callable[[Body], Awaitable[Prepared]],
    frames: Callable[[Generation, str, str, bool], Frames],
    render: Callable[[RequestLog, Collected, Generation], object],
) -> Response[Any]:
    """The path both endpoints share: decode and admit (history row, quota), then stream or collect."""
    services = services_of(request)
    log = _new_log(request, endpoint, id_prefix)

    async def decode() -> Body:
        body = decode_body(await _read_body(request))
        log.model, log.stream, log.user = body.model, body.stream, body.user
        return body

    body, generation = await admit(services, request.state.api_key, log, decode, prepare)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        streamed = frames(generation, log.id, log.model, include_usage)
        return await start_stream(request, generation, streamed.frames, streamed.closing)
    try:
        done = await collect(request, generation)
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    return Response(fmt.encoder.encode(render(log, done, generation)), media_type="application/json")


def _chat_body(log: RequestLog, done: Collected, generation: Generation) -> object:
    reason = done.final.finish_reason
    return fmt.chat_completion(log.id, created_now(), log.model, done.text, done.logprobs, reason, usage_of(generation))


def _completion_body(log: RequestLog, done: Collected, generation: Generation) -> object:
    logprobs = fmt.completion_logprobs(done.logprobs, 0)
    reason = done.final.finish_reason
    return fmt.completion(log.id, created_now(), log.model, done.text, logprobs, reason, usage_of(generation))


@post("/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    prepare = service.prepare_chat(services_of(request))
    return await _serve(request, "chat.completions", "chatcmpl-", service.decode_chat, prepare, ChatFrames, _chat_body)


@post("/completions", status_code=200)
async def completions(request: AnyRequest) -> Response[Any]:
    prepare = service.prepare_completion(services_of(request))
    return await _serve(
        request, "completions", "cmpl-", service.decode_completion, prepare, CompletionFrames, _completion_body
    )


def _model_card(services: Services) -> ModelCard:
    info = services.client.model_info
    return ModelCard(
        id=services.model_name or "",
        created=services.started_at,
        owned_by="appliance",
        max_model_len=info.max_model_len if info is not None else None,
    )


@get("/models")
async def list_models(request: AnyRequest) -> Response[Any]:
    services = services_of(request)
    data = [_model_card(services)] if services.model_name else []
    return Response(fmt.encoder.encode(ModelList(data)), media_type="application/json")


@get("/models/{model_id:path}")
async def retrieve_model(request: AnyRequest, model_id: FromPath[str]) -> Response[Any]:
    services = services_of(request)
    service.check_model(services, model_id.lstrip("/"))
    return Response(fmt.encoder.encode(_model_card(services)), media_type="application/json")


openai_router = Router(
    path="/v1",
    route_handlers=[chat_completions, completions, list_models, retrieve_model],
    guards=[api_key_guard],
)
