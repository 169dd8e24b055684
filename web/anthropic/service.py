"""Anthropic request bodies decoded and validated into the pipeline's Ask: the conversation in the chat template's
shape (system first, tool results as tool messages, tool_use blocks as the assistant's tool calls), the sampling
fields, the tools. Every refusal names its field."""

from __future__ import annotations

from typing import Any

import msgspec

from engine import GuidedDecoding
from web.anthropic.schemas import (
    AnyChoice,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    NamedChoice,
    NoneChoice,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from web.backends.protocol import Served
from web.errors import InvalidRequest, UnsupportedParameter
from web.generation.decoding import BodyDecoder
from web.generation.prompts import Ask, Chat
from web.generation.sampling import Sampling, check_guided, forced_tool_guided
from web.tools import AUTO, ToolChoice, ToolPlan, named_choice, tool_spec

decode_messages = BodyDecoder(MessagesRequest)
decode_count = BodyDecoder(CountTokensRequest)


def conversation(body: CountTokensRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages as the chat template takes them (a tool_result must answer an earlier tool_use): the system
    prompt and the system messages before the first turn in one leading system message, later system messages as
    system turns where they stand. For a template that refuses those, the same conversation with them folded into
    the leading one (the template decides: web/generation/prompts.py tries it as it is first)."""
    system = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system or ())
    leading = [system] if system else []
    turns: list[dict[str, Any]] = []
    calls: set[str] = set()
    last_user = max((i for i, m in enumerate(body.messages) if m.role == "user"), default=-1)
    for i, message in enumerate(body.messages):
        if message.role != "system":
            turns.extend(_turn(message, i, calls))
        elif message.clear_at != "next_user_message" or i > last_user:
            text = _system_text(message, i)
            if text and turns:
                turns.append({"role": "system", "content": text})
            elif text:
                leading.append(text)
    late = [t["content"] for t in turns if t["role"] == "system"]
    head = [{"role": "system", "content": "\n\n".join(leading)}] if leading else []
    folded = None
    if late:
        folded = [{"role": "system", "content": "\n\n".join(leading + late)}]
        folded += [t for t in turns if t["role"] != "system"]
    return head + turns, folded


def _system_text(message: Message, i: int) -> str:
    """A system message's text: text blocks only (thinking blocks are dropped, as everywhere)."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif not isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            raise InvalidRequest("system messages carry text blocks only", param=f"messages[{i}].content[{j}].type")
    return "\n".join(texts)


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
    guided, param = output_guided(body)
    await check_guided(guided, param)
    guided = await forced_tool_guided(plan, guided)  # tool_choice any or tool: the arguments validate
    sampling = Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        stop=tuple(body.stop_sequences or ()),
        guided=guided,
    )
    return Ask(served, _chat(body, plan), sampling, body.max_tokens)


def output_guided(body: MessagesRequest) -> tuple[GuidedDecoding | None, str]:
    """output_config.format (or the beta's output_format) as the engine's constraint, and the field it came from."""
    spec = body.output_config.format if body.output_config else None
    if spec is not None and body.output_format is not None:
        raise InvalidRequest("give output_config.format or output_format, not both", param="output_format")
    param = "output_config.format" if spec is not None else "output_format"
    spec = spec or body.output_format
    if spec is None:
        return None, param
    return GuidedDecoding(kind="json_schema", schema=msgspec.json.encode(spec.schema).decode()), param


def count_ask(body: CountTokensRequest, served: Served) -> Ask:
    """The prompt as /v1/messages would render it (nothing is sampled)."""
    plan = tool_plan(body, served.tokenizer)
    return Ask(served, _chat(body, plan))


def _chat(body: CountTokensRequest, plan: ToolPlan) -> Chat:
    messages, folded = conversation(body)
    return Chat(messages, plan, folded=folded)
