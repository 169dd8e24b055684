"""msgspec structs for the Anthropic Messages API: requests as Anthropic's clients send them (unknown fields
ignored, as Anthropic's own API does with headers it does not know), responses and stream events as it returns
them. Content blocks are tagged by their `type`; an unknown type is refused while decoding."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from web.generation.decoding import TOP_K_MAX, Name

# Anthropic's pattern for a tool's name (Claude Code's MCP tools are "mcp__server__tool").
ToolName = Annotated[str, Meta(pattern="^[a-zA-Z0-9_-]{1,128}$")]
MaxTokens = Annotated[int, Meta(ge=1)]


class TextBlock(Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class SystemText(Struct, kw_only=True):
    """A system prompt block: its type is a plain required field (a tag outside a union is optional to msgspec,
    while the document, as Anthropic's, requires it)."""

    type: Literal["text"]
    text: str


class ImageBlock(Struct, tag="image", tag_field="type", kw_only=True):
    """Refused (this model reads text only): decoded so that the refusal names the block, not the whole body."""

    source: Any = None


class DocumentBlock(Struct, tag="document", tag_field="type", kw_only=True):
    source: Any = None


class ThinkingBlock(Struct, tag="thinking", tag_field="type", kw_only=True):
    """A client replaying another model's reasoning: this server has none, so it is dropped from the prompt."""

    thinking: str = ""


class RedactedThinkingBlock(Struct, tag="redacted_thinking", tag_field="type", kw_only=True):
    data: str = ""


class ToolUseBlock(Struct, tag="tool_use", tag_field="type", kw_only=True):
    id: Annotated[str, Meta(min_length=1, max_length=256)]
    name: ToolName
    input: dict[str, Any]


ResultPart = TextBlock | ImageBlock | DocumentBlock


class ToolResultBlock(Struct, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: Annotated[str, Meta(min_length=1, max_length=256)]
    content: str | list[ResultPart] | None = None
    is_error: bool = False


Block = TextBlock | ImageBlock | DocumentBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock


class Message(Struct, kw_only=True):
    """A turn; a `system` one (Claude Code's mid-conversation system messages) carries text only, and with
    clear_at "next_user_message" is shown only until a later user message comes."""

    role: Literal["user", "assistant", "system"]
    content: str | list[Block]
    clear_at: Literal["next_user_message", "never"] | None = None


class Tool(Struct, kw_only=True):
    name: ToolName
    input_schema: dict[str, Any]
    description: str | None = None
    # Anthropic's server tools (web search, code execution, ...) have other types: this server runs none.
    type: Literal["custom"] | None = None


class AutoChoice(Struct, tag="auto", tag_field="type", kw_only=True):
    disable_parallel_tool_use: bool = False


class AnyChoice(Struct, tag="any", tag_field="type", kw_only=True):
    disable_parallel_tool_use: bool = False


class NamedChoice(Struct, tag="tool", tag_field="type", kw_only=True):
    name: ToolName
    disable_parallel_tool_use: bool = False


class NoneChoice(Struct, tag="none", tag_field="type", kw_only=True):
    pass


ToolChoice = AutoChoice | AnyChoice | NamedChoice | NoneChoice


class OutputFormat(Struct, kw_only=True):
    """Structured output: the answer's text is JSON valid against `schema` (grammar-constrained)."""

    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: OutputFormat | None = None  # effort and task_budget mean nothing to this server: ignored


class Metadata(Struct, kw_only=True):
    user_id: Name | None = None


class CountTokensRequest(Struct, kw_only=True):
    """What decides the prompt: the body of /v1/messages/count_tokens, and the start of every /v1/messages body."""

    model: Name
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[SystemText] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: MaxTokens  # required, as Anthropic has it
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None  # Anthropic's range
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=TOP_K_MAX)] | None = None  # 0: no cut
    metadata: Metadata | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's spelling of output_config.format
    # Claude Code sends these on every request: this model has no reasoning budget and the server edits no context,
    # so they are taken and ignored (as are fields this server does not know).
    thinking: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


# -- responses ----------------------------------------------------------------------------------------------


class TextOut(Struct, tag="text", tag_field="type"):
    text: str


class ToolUseOut(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class Usage(Struct):
    """Anthropic counts the prompt in parts: input_tokens are those not read from the (prefix) cache."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class MessageBody(Struct):
    id: str
    model: str
    content: list[TextOut | ToolUseOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    type: str = "message"
    role: str = "assistant"


class TokenCount(Struct):
    input_tokens: int


class TextDelta(Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class MessageStart(Struct, tag="message_start", tag_field="type"):
    message: MessageBody


class BlockStart(Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: TextOut | ToolUseOut


class BlockDelta(Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta


class BlockStop(Struct, tag="content_block_stop", tag_field="type"):
    index: int


class Ping(Struct, tag="ping", tag_field="type"):
    pass


class StopDelta(Struct):
    stop_reason: str | None
    stop_sequence: str | None


class MessageDelta(Struct, tag="message_delta", tag_field="type"):
    delta: StopDelta
    usage: Usage


class MessageStop(Struct, tag="message_stop", tag_field="type"):
    pass


Event = MessageStart | BlockStart | BlockDelta | BlockStop | Ping | MessageDelta | MessageStop
encoder = msgspec.json.Encoder()
