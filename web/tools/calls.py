"""Model output (untrusted text) into calls: a JSON object is a call only when it names an offered function and
its arguments are an object; anything else stays content. Also the events a stream parser gives and their sum."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from web.tools.spec import ToolCall


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of call `index`: its first piece carries `id` and `name` (and arguments "" or a first part), the
    later ones only further arguments text, as OpenAI streams tool calls."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Event = ContentDelta | CallDelta


@dataclass(frozen=True, slots=True)
class Parsed:
    """A whole answer: content is None when nothing but calls (and whitespace) was said, as OpenAI's."""

    content: str | None
    calls: list[ToolCall]


def collect(events: Iterable[Event]) -> Parsed:
    """The answer a sequence of events adds up to (what a client assembling the deltas would get)."""
    text: list[str] = []
    calls: list[list[str]] = []  # [id, name, arguments] by index
    for event in events:
        if isinstance(event, ContentDelta):
            text.append(event.text)
        elif event.id is not None and event.name is not None:
            calls.append([event.id, event.name, event.arguments])
        else:
            calls[event.index][2] += event.arguments
    content = "".join(text)
    return Parsed(content or None, [ToolCall(i, n, a) for i, n, a in calls])


def loads(text: str) -> Any:
    """JSON or None: the model's text may be anything, nested past the recursion limit included."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def call_fields(value: Any, names: Collection[str]) -> tuple[str, str] | None:
    """(name, arguments as JSON text) when `value` is a call of one of `names`: {"name": ..., "arguments": {...}}
    (Llama 3 says "parameters"; arguments sent as a JSON string are read; missing ones are {}), else None."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        args = loads(args)
    if not isinstance(args, dict):
        return None
    return name, dumps(args)


def calls_in(value: Any, names: Collection[str]) -> list[tuple[str, str]] | None:
    """A call or a list of them (all valid, at least one), else None: a half-valid list stays content whole."""
    items = value if isinstance(value, list) else [value]
    fields = [call_fields(item, names) for item in items]
    if not fields or any(f is None for f in fields):
        return None
    return [f for f in fields if f is not None]


def json_sequence(text: str, separators: str = ";") -> list[Any] | None:
    """The JSON values of `text` one after another, separated by whitespace or `separators` (Llama 3 puts ';'
    between parallel calls); None unless all of the text is such values."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    i = 0
    while True:
        while i < len(text) and (text[i].isspace() or text[i] in separators):
            i += 1
        if i == len(text):
            return values or None
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        values.append(value)
