"""POST /v1/responses, GET and DELETE /v1/responses/{id}, behind the API-key guard. A response runs through the
shared generation pipeline (web/generation/pipeline.py); only its shapes are the Responses API's. Stored answers
(web/history/stored.py) are read and deleted only by the key that created them."""

import time
from typing import Any, ClassVar

import msgspec
from litestar import Request, Response, Router, delete, get, post
from litestar.params import FromPath
from litestar.types import Guard

from web import deps
from web.backends.protocol import Served
from web.errors import AppError
from web.generation.pipeline import Dialect, serve
from web.generation.prompts import Ask
from web.generation.run import Generation
from web.generation.stream import Collected
from web.history.record import RequestLog
from web.history.stored import ResponseStore
from web.responses import service
from web.responses.objects import Deleted, ResponseBody, encoder
from web.responses.output import Output, ending, usage_of
from web.responses.schemas import FunctionChoice, ResponsesRequest, TextFormatText
from web.responses.streaming import ResponseFrames
from web.tools import ToolSpec

AnyRequest = Request[Any, Any, Any]


class ResponsesDialect(Dialect[ResponsesRequest]):
    endpoint = "responses"
    id_prefix = "resp_"
    done = b""  # response.completed ends the stream
    param_names: ClassVar[dict[str, str]] = {"max_tokens": "max_output_tokens"}

    def __init__(self, store: ResponseStore, key_id: int) -> None:
        self.store, self.key_id = store, key_id
        self.created_at = int(time.time())
        self.messages: list[dict[str, Any]] = []  # the conversation so far, instructions apart
        self.body: ResponsesRequest | None = None
        self.log: RequestLog | None = None
        self.stream: ResponseFrames | None = None

    def decode(self, raw: bytes) -> ResponsesRequest:
        return service.decode_body(raw)

    def describe(self, body: ResponsesRequest, log: RequestLog) -> bool:
        log.model, log.stream, log.user = body.model, body.stream, body.user
        self.body, self.log = body, log
        return body.stream

    async def ask(self, body: ResponsesRequest, served: Served) -> Ask:
        prior = []
        if body.previous_response_id is not None:
            prior = await self.store.conversation(body.previous_response_id, self.key_id)
        self.messages = service.conversation(body, prior)
        return await service.response_ask(body, served, self.messages)

    def frames(self, body: ResponsesRequest, generation: Generation) -> ResponseFrames:
        self.stream = ResponseFrames(generation, lambda status, out: self.snapshot(generation, status, out), self.keep)
        return self.stream

    def error_frame(self, error: AppError) -> bytes:
        assert self.stream is not None  # a stream's refusal comes once its frames exist
        return self.stream.failed(error)

    async def reply(self, body: ResponsesRequest, generation: Generation, done: Collected) -> bytes:
        status, _ = ending(done.final)
        output = Output(generation.tools)
        output.feed(done.text)
        output.finish(status)
        response = self.snapshot(generation, status, output)
        await self.keep(response, output)
        return encoder.encode(response)

    def snapshot(self, generation: Generation, status: str, output: Output) -> ResponseBody:
        """The response object as it stands: usage and incomplete_details once it has ended."""
        body, log = self.body, generation.log
        assert body is not None
        ended = status in ("completed", "incomplete")
        choice = body.tool_choice
        form = body.text.format if body.text and body.text.format else TextFormatText()
        return ResponseBody(
            id=log.id,
            created_at=self.created_at,
            model=log.model,
            status=status,
            output=list(output.items) if ended or status == "failed" else [],
            usage=usage_of(log) if ended else None,
            incomplete_details=ending(generation.final)[1] if ended else None,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            metadata=dict(body.metadata or {}),
            parallel_tool_calls=generation.tools.parallel,
            previous_response_id=body.previous_response_id,
            store=body.store and self.store.store_text,
            temperature=body.temperature,
            top_p=body.top_p,
            text={"format": msgspec.to_builtins(form)},
            tool_choice=msgspec.to_builtins(choice) if isinstance(choice, FunctionChoice) else choice or "auto",
            tools=[_tool(t) for t in generation.tools.tools],
            user=body.user,
        )

    async def keep(self, response: ResponseBody, output: Output) -> None:
        if response.store:
            conversation = [*self.messages, output.assistant_turn()]
            await self.store.keep(response.id, self.key_id, encoder.encode(response), conversation)


def _tool(spec: ToolSpec) -> dict[str, Any]:
    """A function tool as the response echoes it (its arguments follow the schema when a choice forces it)."""
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": dict(spec.parameters),
        "strict": True,
    }


@post("/responses", status_code=200)
async def create_response(
    request: AnyRequest,
    prompts: deps.Prompts,
    gate: deps.Gate,
    ledger: deps.Ledger,
    generations: deps.Generations,
    responses: deps.Responses,
) -> Response[Any]:
    dialect = ResponsesDialect(responses, request.state.api_key.id)
    return await serve(request, dialect, prompts, gate, ledger, generations)


@get("/responses/{response_id:str}")
async def retrieve_response(
    request: AnyRequest, responses: deps.Responses, response_id: FromPath[str]
) -> Response[Any]:
    body = await responses.body(response_id, request.state.api_key.id)
    return Response(body, media_type="application/json")


@delete("/responses/{response_id:str}", status_code=200)
async def delete_response(request: AnyRequest, responses: deps.Responses, response_id: FromPath[str]) -> Response[Any]:
    await responses.delete(response_id, request.state.api_key.id)
    return Response(encoder.encode(Deleted(response_id)), media_type="application/json")


def responses_router(authenticate: Guard) -> Router:
    """The Responses API behind `authenticate` (the API-key guard)."""
    return Router(
        path="/v1", route_handlers=[create_response, retrieve_response, delete_response], guards=[authenticate]
    )
