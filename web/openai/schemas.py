"""msgspec structs for the OpenAI-compatible bodies: requests as clients send them, responses and SSE chunks
as OpenAI returns them. Unknown request fields are ignored, as OpenAI's own API does."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

# model and user are kept in every history row: a longer one is refused, not stored.
Name = Annotated[str, Meta(max_length=256)]


class ContentPart(Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class _SamplingFields(Struct, kw_only=True):
    """Fields the two endpoints share."""

    model: Name
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False  # vLLM's extension: benchmarks need every request to run to max_tokens


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    # A string, token ids, or a batch of either; the batch forms are accepted only with one element.
    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


# -- responses ----------------------------------------------------------------------------------------------


class UsageBody(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprobBody(Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobBody(Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobBody]


class ChatLogprobsBody(Struct):
    content: list[TokenLogprobBody]


class CompletionLogprobsBody(Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class AssistantMessage(Struct):
    role: str
    content: str


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobsBody | None
    finish_reason: str | None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageBody
    object: str = "chat.completion"


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobsBody | None
    finish_reason: str | None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: UsageBody | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobsBody | None
    finish_reason: str | None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: UsageBody | None = None


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str
    max_model_len: int | None = None
    object: str = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


encoder = msgspec.json.Encoder()
