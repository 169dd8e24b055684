"""The small typed structs between the embedding process and its client (msgspec, msgpack); vectors travel as
float32 bytes, not as lists of floats."""

from __future__ import annotations

import msgspec


class EmbeddingModelInfo(msgspec.Struct, frozen=True):
    """The served embedding model. max_input_tokens: the most tokens one input may have (the model's own special
    tokens not counted); matryoshka: whether a request may ask for fewer dimensions."""

    name: str
    dimensions: int
    max_input_tokens: int
    pooling: str
    normalized: bool
    matryoshka: bool


# -- client -> embedding process --------------------------------------------------------------------------


class EmbedRequest(msgspec.Struct, tag="embed"):
    request_id: int
    inputs: list[str | list[int]]
    truncate: bool = False


class StopEmbedding(msgspec.Struct, tag="stop"):
    pass


# -- embedding process -> client --------------------------------------------------------------------------


class EmbedderReady(msgspec.Struct, tag="ready"):
    info: EmbeddingModelInfo


class EmbedderFailed(msgspec.Struct, tag="failed"):
    message: str


class Embedded(msgspec.Struct, tag="embedded"):
    """vectors: len(token_counts) rows of float32, row-major, native byte order."""

    request_id: int
    vectors: bytes
    token_counts: list[int]


class EmbedRefused(msgspec.Struct, tag="refused"):
    """kind: "context_length", "invalid", or "error" (the encoder itself failed)."""

    request_id: int
    kind: str
    message: str
    param: str | None = None


ToEmbedder = EmbedRequest | StopEmbedding
FromEmbedder = EmbedderReady | EmbedderFailed | Embedded | EmbedRefused
