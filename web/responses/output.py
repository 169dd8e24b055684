"""An answer's output items built as its text arrives (whole, or delta by delta, through the same tool-call
parser): a message item opens at the first text, a function_call item at each call, the one before closing; each
step is the stream events it makes (a collected answer drops them). Also the answer's usage, status and the
assistant turn a continuation replays."""

from __future__ import annotations

import json
import uuid
from typing import Any

from engine import RequestOutput
from web.history.record import RequestLog
from web.responses.objects import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    FunctionCallOut,
    IncompleteDetails,
    InputTokensDetails,
    ItemEvent,
    OutputItem,
    OutputMessage,
    OutputTextPart,
    OutputTokensDetails,
    PartEvent,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
)
from web.tools import CallDelta, ContentDelta, ToolCallStream, ToolPlan

Event = ItemEvent | PartEvent | TextDeltaEvent | TextDoneEvent | ArgumentsDeltaEvent | ArgumentsDoneEvent
CALL_ID_PREFIX = "call_"


def item_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def usage_of(log: RequestLog) -> ResponseUsage:
    prompt, completion = log.prompt_tokens, log.completion_tokens
    cached = InputTokensDetails(min(log.cached_tokens, prompt))
    return ResponseUsage(prompt, completion, prompt + completion, cached, OutputTokensDetails())


def ending(final: RequestOutput | None) -> tuple[str, IncompleteDetails | None]:
    """The response's status: incomplete when max_output_tokens (or the context) cut it."""
    if final is not None and final.finish_reason == "length":
        return "incomplete", IncompleteDetails("max_output_tokens")
    return "completed", None


class Output:
    """The output items of one answer; `sequence` numbers the events of its stream (the caller's first ones
    taken)."""

    def __init__(self, plan: ToolPlan, first_sequence: int = 0) -> None:
        self.items: list[OutputItem] = []
        self.sequence = first_sequence
        self._calls: ToolCallStream | None = plan.stream(CALL_ID_PREFIX) if plan.mode != "off" else None
        self._open = False

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def feed(self, text: str) -> list[Event]:
        if self._calls is None:
            return self._text(text)
        return self._parsed(self._calls.feed(text))

    def finish(self, status: str) -> list[Event]:
        """The answer's end (`status`: completed, or incomplete for one cut short): what the parser held back,
        then the open item closed."""
        events = self._parsed(self._calls.finish()) if self._calls is not None else []
        return events + self.close(status)

    def _parsed(self, parsed: list[ContentDelta | CallDelta]) -> list[Event]:
        events: list[Event] = []
        for event in parsed:
            events += self._text(event.text) if isinstance(event, ContentDelta) else self._call(event)
        return events

    def _text(self, text: str) -> list[Event]:
        if not text:
            return []
        events: list[Event] = []
        last = self.items[-1] if self._open else None
        if not isinstance(last, OutputMessage):
            events += self.close("completed")
            last = OutputMessage(item_id("msg_"), "in_progress", [])
            self._add(last)
            events.append(ItemEvent(type="response.output_item.added", **self._at(), item=_copy(last)))
            last.content.append(OutputTextPart(""))
            events.append(PartEvent(type="response.content_part.added", **self._part(last), part=OutputTextPart("")))
        last.content[0].text += text
        return [*events, TextDeltaEvent(**self._part(last), delta=text)]

    def _call(self, event: CallDelta) -> list[Event]:
        events: list[Event] = []
        if event.id is not None and event.name is not None:
            events += self.close("completed")
            added = FunctionCallOut(item_id("fc_"), event.id, event.name, "", "in_progress")
            self._add(added)
            events.append(ItemEvent(type="response.output_item.added", **self._at(), item=_copy(added)))
        call = self.items[-1] if self._open else None
        if not isinstance(call, FunctionCallOut) or not event.arguments:
            return events
        call.arguments += event.arguments
        return [*events, ArgumentsDeltaEvent(**self._at(), item_id=call.id, delta=event.arguments)]

    def close(self, status: str) -> list[Event]:
        """Close the open item (`status`: completed, or incomplete for an answer cut short)."""
        if not self._open:
            return []
        self._open = False
        item = self.items[-1]
        item.status = status
        events: list[Event] = []
        if isinstance(item, OutputMessage):
            part = item.content[0]
            events.append(TextDoneEvent(**self._part(item), text=part.text))
            events.append(PartEvent(type="response.content_part.done", **self._part(item), part=part))
        else:
            events.append(ArgumentsDoneEvent(**self._at(), item_id=item.id, name=item.name, arguments=item.arguments))
        return [*events, ItemEvent(type="response.output_item.done", **self._at(), item=item)]

    def _add(self, item: OutputItem) -> None:
        self.items.append(item)
        self._open = True

    def _at(self) -> dict[str, Any]:
        return {"sequence_number": self.next_sequence(), "output_index": len(self.items) - 1}

    def _part(self, item: OutputMessage) -> dict[str, Any]:
        return {**self._at(), "item_id": item.id, "content_index": 0}

    def assistant_turn(self) -> dict[str, Any]:
        """The answer as the chat template's assistant message, for a continuation."""
        text = "".join(p.text for i in self.items if isinstance(i, OutputMessage) for p in i.content)
        calls = [
            {"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": _arguments(i.arguments)}}
            for i in self.items
            if isinstance(i, FunctionCallOut)
        ]
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _copy(item: OutputItem) -> OutputItem:
    """An item as it stood when added (the event is encoded later, when the item has grown)."""
    if isinstance(item, OutputMessage):
        return OutputMessage(item.id, item.status, [OutputTextPart(p.text) for p in item.content], item.role)
    return FunctionCallOut(item.id, item.call_id, item.name, item.arguments, item.status)


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
