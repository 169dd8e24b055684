"""The /v1 routes: chat completions, completions and models, behind the API-key guard."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath

from web.errors import InvalidRequest, PayloadTooLarge
from web.generation.admission import admit
from web.generation.disconnect import ClientDisconnected
from web.history.record import RequestLog
from web.keys.guard import api_key_guard
from web.openai import formatting as fmt
from web.openai import service
from web.openai.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from web.openai.streaming import (
    CLIENT_CLOSED,
    ChatFrames,
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


@post("/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    services = services_of(request)
    log = _new_log(request, "chat.completions", "chatcmpl-")

    async def decode() -> ChatCompletionRequest:
        body = service.decode_chat(await _read_body(request))
        log.model, log.stream, log.user = body.model, body.stream, body.user
        return body

    body, generation = await admit(services, request.state.api_key, log, decode, service.prepare_chat(services))
    model = log.model
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chat_frames = ChatFrames(generation, log.id, model, include_usage)
        return await start_stream(request, generation, chat_frames.frames, chat_frames.closing)
    try:
        done = await collect(request, generation)
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    result = fmt.chat_completion(
        log.id, created_now(), model, done.text, done.logprobs, done.final.finish_reason, usage_of(generation)
    )
    return Response(fmt.encoder.encode(result), media_type="application/json")


@post("/completions", status_code=200)
async def completions(request: AnyRequest) -> Response[Any]:
    services = services_of(request)
    log = _new_log(request, "completions", "cmpl-")

    async def decode() -> CompletionRequest:
        body = service.decode_completion(await _read_body(request))
        log.model, log.stream, log.user = body.model, body.stream, body.user
        return body

    body, generation = await admit(services, request.state.api_key, log, decode, service.prepare_completion(services))
    model = log.model
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        completion_frames = CompletionFrames(generation, log.id, model, include_usage)
        return await start_stream(request, generation, completion_frames.frames, completion_frames.closing)
    try:
        done = await collect(request, generation)
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    logprobs = fmt.completion_logprobs(done.logprobs, 0)
    result = fmt.completion(
        log.id, created_now(), model, done.text, logprobs, done.final.finish_reason, usage_of(generation)
    )
    return Response(fmt.encoder.encode(result), media_type="application/json")


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
