"""POST /v1/embeddings in OpenAI's shape: `input` as a text, texts, token ids or token-id lists; vectors as
floats or base64 (little-endian float32, what the openai SDK asks for by default); usage counts the input's
tokens. The request runs through web/embeddings (admitted, embedded, settled like any other)."""

import base64
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from litestar import Request, Response, post
from msgspec import Meta, Struct

from engine import EmbeddingModelInfo, Embeddings
from web import deps
from web.embeddings.service import EmbeddingAsk, serve_embeddings
from web.errors import InvalidRequest
from web.generation.decoding import BodyDecoder, Name
from web.history.record import RequestLog

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request
INPUT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {"type": "string", "minLength": 1}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_INPUTS,
            "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        },
    ]
}
_SHAPE = "input must be a non-empty text, a list of them, a list of token ids, or a list of token-id lists"


class EmbeddingRequest(Struct, kw_only=True):
    input: str | list[Any]  # one of INPUT_SCHEMA's shapes (msgspec takes one array type in a union)
    model: Name
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: Name | None = None


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingList(Struct):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


decode_embedding = BodyDecoder(EmbeddingRequest)
_encoder = msgspec.json.Encoder()


def inputs_of(value: str | list[Any]) -> list[str | list[int]]:
    """The body's input as a list of texts or token-id lists, or a refusal naming `input`."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif value and all(_is_id(t) for t in value):
        items = [list(value)]
    else:
        items = list(value)
    if not items or len(items) > MAX_INPUTS:
        raise InvalidRequest(f"{_SHAPE}; from 1 to {MAX_INPUTS} inputs", param="input")
    for i, item in enumerate(items):
        text = isinstance(item, str) and item != ""
        ids = isinstance(item, list) and item != [] and all(_is_id(t) for t in item)
        if not (text or ids):
            raise InvalidRequest(f"{_SHAPE} (input[{i}] is none of those)", param="input")
    return items


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def embedding_list(result: Embeddings, model: str, encoding: str) -> bytes:
    data = [EmbeddingData(i, _encoded(row, encoding)) for i, row in enumerate(result.vectors)]
    usage = EmbeddingUsage(result.prompt_tokens, result.prompt_tokens)
    return _encoder.encode(EmbeddingList(data, model, usage))


def _encoded(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode()
    return [float(x) for x in row]


@post("/embeddings", status_code=200)
async def create_embeddings(
    request: Request[Any, Any, Any], embedder: deps.Embedder, ledger: deps.Ledger
) -> Response[Any]:
    encoding = "float"

    def decode(raw: bytes, log: RequestLog) -> tuple[str, Callable[[EmbeddingModelInfo], EmbeddingAsk]]:
        nonlocal encoding
        body = decode_embedding(raw)
        log.model, log.user, encoding = body.model, body.user, body.encoding_format
        return body.model, lambda _: EmbeddingAsk(inputs_of(body.input), body.dimensions)

    log, info, result = await serve_embeddings(request, embedder, ledger, "embeddings", decode)
    content = embedding_list(result, info.name, encoding)
    return Response(content, media_type="application/json", headers={"x-request-id": log.id})
