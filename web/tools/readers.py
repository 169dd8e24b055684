"""One reader per way a model can answer with calls; each turns text deltas into content and calls on an
EventSink (web/tools/stream.py) and keeps back what it cannot place yet."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from web.tools.calls import call_fields, calls_in, json_sequence, loads
from web.tools.formats import HERMES_CLOSE, HERMES_OPEN


class EventSink(Protocol):
    def content(self, text: str) -> None: ...

    def call(self, name: str, arguments: str) -> int: ...

    def more_arguments(self, index: int, arguments: str) -> None: ...


class Reader(Protocol):
    def feed(self, text: str, out: EventSink) -> None: ...

    def finish(self, out: EventSink) -> None: ...


def partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ContentReader:
    """No calls expected (no tools, or tool_choice none): everything is content."""

    def feed(self, text: str, out: EventSink) -> None:
        out.content(text)

    def finish(self, out: EventSink) -> None:
        return None


class HermesReader:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks among content; a block that is not a
    call of an offered function stays content as written."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._pending = ""
        self._inside = False
        self._searched = 0  # where the search for the closing tag goes on: a long block is scanned once

    def feed(self, text: str, out: EventSink) -> None:
        self._pending += text
        while True:
            marker = HERMES_CLOSE if self._inside else HERMES_OPEN
            at = self._pending.find(marker, self._searched if self._inside else 0)
            if at < 0:
                if self._inside:
                    self._searched = max(0, len(self._pending) - len(marker) + 1)
                break
            before, self._pending = self._pending[:at], self._pending[at + len(marker) :]
            self._searched = 0
            if self._inside:
                self._block(before, True, out)
            else:
                out.content(before)
            self._inside = not self._inside
        if not self._inside:
            keep = len(self._pending) - partial_marker(self._pending, HERMES_OPEN)
            out.content(self._pending[:keep])
            self._pending = self._pending[keep:]

    def finish(self, out: EventSink) -> None:
        if self._inside:  # a block the model never closed is a call still, if its JSON is whole
            self._block(self._pending, False, out)
        else:
            out.content(self._pending)

    def _block(self, body: str, closed: bool, out: EventSink) -> None:
        fields = call_fields(loads(body), self._names)
        if fields is not None:
            out.call(*fields)
        else:
            out.content(HERMES_OPEN + body + (HERMES_CLOSE if closed else ""))


class TrailingCallsReader:
    """Calls that run to the end of the answer after a marker: Llama 3's JSON (at the start, after an optional
    <|python_tag|>, several joined by ';') and Mistral's [TOOL_CALLS][...] (after any content). The detokenizer
    drops special tokens, so an answer that starts with the JSON itself (`json_start`) is read as calls too. The
    calls are read once the answer is complete; if they are not all valid calls, the answer is content whole."""

    def __init__(
        self, names: Collection[str], marker: str, json_start: str, anywhere: bool, separators: str = ""
    ) -> None:
        self._names, self._marker, self._json_start = names, marker, json_start
        self._anywhere, self._separators = anywhere, separators
        self._pending = ""
        self._state = "start"  # then "content" or "calls"

    def feed(self, text: str, out: EventSink) -> None:
        self._pending += text
        if self._state == "start":
            head = self._pending.lstrip()
            if not head or (self._marker.startswith(head)):
                return
            self._state = "calls" if head.startswith((self._marker, self._json_start)) else "content"
        if self._state == "calls":
            return
        keep = 0
        if self._anywhere:
            at = self._pending.find(self._marker)
            if at >= 0:
                out.content(self._pending[:at])
                self._pending, self._state = self._pending[at:], "calls"
                return
            keep = partial_marker(self._pending, self._marker)
        cut = len(self._pending) - keep
        out.content(self._pending[:cut])
        self._pending = self._pending[cut:]

    def finish(self, out: EventSink) -> None:
        if self._state == "calls":
            values = json_sequence(self._pending.lstrip().removeprefix(self._marker), self._separators)
            found = calls_in(values[0] if values and len(values) == 1 else values, self._names)
            if found is not None:
                for fields in found:
                    out.call(*fields)
                return
        out.content(self._pending)


class NamedReader:
    """tool_choice named a function: the grammar made the whole output its arguments, streamed as they come."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._index: int | None = None

    def feed(self, text: str, out: EventSink) -> None:
        if self._index is None:
            text = text.lstrip()
            if not text:
                return
            self._index = out.call(self._name, text)
        else:
            out.more_arguments(self._index, text)

    def finish(self, out: EventSink) -> None:
        return None


class RequiredReader:
    """tool_choice required: the grammar made the output one {"name", "arguments"} object, or an array of them
    (parallel); each call is given once its object is complete. Output with no call in it is content."""

    def __init__(self, names: Collection[str], parallel: bool) -> None:
        self._names = names
        self._level = 1 if parallel else 0  # the depth at which call objects open
        self._depth, self._in_string, self._escape = 0, False, False
        self._object: list[str] | None = None
        self._raw: list[str] = []
        self._calls = 0

    def feed(self, text: str, out: EventSink) -> None:
        self._raw.append(text)
        for ch in text:
            if self._object is not None:
                self._object.append(ch)
            if self._in_string:
                self._escape, self._in_string = (False, True) if self._escape else (ch == "\\", ch != '"')
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                if ch == "{" and self._depth == self._level and self._object is None:
                    self._object = [ch]
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == self._level and self._object is not None:
                    self._close(out)

    def _close(self, out: EventSink) -> None:
        assert self._object is not None
        fields = call_fields(loads("".join(self._object)), self._names)
        self._object = None
        if fields is not None:
            out.call(*fields)
            self._calls += 1

    def finish(self, out: EventSink) -> None:
        if self._calls == 0:
            out.content("".join(self._raw))
