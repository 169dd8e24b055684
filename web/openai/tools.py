"""The OpenAI side of tool calls: a chat body's tools, tool_choice and tool turns into web/tools terms, and the
model's calls back into OpenAI's message.tool_calls and tool-call deltas."""

from __future__ import annotations

from typing import Any

from engine import Logprob
from web.errors import InvalidRequest
from web.openai import formatting as fmt
from web.openai.schemas import ChatChoice, ChatCompletionRequest, ChatMessage
from web.openai.tool_schemas import (
    FunctionCallBody,
    FunctionDeltaBody,
    NamedToolChoice,
    ToolCallBody,
    ToolCallDeltaBody,
)
from web.tools import (
    CallDelta,
    ContentDelta,
    Event,
    Parsed,
    ToolCallStream,
    ToolChoice,
    ToolPlan,
    hf_call,
    named_choice,
    tool_spec,
    unmatched_tool_result,
)


def tool_plan(body: ChatCompletionRequest, tokenizer: Any) -> ToolPlan:
    """The body's tools for this model; every refusal names the body's field."""
    specs = [
        tool_spec(
            t.function.name,
            t.function.description,
            t.function.parameters,
            f"tools[{i}].function.name",
            f"tools[{i}].function.parameters",
        )
        for i, t in enumerate(body.tools or ())
    ]
    choice: ToolChoice | None = None
    if isinstance(body.tool_choice, NamedToolChoice):
        choice = named_choice(specs, body.tool_choice.function.name)
    elif body.tool_choice is not None:
        choice = ToolChoice(body.tool_choice)
    if choice is not None and choice.kind != "none" and not specs:
        raise InvalidRequest("tool_choice needs tools: the request offers none", param="tool_choice")
    return ToolPlan.of(specs, choice, body.parallel_tool_calls, tokenizer)


def with_tool_turn(message: dict[str, Any], m: ChatMessage, i: int) -> dict[str, Any]:
    """A template message with its tool parts: an assistant's calls (arguments as a dict), a tool result's id."""
    if m.tool_calls:
        if message["role"] != "assistant":
            raise InvalidRequest("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
        message["tool_calls"] = [
            hf_call(c.id, c.function.name, c.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")
            for j, c in enumerate(m.tool_calls)
        ]
    if message["role"] == "tool":
        if m.tool_call_id is None:
            raise InvalidRequest(
                "a tool message needs the tool_call_id of the call it answers", param=f"messages[{i}].tool_call_id"
            )
        message["tool_call_id"] = m.tool_call_id
    return message


def check_tool_results(messages: list[dict[str, Any]]) -> None:
    """Each tool result answers a call an earlier assistant message made."""
    bad = unmatched_tool_result(messages)
    if bad is not None:
        raise InvalidRequest(
            f"messages[{bad}] answers a tool call that no earlier assistant message made (tool_call_id "
            f"'{str(messages[bad].get('tool_call_id'))[:64]}')",
            param=f"messages[{bad}].tool_call_id",
        )


def message_parts(parsed: Parsed) -> tuple[str | None, list[ToolCallBody] | None]:
    """A whole answer's content and message.tool_calls (None when it made no call: the field is left out)."""
    calls = [ToolCallBody(c.id, FunctionCallBody(c.name, c.arguments)) for c in parsed.calls]
    return parsed.content, calls or None


def delta_parts(events: list[Event]) -> tuple[str, list[ToolCallDeltaBody]]:
    """One engine delta's parsed events as a chunk's content and tool_calls."""
    text = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [
        ToolCallDeltaBody(e.index, FunctionDeltaBody(e.name, e.arguments), e.id, "function")
        if e.id is not None
        else ToolCallDeltaBody(e.index, FunctionDeltaBody(arguments=e.arguments))
        for e in events
        if isinstance(e, CallDelta)
    ]
    return text, calls


def finish_reason(reason: str | None, calls: int) -> str | None:
    """tool_calls when the answer made calls and ended on its own (a cut one stays length, as OpenAI's)."""
    if calls and reason not in (None, "length", "abort"):
        return "tool_calls"
    return reason


def chat_choice(
    index: int, text: str, logprobs: list[Logprob] | None, reason: str | None, plan: ToolPlan
) -> ChatChoice:
    """A whole choice; with tools offered, its calls are read out of the text."""
    if plan.mode == "off":
        return fmt.chat_choice(index, text, logprobs, reason)
    content, calls = message_parts(plan.parse(text))
    return fmt.chat_choice(index, content, logprobs, finish_reason(reason, len(calls or ())), calls)


class StreamedCalls:
    """A stream's tool calls: one parser per choice, fed each delta's text."""

    def __init__(self, plan: ToolPlan) -> None:
        self.active = plan.mode != "off"
        self._plan = plan
        self._parsers: dict[int, ToolCallStream] = {}

    def delta(
        self, index: int, text: str, finished: bool, reason: str | None
    ) -> tuple[str, list[ToolCallDeltaBody] | None, str | None]:
        """A delta's content, tool-call deltas (None if none) and, on the choice's last, its finish_reason."""
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self._plan.stream()
        events = parser.feed(text) + (parser.finish() if finished else [])
        content, calls = delta_parts(events)
        return content, calls or None, finish_reason(reason, parser.calls) if finished else reason
