"""The /v1 routes: chat completions, completions and models, behind the API-key guard."""

from typing import Any, TypeVar

from litestar import Request, Response, Router, get, post
from litestar.params import FromPath
from litestar.types import Guard

from web import deps
from web.backends.protocol import Served
from web.errors import AppError
from web.generation.pipeline import Dialect, serve
from web.generation.prompts import Ask, model_refusal
from web.generation.run import Generation
from web.generation.stream import Collected
from web.history.record import RequestLog
from web.openai import formatting as fmt
from web.openai import service
from web.openai.embeddings import create_embeddings
from web.openai.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from web.openai.streaming import ChatFrames, CompletionFrames, created_now, usage_of
from web.openai.tools import chat_choice

AnyRequest = Request[Any, Any, Any]
Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)


class _OpenAI(Dialect[Body]):
    """What both endpoints share: the history row's fields, the stream's frames, the error event, [DONE], the
    fingerprint."""

    done = fmt.DONE

    def __init__(self, fingerprint: str | None) -> None:
        self.fingerprint = fingerprint

    def describe(self, body: Body, log: RequestLog) -> bool:
        log.model, log.stream, log.user = body.model, body.stream, body.user
        return body.stream

    def error_frame(self, error: AppError) -> bytes:
        return fmt.sse_error(error)

    def frames(self, body: Body, generation: Generation) -> ChatFrames | CompletionFrames:
        log = generation.log
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        frames = ChatFrames if isinstance(body, ChatCompletionRequest) else CompletionFrames
        return frames(generation, log.id, log.model, include_usage, self.fingerprint)


class ChatDialect(_OpenAI[ChatCompletionRequest]):
    endpoint = "chat.completions"
    id_prefix = "chatcmpl-"

    def decode(self, raw: bytes) -> ChatCompletionRequest:
        return service.decode_chat(raw)

    async def ask(self, body: ChatCompletionRequest, served: Served) -> Ask:
        return await service.chat_ask(body, served)

    async def reply(self, body: ChatCompletionRequest, generation: Generation, done: Collected) -> bytes:
        log, tools = generation.log, generation.tools
        choices = [chat_choice(i, c.text, c.logprobs, c.final.finish_reason, tools) for i, c in enumerate(done.choices)]
        usage = usage_of(generation)
        return fmt.encoder.encode(
            fmt.chat_completion(log.id, created_now(), log.model, choices, usage, self.fingerprint)
        )


class CompletionDialect(_OpenAI[CompletionRequest]):
    endpoint = "completions"
    id_prefix = "cmpl-"

    def decode(self, raw: bytes) -> CompletionRequest:
        return service.decode_completion(raw)

    async def ask(self, body: CompletionRequest, served: Served) -> Ask:
        return await service.completion_ask(body, served)

    async def reply(self, body: CompletionRequest, generation: Generation, done: Collected) -> bytes:
        log = generation.log
        choices = [
            fmt.completion_choice(i, c.text, fmt.completion_logprobs(c.logprobs, 0), c.final.finish_reason)
            for i, c in enumerate(done.choices)
        ]
        usage = usage_of(generation)
        return fmt.encoder.encode(fmt.completion(log.id, created_now(), log.model, choices, usage, self.fingerprint))


@post("/chat/completions", status_code=200)
async def chat_completions(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    dialect = ChatDialect(fmt.system_fingerprint(gate.client.model_info))
    return await serve(request, dialect, prompts, gate, ledger, generations)


@post("/completions", status_code=200)
async def completions(
    request: AnyRequest, prompts: deps.Prompts, gate: deps.Gate, ledger: deps.Ledger, generations: deps.Generations
) -> Response[Any]:
    dialect = CompletionDialect(fmt.system_fingerprint(gate.client.model_info))
    return await serve(request, dialect, prompts, gate, ledger, generations)


def _model_cards(gate: deps.Gate, router: deps.Router, embedder: deps.Embedder) -> list[ModelCard]:
    """The union of the models the backends serve now, the local engine's while it loads, and the embedding
    model once it is ready."""
    names = router.model_names()
    if router.embedded is not None and gate.model_name and gate.model_name not in names:
        names.insert(0, gate.model_name)
    cards = []
    for name in names:
        served = router.served(name)
        info = served.info if served is not None else gate.client.model_info
        context = info.max_model_len if info is not None else None
        cards.append(ModelCard(id=name, created=gate.started_at, owned_by="appliance", max_model_len=context))
    embedding = embedder.info
    if embedding is not None and embedding.name not in names:
        cards.append(ModelCard(embedding.name, gate.started_at, "appliance", embedding.max_input_tokens))
    return cards


@get("/models")
async def list_models(gate: deps.Gate, router: deps.Router, embedder: deps.Embedder) -> Response[Any]:
    cards = _model_cards(gate, router, embedder)
    return Response(fmt.encoder.encode(ModelList(cards)), media_type="application/json")


@get("/models/{model_id:path}")
async def retrieve_model(
    gate: deps.Gate, router: deps.Router, embedder: deps.Embedder, model_id: FromPath[str]
) -> Response[Any]:
    name = model_id.lstrip("/")
    card = next((c for c in _model_cards(gate, router, embedder) if c.id == name), None)
    if card is None:
        raise model_refusal(router, name)
    return Response(fmt.encoder.encode(card), media_type="application/json")


def openai_router(authenticate: Guard) -> Router:
    """The /v1 API behind `authenticate` (the API-key guard)."""
    return Router(
        path="/v1",
        route_handlers=[chat_completions, completions, create_embeddings, list_models, retrieve_model],
        guards=[authenticate],
    )
