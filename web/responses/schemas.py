"""msgspec structs for the Responses API's request body as OpenAI's clients (the openai SDK, Codex) send it. Input
items and content parts are tagged by `type` (a message item may leave it out: web/responses/service.py fills it
in); tools are read one by one (hosted tools are ignored, namespace groups flattened). Unknown fields are ignored,
as OpenAI's own API does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from web.generation.decoding import TOP_K_MAX, Name

UNSUPPORTED: dict[str, Any] = {"unsupported": True}
FunctionName = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$", description="OpenAI's function names")]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]
ItemId = Annotated[str, Meta(max_length=256)]
ResponseId = Annotated[str, Meta(min_length=1, max_length=64)]
MAX_ITEMS = 4096
MAX_TOOLS = 128


class InputText(Struct, tag="input_text", tag_field="type", kw_only=True):
    text: str


class OutputText(Struct, tag="output_text", tag_field="type", kw_only=True):
    """An earlier answer's text, sent back in an assistant message."""

    text: str
    annotations: list[Any] | None = None


class Refusal(Struct, tag="refusal", tag_field="type", kw_only=True):
    refusal: str


# Parts a multimodal model takes: named so that they are refused as unsupported (a text-only model), not unknown.
class InputImage(Struct, tag="input_image", tag_field="type", kw_only=True):
    pass


class InputFile(Struct, tag="input_file", tag_field="type", kw_only=True):
    pass


class InputAudio(Struct, tag="input_audio", tag_field="type", kw_only=True):
    pass


Part = InputText | OutputText | Refusal | InputImage | InputFile | InputAudio


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: ItemId | None = None
    status: str | None = None


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    """A call an earlier answer made, sent back: its arguments are a JSON object as text."""

    call_id: CallId
    name: FunctionName
    arguments: str
    id: ItemId | None = None
    status: str | None = None


class FunctionCallOutputItem(Struct, tag="function_call_output", tag_field="type", kw_only=True):
    """The client's result of a call: text, or text parts."""

    call_id: CallId
    output: str | list[Part]
    id: ItemId | None = None
    status: str | None = None


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """Another model's reasoning sent back (Codex does): this model has none to continue, so it is dropped."""

    id: ItemId | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(Struct, kw_only=True):
    """The flat function tool of the Responses API (chat's nests it under `function`)."""

    type: Literal["function"]
    name: FunctionName
    description: Annotated[str, Meta(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a forced choice follows the schema either way; auto parses what the model says


class FunctionChoice(Struct, kw_only=True):
    type: Literal["function"]
    name: FunctionName


class TextFormatText(Struct, tag="text", tag_field="type", kw_only=True):
    pass


class JsonObjectFormat(Struct, tag="json_object", tag_field="type", kw_only=True):
    pass


class JsonSchemaFormat(Struct, tag="json_schema", tag_field="type", kw_only=True):
    name: Name
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None  # strict or not, the output follows the schema (the grammar enforces it)


TextFormat = TextFormatText | JsonObjectFormat | JsonSchemaFormat


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None  # a reasoning model's knob: ignored


Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]], Meta(max_length=16)
]


class ResponsesRequest(Struct, kw_only=True):
    model: Name
    input: str | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_ITEMS)]
    instructions: str | None = None
    tools: Annotated[list[dict[str, Any]], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    # vLLM's sampling knobs, which the openai SDK sends through extra_body
    top_k: Annotated[int, Meta(ge=-1, le=TOP_K_MAX)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    repetition_penalty: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: ResponseId | None = None
    metadata: Metadata | None = None
    user: Name | None = None
    # A background response needs a job queue this server does not run: only false is taken.
    background: Annotated[Literal[False], Meta(extra=UNSUPPORTED)] | None = None
    # Accepted and ignored: they mean nothing to a local model without hosted tools or server-side caching.
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    truncation: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
