"""msgspec structs for the OpenAI-compatible bodies: requests as clients send them, responses and SSE chunks
as OpenAI returns them. Unknown request fields are ignored, as OpenAI's own API does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from engine import MAX_LOGPROBS
from web.generation.decoding import TOP_K_MAX, Name
from web.openai.tool_schemas import MAX_TOOLS, NamedToolChoice, ToolCallBody, ToolCallDeltaBody, ToolCallIn, ToolDef

# Every limit of a request body is declared here, once: msgspec enforces it while decoding, and the OpenAPI
# document (web/system/openapi.py) is generated from these declarations. A field marked UNSUPPORTED names a
# feature this server lacks: a value beyond its declared one is refused as unsupported_parameter.
UNSUPPORTED: dict[str, Any] = {"unsupported": True}

# vLLM takes 5.0 for 5 (clients that compute a count send floats): an integral float is a count too, documented
# as an integer (web/openai/document.py); web/openai/service.py turns it into the int.
MaxTokens = Annotated[int, Meta(ge=1)] | Annotated[float, Meta(ge=1, multiple_of=1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
Penalty = Annotated[float, Meta(ge=-2, le=2, description="OpenAI's: over the tokens generated so far")]
# n choices run as n engine requests on one prompt: the bound keeps one request from taking a batch's seats.
MAX_CHOICES = 8
# -1 is vLLM's "off".
TopK = Annotated[int, Meta(ge=-1, le=TOP_K_MAX)]
# OpenAI's logit_bias: token ids as decimal strings (web/generation/prompts.py checks them against the vocabulary).
LogitBias = Annotated[
    dict[Annotated[str, Meta(pattern="^(0|[1-9][0-9]{0,11})$")], Annotated[float, Meta(ge=-100, le=100)]],
    Meta(max_length=300, description="token id (a decimal string below the vocabulary size) to a bias on its logit"),
]
# chat_template_kwargs reach the model's Jinja template beside the messages: identifiers with scalar values,
# never a name the template call or its variables already use (RESERVED_TEMPLATE_NAMES; *_token too).
TemplateName = Annotated[str, Meta(pattern="^[A-Za-z][A-Za-z0-9_]{0,63}$")]
TemplateValue = Annotated[str, Meta(max_length=1024)] | int | float | bool | None
TemplateKwargs = Annotated[dict[TemplateName, TemplateValue], Meta(max_length=16)]
RESERVED_TEMPLATE_NAMES = frozenset(
    (
        "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "raise_exception",
        "strftime_now",
    )
)  # fmt: skip
NoFunctions = Annotated[
    list[Any], Meta(max_length=0, extra=UNSUPPORTED, description="deprecated by OpenAI: send tools instead")
]

# Chat roles as the chat template takes them: developer is OpenAI's newer name for system. function messages
# (the deprecated functions API) are unsupported; the rest are not roles at all.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
UNSUPPORTED_ROLES = ("function",)


class TextPart(Struct, kw_only=True, tag_field="type", tag="text"):
    text: str


# Parts a multimodal model takes: named here so that they are refused as unsupported (this model is text-only,
# web/openai/service.py), not as unknown; their payloads are not read.
class ImagePart(Struct, tag_field="type", tag="image_url"):
    pass


class AudioPart(Struct, tag_field="type", tag="input_audio"):
    pass


class FilePart(Struct, tag_field="type", tag="file"):
    pass


ContentPart = TextPart | ImagePart | AudioPart | FilePart
Content = str | list[ContentPart]


class ChatMessage(Struct, kw_only=True):
    role: str  # one of ROLES: checked by web/openai/service.py, which tells unsupported roles from unknown ones
    content: Content | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCallIn], Meta(max_length=MAX_TOOLS)] | None = None
    tool_call_id: Annotated[str, Meta(max_length=256)] | None = None  # a tool message's: the call it answers


Messages = Annotated[list[ChatMessage], Meta(min_length=1)]


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class TextFormat(Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(Struct, kw_only=True):
    name: Name
    description: str | None = None
    schema: dict[str, Any] | None = None  # None: any JSON object; the engine's validate_guided judges the rest
    strict: bool | None = None  # the output always follows the schema: strict or not, it is enforced


class JsonSchemaFormat(Struct, kw_only=True, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class _SamplingFields(Struct, kw_only=True):
    """Fields the two endpoints share."""

    model: Name
    max_tokens: MaxTokens | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: TopK | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    user: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None  # vLLM's; its upper bound is the engine's
    response_format: ResponseFormat | None = None  # vLLM takes it on completions too
    ignore_eos: bool = False  # vLLM's extension: benchmarks need every request to run to max_tokens


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Messages
    # OpenAI's newer name for max_tokens: one parameter, so its refusals name max_tokens.
    max_completion_tokens: Annotated[MaxTokens, Meta(extra={"reported_as": "max_tokens"})] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[TopLogprobs, Meta(description="needs logprobs: true")] | None = None
    tools: Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # default true, as OpenAI's
    functions: NoFunctions | None = None
    chat_template_kwargs: TemplateKwargs | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[Any]  # its document: web/openai/document.py prompt_schema
    logprobs: TopLogprobs | None = None
    echo: Annotated[Literal[False], Meta(extra=UNSUPPORTED)] = False
    suffix: Annotated[Literal[""], Meta(extra=UNSUPPORTED)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=1)] | None = None


# -- responses ----------------------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int  # prompt tokens the prefix cache held (0 without a hit)


class UsageBody(Struct):
    prompt_tokens: int
    completion_tokens: int  # all choices together, as OpenAI bills n > 1
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


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


class AssistantMessage(Struct, omit_defaults=True):
    role: str
    content: str | None  # None when the answer is only tool calls, as OpenAI's
    tool_calls: list[ToolCallBody] | None = None


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
    system_fingerprint: str | None = None


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDeltaBody] | None = None


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
    system_fingerprint: str | None = None


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
    system_fingerprint: str | None = None


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
