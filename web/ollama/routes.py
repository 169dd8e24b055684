"""POST /api/chat, /api/generate, /api/embed and /api/embeddings behind the API-key guard (Bearer). Chat and
generate run through the shared generation pipeline (web/generation/pipeline.py), embeddings through
web/embeddings; only the shapes are Ollama's: NDJSON streams by default, errors as {"error": ...}."""

from collections.abc import Callable
from typing import Any, TypeVar

from litestar import Request, Response, Router, post
from litestar.types import Guard

from engine import EmbeddingModelInfo, QueuePosition
from web import deps
from web.backends.protocol import Served
from web.embeddings.service import EmbeddingAsk, serve_embeddings
from web.errors import AppError
from web.generation.intake import read_body
from web.generation.pipeline import Dialect, serve
from web.generation.prompts import Ask, Prompts
from web.generation.run import Generation
from web.generation.stream import Collected
from web.history.record import RequestLog
from web.ollama import service
from web.ollama.errors import error_line
from web.ollama.models import info_routes, resolved
from web.ollama.schemas import (
    ChatLine,
    ChatRequest,
    Embedded,
    GenerateLine,
    GenerateRequest,
    LegacyEmbedded,
    OutMessage,
)
from web.ollama.streaming import ChatFrames, GenerateFrames, chat_reply, encoder, generate_reply, now

AnyRequest = Request[Any, Any, Any]
Body = TypeVar("Body", ChatRequest, GenerateRequest)
NDJSON = "application/x-ndjson"


class _Ollama(Dialect[Body]):
    done = b""  # the line with done true ends the stream
    media_type = NDJSON
    param_names = service.PARAM_NAMES

    def __init__(self, prompts: Prompts) -> None:
        self.prompts = prompts

    def describe(self, body: Body, log: RequestLog) -> bool:
        log.model, log.stream = resolved(self.prompts.router, body.model), body.stream
        return body.stream

    def waiting(self, position: QueuePosition | None) -> bytes:
        return b""  # NDJSON has no comments: a queued client sees the status line, then its first line

    def error_frame(self, error: AppError) -> bytes:
        return error_line(error)


class ChatDialect(_Ollama[ChatRequest]):
    endpoint = "ollama.chat"
    id_prefix = "ollama-chat-"

    def decode(self, raw: bytes) -> ChatRequest:
        return service.decode_chat(raw)

    async def ask(self, body: ChatRequest, served: Served) -> Ask:
        return await service.chat_ask(body, served)

    def frames(self, body: ChatRequest, generation: Generation) -> ChatFrames:
        return ChatFrames(generation)

    async def reply(self, body: ChatRequest, generation: Generation, done: Collected) -> bytes:
        return chat_reply(generation, done.text)


class GenerateDialect(_Ollama[GenerateRequest]):
    endpoint = "ollama.generate"
    id_prefix = "ollama-gen-"

    def decode(self, raw: bytes) -> GenerateRequest:
        return service.decode_generate(raw)

    async def ask(self, body: GenerateRequest, served: Served) -> Ask:
        return await service.generate_ask(body, served)

    def frames(self, body: GenerateRequest, generation: Generation) -> GenerateFrames:
        return GenerateFrames(generation)

    async def reply(self, body: GenerateRequest, generation: Generation, done: Collected) -> bytes:
        return generate_reply(generation, done.text)


def _loaded(model: str, chat: bool) -> Response[Any]:
    """Ollama's answer to a request with nothing to generate (no messages, or an empty prompt): the model is
    loaded (it always is here), done_reason "load"."""
    answer: ChatLine | GenerateLine = (
        ChatLine(model, now(), OutMessage("assistant", ""), True, "load")
        if chat
        else GenerateLine(model, now(), "", True, "load")
    )
    return Response(encoder.encode(answer), media_type="application/json")


@post("/chat", status_code=200)
async def chat(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    body = service.decode_chat(await read_body(request))
    if not body.messages:
        model = resolved(prompts.router, body.model)
        prompts.served(model)
        return _loaded(model, chat=True)
    return await serve(request, ChatDialect(prompts), prompts, gate, ledger, generations)


@post("/generate", status_code=200)
async def generate(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    body = service.decode_generate(await read_body(request))
    if not body.prompt and not body.system:
        model = resolved(prompts.router, body.model)
        prompts.served(model)
        return _loaded(model, chat=False)
    return await serve(request, GenerateDialect(prompts), prompts, gate, ledger, generations)


Decoded = tuple[str, Callable[[EmbeddingModelInfo], EmbeddingAsk]]


@post("/embed", status_code=200)
async def embed(request: AnyRequest, embedder: deps.Embedder, ledger: deps.Ledger) -> Response[Any]:
    def decode(raw: bytes, log: RequestLog) -> Decoded:
        body = service.decode_embed(raw)
        log.model = body.model
        inputs = [body.input] if isinstance(body.input, str) else body.input
        return body.model, lambda _: EmbeddingAsk(inputs, body.dimensions, body.truncate)

    log, info, result = await serve_embeddings(request, embedder, ledger, "ollama.embed", _aliased(decode))
    vectors = [[float(x) for x in row] for row in result.vectors]
    elapsed = int(((log.finished_mono or log.arrival_mono) - log.arrival_mono) * 1e9)
    answer = Embedded(info.name, vectors, elapsed, 0, result.prompt_tokens)
    return Response(encoder.encode(answer), media_type="application/json", headers={"x-request-id": log.id})


@post("/embeddings", status_code=200)
async def embeddings(request: AnyRequest, embedder: deps.Embedder, ledger: deps.Ledger) -> Response[Any]:
    """Ollama's older endpoint: one prompt, one vector (cut to the model's length, as Ollama's was)."""

    def decode(raw: bytes, log: RequestLog) -> Decoded:
        body = service.decode_legacy_embed(raw)
        log.model = body.model
        return body.model, lambda _: EmbeddingAsk([body.prompt], truncate=True)

    log, _, result = await serve_embeddings(request, embedder, ledger, "ollama.embed", _aliased(decode))
    answer = LegacyEmbedded([float(x) for x in result.vectors[0]])
    return Response(encoder.encode(answer), media_type="application/json", headers={"x-request-id": log.id})


def _aliased(decode: Callable[[bytes, RequestLog], Decoded]) -> Callable[[bytes, RequestLog], Decoded]:
    """An Ollama model name with its default tag (name:latest) names the model without it."""

    def aliased(raw: bytes, log: RequestLog) -> Decoded:
        model, ask = decode(raw, log)
        return model.removesuffix(":latest"), ask

    return aliased


def ollama_router(authenticate: Guard) -> Router:
    """Ollama's API under /api: /api/version open (as Ollama's; it says nothing about the models), the rest
    behind `authenticate` (the API-key guard: Ollama's clients send Authorization: Bearer when given headers)."""
    public, guarded = info_routes()
    generating = Router(path="/", route_handlers=[chat, generate, embed, embeddings, *guarded], guards=[authenticate])
    return Router(path="/api", route_handlers=[*public, generating])
