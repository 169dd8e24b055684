"""Anthropic request bodies decoded and validated into the pipeline's Ask: the conversation in the chat template's
shape (system first, tool results as tool messages, tool_use blocks as the assistant's tool calls), the sampling
fields, the tools. Every refusal names its field."""

from __future__ import annotations

from typing import Any

from web.anthropic.schemas import (
    AnyChoice,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    NamedChoice,
    NoneChoice,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from web.backends.protocol import Served
from web.errors import InvalidRequest, UnsupportedParameter
from web.generation.decoding import BodyDecoder
from web.generation.prompts import Ask, Chat
from web.generation.sampling import Sampling, forced_tool_guided
from web.tools import AUTO, ToolChoice, ToolPlan, named_choice, tool_spec

decode_messages = BodyDecoder(MessagesRequest)
decode_count = BodyDecoder(CountTokensRequest)


def conversation(body: CountTokensRequest) -> list[dict[str, Any]]:
    """The messages as the chat template takes them; a tool_result must answer an earlier tool_use."""
    out: list[dict[str, Any]] = []
    system = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system or ())
    if system:
        out.append({"role": "system", "content": system})
    calls: set[str] = set()
    for i, message in enumerate(body.messages):
        out.extend(_turn(message, i, calls))
    return out


def _turn(message: Message, i: int, calls: set[str]) -> list[dict[str, Any]]:
    """One message's template messages: its tool results first (they answer the turn before), then its text."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock | DocumentBlock):
            raise _text_only(block, where)
        elif isinstance(block, ToolUseBlock):
            _check_role(message, "assistant", "tool_use", where)
            calls.add(block.id)
            function = {"name": block.name, "arguments": block.input}
            tool_calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock):
            _check_role(message, "user", "tool_result", where)
            if block.tool_use_id not in calls:
                raise InvalidRequest(
                    f"tool_result {block.tool_use_id!r} answers no earlier tool_use block",
                    param=f"{where}.tool_use_id",
                )
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block, where)})
        # thinking blocks replay another model's reasoning: this model has none to continue, so they are dropped
    text = "\n".join(texts)
    if message.role == "assistant":
        said: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            said["tool_calls"] = tool_calls
        return [said]
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _check_role(message: Message, role: str, kind: str, where: str) -> None:
    if message.role != role:
        raise InvalidRequest(f"{kind} blocks belong in {role} messages", param=f"{where}.type")


def _text_only(block: ImageBlock | DocumentBlock, where: str) -> UnsupportedParameter:
    kind = "image" if isinstance(block, ImageBlock) else "document"
    return UnsupportedParameter(
        f"{kind} blocks are not supported: this server's model is a text-only model", param=f"{where}.type"
    )


def _result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        parts = []
        for k, part in enumerate(block.content):
            if not isinstance(part, TextBlock):
                raise _text_only(part, f"{where}.content[{k}]")
            parts.append(part.text)
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def tool_plan(body: CountTokensRequest, tokenizer: Any) -> ToolPlan:
    """The body's tools for this model: tool_choice any is OpenAI's required, tool a named function."""
    specs = [
        tool_spec(t.name, t.description, t.input_schema, f"tools[{i}].name", f"tools[{i}].input_schema")
        for i, t in enumerate(body.tools or ())
    ]
    choice = body.tool_choice
    if choice is None:
        return ToolPlan.of(specs, None, None, tokenizer)
    if isinstance(choice, NoneChoice):
        return ToolPlan.of(specs, ToolChoice("none"), None, tokenizer)
    if not specs:
        raise InvalidRequest("tool_choice needs tools: the request offers none", param="tool_choice")
    if isinstance(choice, NamedChoice):
        kind = named_choice(specs, choice.name, "tool_choice.name")
    else:
        kind = ToolChoice("required") if isinstance(choice, AnyChoice) else AUTO
    return ToolPlan.of(specs, kind, not choice.disable_parallel_tool_use, tokenizer)


async def message_ask(body: MessagesRequest, served: Served) -> Ask:
    plan = tool_plan(body, served.tokenizer)
    guided = await forced_tool_guided(plan, None)  # tool_choice any or tool: the arguments validate
    sampling = Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        stop=tuple(body.stop_sequences or ()),
        guided=guided,
    )
    return Ask(served, Chat(conversation(body), plan), sampling, body.max_tokens)


def count_ask(body: CountTokensRequest, served: Served) -> Ask:
    """The prompt as /v1/messages would render it (nothing is sampled)."""
    plan = tool_plan(body, served.tokenizer)
    return Ask(served, Chat(conversation(body), plan))
