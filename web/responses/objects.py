"""The Responses API's answers as OpenAI returns them and its SDK parses them: the response object, its output
items (an assistant message with output_text, or a function_call), usage, and the stream's events."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

encoder = msgspec.json.Encoder()


class OutputTextPart(Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputMessage(Struct, tag="message", tag_field="type"):
    id: str
    status: str  # in_progress, completed, incomplete
    content: list[OutputTextPart]
    role: str = "assistant"


class FunctionCallOut(Struct, tag="function_call", tag_field="type"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = OutputMessage | FunctionCallOut


class InputTokensDetails(Struct):
    cached_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class IncompleteDetails(Struct):
    reason: str  # max_output_tokens


class ResponseError(Struct):
    code: str
    message: str


class ResponseBody(Struct, kw_only=True):
    id: str
    created_at: int
    model: str
    status: str  # in_progress, completed, incomplete, failed
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    truncation: str = "disabled"
    user: str | None = None
    object: str = "response"


class Deleted(Struct):
    id: str
    object: str = "response.deleted"
    deleted: bool = True


# -- stream events, each with its sequence_number --------------------------------------------------------------


class ResponseEvent(Struct, kw_only=True):
    """response.created, .in_progress, .completed, .incomplete and .failed: the response as it stands."""

    type: str
    sequence_number: int
    response: ResponseBody


class ItemEvent(Struct, kw_only=True):
    """response.output_item.added and .done."""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class PartEvent(Struct, kw_only=True):
    """response.content_part.added and .done."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextPart


class TextDeltaEvent(Struct, kw_only=True, tag="response.output_text.delta", tag_field="type"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class TextDoneEvent(Struct, kw_only=True, tag="response.output_text.done", tag_field="type"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ArgumentsDeltaEvent(Struct, kw_only=True, tag="response.function_call_arguments.delta", tag_field="type"):
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(Struct, kw_only=True, tag="response.function_call_arguments.done", tag_field="type"):
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


EVENTS = (ResponseEvent, ItemEvent, PartEvent, TextDeltaEvent, TextDoneEvent, ArgumentsDeltaEvent, ArgumentsDoneEvent)
