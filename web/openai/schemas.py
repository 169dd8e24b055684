"""msgspec structs for the OpenAI-compatible bodies: requests as clients send them, responses and SSE chunks
as OpenAI returns them. Unknown request fields are ignored, as OpenAI's own API does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from engine import MAX_LOGPROBS

# Every limit of a request body is declared here, once: msgspec enforces it while decoding, and the OpenAPI
# document (web/system/openapi.py) is generated from these declarations. A field marked UNSUPPORTED names a
# feature this server lacks: a value beyond its declared one is refused as unsupported_parameter.
UNSUPPORTED: dict[str, Any] = {"unsupported": True}

# model and user are kept in every history row: a longer one is refused, not stored.
Name = Annotated[str, Meta(max_length=256)]
# vLLM takes 5.0 for 5 (clients that compute a count send floats): an integral float is a count too, documented
# as an integer (max_tokens_schema); web/openai/service.py turns it into the int.
MaxTokens = Annotated[int, Meta(ge=1)] | Annotated[float, Meta(ge=1, multiple_of=1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
NoPenalty = Annotated[float, Meta(ge=0, le=0, extra=UNSUPPORTED, description="only 0: penalties are not supported")]
NoTools = Annotated[list[Any], Meta(max_length=0, extra=UNSUPPORTED, description="tools are not supported")]

# Chat roles as the chat template takes them: developer is OpenAI's newer name for system. tool and function
# messages are unsupported (no tool calling); the rest are not roles at all.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
UNSUPPORTED_ROLES = ("tool", "function")


class ContentPart(Struct, kw_only=True):
    type: Annotated[Literal["text"], Meta(extra=UNSUPPORTED, description="only text parts")]
    text: str


Content = str | list[ContentPart]


class ChatMessage(Struct, kw_only=True):
    role: str  # one of ROLES: checked by web/openai/service.py, which tells unsupported roles from unknown ones
    content: Content | None = None
    name: str | None = None
    tool_calls: Annotated[list[Any], Meta(max_length=0, extra=UNSUPPORTED)] | None = None


Messages = Annotated[list[ChatMessage], Meta(min_length=1)]


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class TextFormat(Struct, kw_only=True):
    type: Literal["text"] = "text"


class _SamplingFields(Struct, kw_only=True):
    """Fields the two endpoints share."""

    model: Name
    max_tokens: MaxTokens | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Meta(ge=1, le=1, description="one choice per request")] | None = None
    user: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: NoPenalty | None = None
    frequency_penalty: NoPenalty | None = None
    logit_bias: Annotated[dict[str, float], Meta(max_length=0, extra=UNSUPPORTED)] | None = None
    ignore_eos: bool = False  # vLLM's extension: benchmarks need every request to run to max_tokens


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Messages
    # OpenAI's newer name for max_tokens: one parameter, so its refusals name max_tokens.
    max_completion_tokens: Annotated[MaxTokens, Meta(extra={"reported_as": "max_tokens"})] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[TopLogprobs, Meta(description="needs logprobs: true")] | None = None
    tools: NoTools | None = None
    tool_choice: Annotated[Literal["none"], Meta(extra=UNSUPPORTED)] | None = None
    functions: NoTools | None = None
    response_format: Annotated[TextFormat, Meta(extra=UNSUPPORTED)] | None = None


def message_schema(generated: dict[str, Any]) -> dict[str, Any]:
    """A chat message's document from msgspec's (ROLES is checked by web/openai/service.py): msgspec cannot say
    that every role but the assistant's needs content."""
    props = generated["properties"]
    content = {"anyOf": [t for t in props["content"]["anyOf"] if t != {"type": "null"}]}
    speakers = {"enum": [r for r in ROLES if r != "assistant"]}
    speaker = {
        **generated,
        "required": ["role", "content"],
        "properties": {**props, "role": speakers, "content": content},
    }
    assistant = {**generated, "required": ["role"], "properties": {**props, "role": {"const": "assistant"}}}
    return {"anyOf": [speaker, assistant]}


def prompt_schema(vocab: int | None) -> dict[str, Any]:
    """A completion's prompt: a string, token ids (below the vocabulary size, where known), or a batch of one of
    those (a batch of more is refused as such). msgspec cannot type it: it takes no union of two list types."""
    token = {"type": "integer", "minimum": 0} | ({"maximum": vocab - 1} if vocab else {})
    text = {"type": "string", "minLength": 1}
    tokens = {"type": "array", "minItems": 1, "items": token}
    one = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [text, tokens]}}
    return {"anyOf": [text, tokens, one]}


def max_tokens_schema(maximum: int | None) -> dict[str, Any]:
    """A token count's document: JSON Schema's integer already takes 5.0 (a number with no fraction), which is
    what MaxTokens decodes; msgspec would document its float branch as any number."""
    count = {"type": "integer", "minimum": 1} | ({"maximum": maximum} if maximum else {})
    return {"anyOf": [count, {"type": "null"}], "default": None}


# stream_options means something only for a stream: OpenAI and vLLM refuse it otherwise (web/openai/service.py).
STREAM_OPTIONS_NEED_STREAM = {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[Any]  # its document: prompt_schema
    logprobs: TopLogprobs | None = None
    echo: Annotated[Literal[False], Meta(extra=UNSUPPORTED)] = False
    suffix: Annotated[Literal[""], Meta(extra=UNSUPPORTED)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=1)] | None = None


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
