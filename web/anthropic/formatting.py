"""Engine outputs in Anthropic's shapes: the stop reason, usage, content blocks, and the SSE events of a stream
(content blocks opened, filled and closed as the text or a tool call's input arrives)."""

from __future__ import annotations

from engine import RequestOutput
from web.anthropic.errors import sse
from web.anthropic.schemas import (
    BlockDelta,
    BlockStart,
    BlockStop,
    InputJsonDelta,
    TextDelta,
    TextOut,
    ToolUseOut,
    Usage,
)
from web.history.record import RequestLog
from web.tools import ToolPlan

CALL_ID_PREFIX = "toolu_"  # Anthropic's tool_use ids


def stop_reason(final: RequestOutput, called: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence): a stop string the engine matched is reported as the one it was."""
    if called:
        return "tool_use", None
    if final.finish_reason == "length":
        return "max_tokens", None
    if isinstance(final.stop_reason, str):
        return "stop_sequence", final.stop_reason
    return "end_turn", None


def usage_of(log: RequestLog) -> Usage:
    """Anthropic's input_tokens leave out what the prefix cache served (cache_read_input_tokens)."""
    cached = min(log.cached_tokens, log.prompt_tokens)
    return Usage(log.prompt_tokens - cached, log.completion_tokens, cache_read_input_tokens=cached)


def content_of(text: str, plan: ToolPlan) -> tuple[list[TextOut | ToolUseOut], bool]:
    """A whole answer's content blocks, and whether it called a tool: with tools in play, calls are parsed out of
    the text (web/tools; what is not a valid call of an offered tool stays text)."""
    if plan.mode == "off":
        return ([TextOut(text)] if text else []), False
    parsed = plan.parse(text, CALL_ID_PREFIX)
    blocks: list[TextOut | ToolUseOut] = [TextOut(parsed.content)] if parsed.content else []
    blocks += [ToolUseOut(call.id, call.name, call.arguments_object()) for call in parsed.calls]
    return blocks, bool(parsed.calls)


class Blocks:
    """The content blocks of one streamed answer, as SSE events: a text block opens at the first text, a
    tool_use block at each call (closing the block before it), and the last one closes at the end."""

    def __init__(self) -> None:
        self.count = 0
        self._open: str | None = None  # "text" or "tool_use"

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = [] if self._open == "text" else [*self.close(), self._start(TextOut(""))]
        self._open = "text"
        return [*events, self._delta(TextDelta(text))]

    def tool_use(self, call_id: str, name: str, arguments: str) -> list[bytes]:
        events = [*self.close(), self._start(ToolUseOut(call_id, name, {}))]
        self._open = "tool_use"
        return events + self.arguments(arguments)

    def arguments(self, arguments: str) -> list[bytes]:
        return [self._delta(InputJsonDelta(arguments))] if arguments else []

    def close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse("content_block_stop", BlockStop(self.count - 1))]

    def _start(self, block: TextOut | ToolUseOut) -> bytes:
        self.count += 1
        return sse("content_block_start", BlockStart(self.count - 1, block))

    def _delta(self, delta: TextDelta | InputJsonDelta) -> bytes:
        return sse("content_block_delta", BlockDelta(self.count - 1, delta))
