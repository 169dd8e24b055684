"""The /v1 routes: chat completions, completions and models, behind the API-key guard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from litestar import Request, Response, Router, get, post
from litestar.params import FromPath
from litestar.types import Guard

from web import deps
from web.errors import AppError
from web.generation.disconnect import ClientDisconnected
from web.generation.gate import EngineGate
from web.generation.intake import new_log, read_body
from web.generation.policy import Prepared
from web.generation.run import Generation, Generations
from web.history.record import RequestLog
from web.keys.service import KeyInfo
from web.ledger import Ledger
from web.openai import decoding, service
from web.openai import formatting as fmt
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
from web.openai.tools import chat_choice

AnyRequest = Request[Any, Any, Any]


Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)
Prepare = Callable[[Body, KeyInfo], Awaitable[Prepared]]


@dataclass(frozen=True, slots=True)
class Endpoint(Generic[Body]):
    """What differs between the two completion endpoints: their body, their frames, their final JSON."""

    name: str
    id_prefix: str
    decode: Callable[[bytes], Body]
    frames: Callable[[Generation, str, str, bool, str | None], ChatFrames | CompletionFrames]
    render: Callable[[RequestLog, Collected, Generation, str | None], object]


REQUEST_ID = "x-request-id"


@contextmanager
def _named_refusals(log: RequestLog) -> Iterator[None]:
    """A refusal of a request that has a history row names the row, as its answers do (x-request-id)."""
    try:
        yield
    except AppError as exc:
        exc.headers[REQUEST_ID] = log.id
        raise


def _named(response: Response[Any], log: RequestLog) -> Response[Any]:
    response.headers[REQUEST_ID] = log.id
    return response


async def _serve(
    request: AnyRequest,
    endpoint: Endpoint[Body],
    prepare: Prepare[Body],
    gate: EngineGate,
    ledger: Ledger,
    generations: Generations,
) -> Response[Any]:
    """decode -> the key's policy -> one prepared value -> admitted (quota reserved, row written) and started on
    the engine -> streamed or collected; the Generation settles the ledger when it closes."""
    key: KeyInfo = request.state.api_key
    log = new_log(request, endpoint.name, endpoint.id_prefix)
    with _named_refusals(log):
        async with ledger.refusals(log):
            body = endpoint.decode(await read_body(request))
            log.model, log.stream, log.user = body.model, body.stream, body.user
            gate.check()
            prepared = await prepare(body, key)
            generation = await generations.admit(log, key, prepared)
        fingerprint = fmt.system_fingerprint(gate.client.model_info)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streamed = endpoint.frames(generation, log.id, log.model, include_usage, fingerprint)
            return _named(await start_stream(request, generation, streamed.frames, streamed.closing), log)
        try:
            done = await collect(request, generation)
        except ClientDisconnected:
            return _named(Response(b"", status_code=CLIENT_CLOSED), log)
    body_json = fmt.encoder.encode(endpoint.render(log, done, generation, fingerprint))
    return _named(Response(body_json, media_type="application/json"), log)


def _chat_body(log: RequestLog, done: Collected, generation: Generation, fingerprint: str | None) -> object:
    choices = [
        chat_choice(i, c.text, c.logprobs, c.final.finish_reason, generation.tools) for i, c in enumerate(done.choices)
    ]
    return fmt.chat_completion(log.id, created_now(), log.model, choices, usage_of(generation), fingerprint)


def _completion_body(log: RequestLog, done: Collected, generation: Generation, fingerprint: str | None) -> object:
    choices = [
        fmt.completion_choice(i, c.text, fmt.completion_logprobs(c.logprobs, 0), c.final.finish_reason)
        for i, c in enumerate(done.choices)
    ]
    return fmt.completion(log.id, created_now(), log.model, choices, usage_of(generation), fingerprint)


CHAT = Endpoint("chat.completions", "chatcmpl-", decoding.decode_chat, ChatFrames, _chat_body)
COMPLETIONS = Endpoint("completions", "cmpl-", decoding.decode_completion, CompletionFrames, _completion_body)


@post("/chat/completions", status_code=200)
async def chat_completions(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    return await _serve(request, CHAT, prompts.chat, gate, ledger, generations)


@post("/completions", status_code=200)
async def completions(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    return await _serve(request, COMPLETIONS, prompts.completion, gate, ledger, generations)


def _model_cards(gate: deps.Gate, router: deps.Router) -> list[ModelCard]:
    """The union of the models the backends serve now, and the local engine's while it loads."""
    names = router.model_names()
    if router.embedded is not None and gate.model_name and gate.model_name not in names:
        names.insert(0, gate.model_name)
    cards = []
    for name in names:
        served = router.served(name)
        info = served.info if served is not None else gate.client.model_info
        context = info.max_model_len if info is not None else None
        cards.append(ModelCard(id=name, created=gate.started_at, owned_by="appliance", max_model_len=context))
    return cards


@get("/models")
async def list_models(gate: deps.Gate, router: deps.Router) -> Response[Any]:
    return Response(fmt.encoder.encode(ModelList(_model_cards(gate, router))), media_type="application/json")


@get("/models/{model_id:path}")
async def retrieve_model(gate: deps.Gate, router: deps.Router, model_id: FromPath[str]) -> Response[Any]:
    name = model_id.lstrip("/")
    card = next((c for c in _model_cards(gate, router) if c.id == name), None)
    if card is None:
        raise service.model_refusal(router, name)
    return Response(fmt.encoder.encode(card), media_type="application/json")


def openai_router(authenticate: Guard) -> Router:
    """The /v1 API behind `authenticate` (the API-key guard)."""
    return Router(
        path="/v1",
        route_handlers=[chat_completions, completions, list_models, retrieve_model],
        guards=[authenticate],
    )
