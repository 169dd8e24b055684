"""The incremental parser: fed the model's text deltas, it gives content deltas and tool-call deltas. It holds
back text that may be the start of a call marker, so a marker never reaches a client as content, and it is the
whole-answer parser too (ToolPlan.parse feeds it everything at once), so a stream and a whole answer agree."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from web.tools.calls import CallDelta, ContentDelta, Event
from web.tools.formats import MISTRAL_MARKER, PYTHON_TAG, ToolFormat
from web.tools.readers import (
    ContentReader,
    HermesReader,
    NamedReader,
    Reader,
    RequiredReader,
    TrailingCallsReader,
)
from web.tools.spec import new_call_id

ParseMode = Literal["off", "auto", "named", "required"]


class _Events:
    """Events under construction: calls numbered in order, and content without the whitespace around calls
    (trailing whitespace is held back until more content follows; dropped before a call and at the end). With
    `single` (parallel_tool_calls false) a call after the first is dropped, as vLLM does."""

    def __init__(self, id_prefix: str, single: bool) -> None:
        self.events: list[Event] = []
        self.calls = 0
        self._id_prefix = id_prefix
        self._single = single
        self._space = ""
        self._said = False

    def content(self, text: str) -> None:
        body = text.rstrip()
        if not body:
            self._space += text
            return
        if self._said:
            self.events.append(ContentDelta(self._space + body))
        else:
            self.events.append(ContentDelta(body.lstrip()))
        self._said, self._space = True, text[len(body) :]

    def call(self, name: str, arguments: str) -> int:
        self._space = ""
        if self._single and self.calls:
            return 0
        self.events.append(CallDelta(self.calls, arguments, new_call_id(self._id_prefix), name))
        self.calls += 1
        return self.calls - 1

    def more_arguments(self, index: int, arguments: str) -> None:
        if arguments:
            self.events.append(CallDelta(index, arguments))

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def _reader(mode: ParseMode, names: Collection[str], fmt: ToolFormat, named: str | None, parallel: bool) -> Reader:
    if mode == "named":
        assert named is not None  # ToolPlan sets it with the mode
        return NamedReader(named)
    if mode == "required":
        return RequiredReader(names, parallel)
    if mode == "off":
        return ContentReader()
    if fmt == "llama3":
        return TrailingCallsReader(names, PYTHON_TAG, "{", anywhere=False, separators=";")
    if fmt == "mistral":
        return TrailingCallsReader(names, MISTRAL_MARKER, "[", anywhere=True)
    return HermesReader(names)


class ToolCallStream:
    """feed() each text delta, then finish() once; each returns the events it completed (ContentDelta,
    CallDelta). Call ids are `id_prefix` + 24 random hex digits.

    mode "off": all content; "auto": calls in the model's `fmt` (web/tools/formats.py) among content; "named":
    the output is the arguments of the function `named`, streamed as they come; "required": the output is one
    call object, or an array of them when `parallel` (web/tools/constraint.py), each given once complete.
    Without `parallel`, only the first call counts."""

    def __init__(
        self,
        mode: ParseMode,
        names: Collection[str],
        fmt: ToolFormat = "hermes",
        named: str | None = None,
        parallel: bool = True,
        id_prefix: str = "call_",
    ) -> None:
        self._reader = _reader(mode, names, fmt, named, parallel)
        self._events = _Events(id_prefix, single=not parallel)

    @property
    def calls(self) -> int:
        """How many calls have begun so far."""
        return self._events.calls

    def feed(self, text: str) -> list[Event]:
        if text:
            self._reader.feed(text, self._events)
        return self._events.take()

    def finish(self) -> list[Event]:
        self._reader.finish(self._events)
        return self._events.take()
