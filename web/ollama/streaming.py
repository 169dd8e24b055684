"""Ollama's answers from a Generation: NDJSON lines as it streams them (text deltas; tool calls whole, in one line
once the answer ends, as Ollama sends them; then the last line with done true, the reason and the counts), or
the whole answer in one object. Durations are nanoseconds, as Ollama's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from engine import RequestOutput
from web.generation.run import Generation
from web.history.record import RequestLog
from web.ollama.schemas import CallFunction, ChatLine, GenerateLine, OutMessage, ToolCall
from web.tools import CallDelta, ContentDelta, ToolPlan
from web.tools import ToolCall as Parsed

encoder = msgspec.json.Encoder()
NS = 1_000_000_000


def now() -> str:
    """RFC 3339 in UTC, as Ollama's created_at."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(value: Any) -> bytes:
    return encoder.encode(value) + b"\n"


def counts(log: RequestLog) -> dict[str, Any]:
    """The last line's counts and durations, from the history row's record."""
    first, end, scheduled = log.first_token_mono, log.finished_mono, log.scheduled_mono
    start = scheduled if scheduled is not None else log.arrival_mono
    return {
        "total_duration": _ns(end, log.arrival_mono),
        "load_duration": 0,  # the model is loaded when the appliance starts
        "prompt_eval_count": log.prompt_tokens,
        "prompt_eval_duration": _ns(first, start),
        "eval_count": log.completion_tokens,
        "eval_duration": _ns(end, first),
    }


def _ns(end: float | None, start: float | None) -> int:
    return 0 if end is None or start is None else max(int((end - start) * NS), 0)


def done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


def calls_of(plan: ToolPlan, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's text and its tool calls, the arguments as objects (Ollama's shape)."""
    if plan.mode == "off":
        return text, []
    parsed = plan.parse(text)
    calls = [
        ToolCall(function=CallFunction(name=c.name, arguments=c.arguments_object(), index=i))
        for i, c in enumerate(parsed.calls)
    ]
    return parsed.content or "", calls


def chat_reply(generation: Generation, text: str) -> bytes:
    log = generation.log
    content, calls = calls_of(generation.tools, text)
    reason = done_reason(log.finish_reason)
    message = OutMessage("assistant", content, calls or None)
    return encoder.encode(ChatLine(log.model, now(), message, True, reason, **counts(log)))


def generate_reply(generation: Generation, text: str) -> bytes:
    log = generation.log
    return encoder.encode(GenerateLine(log.model, now(), text, True, done_reason(log.finish_reason), **counts(log)))


class ChatFrames:
    """The lines of a streamed /api/chat: content as it comes (never a call marker), the calls whole."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        plan = generation.tools
        self.calls = plan.stream() if plan.mode != "off" else None
        self.parts: list[list[str]] = []  # [name, arguments] of each call

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        ended = out.finished and out.finish_reason != "abort"
        if self.calls is None:
            return [self._content(out.text)] if out.text else []
        text = []
        for event in self.calls.feed(out.text) + (self.calls.finish() if ended else []):
            if isinstance(event, ContentDelta):
                text.append(event.text)
            else:
                self._take(event)
        frames = [self._content("".join(text))] if text else []
        if ended and self.parts:
            calls = [
                ToolCall(function=CallFunction(name=n, arguments=_object(a), index=i))
                for i, (n, a) in enumerate(self.parts)
            ]
            frames.append(line(ChatLine(self.generation.log.model, now(), OutMessage("assistant", "", calls), False)))
        return frames

    def _take(self, event: CallDelta) -> None:
        if event.name is not None:
            self.parts.append([event.name, event.arguments])
        else:
            self.parts[event.index][1] += event.arguments

    def _content(self, text: str) -> bytes:
        return line(ChatLine(self.generation.log.model, now(), OutMessage("assistant", text), False))

    async def closing(self) -> list[bytes]:
        log = self.generation.log
        message = OutMessage("assistant", "")
        return [line(ChatLine(log.model, now(), message, True, done_reason(log.finish_reason), **counts(log)))]


class GenerateFrames:
    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        log = self.generation.log
        return [line(GenerateLine(log.model, now(), out.text, False))] if out.text else []

    async def closing(self) -> list[bytes]:
        log = self.generation.log
        return [line(GenerateLine(log.model, now(), "", True, done_reason(log.finish_reason), **counts(log)))]


def _object(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object they are ({} for a call cut short)."""
    return Parsed("", "", arguments).arguments_object()
