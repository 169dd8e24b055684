"""The OpenAI way of formatting a Generation's deltas: the SSE chunks of a chat or a text completion stream, and the
usage they report."""

from __future__ import annotations

import time

from engine import RequestOutput
from web.generation.run import Generation
from web.openai import formatting as fmt
from web.openai.schemas import Delta, UsageBody, encoder
from web.openai.tools import StreamedCalls


def usage_of(generation: Generation) -> UsageBody:
    log = generation.log
    return fmt.usage_body(log.prompt_tokens, log.completion_tokens, log.cached_tokens)


def created_now() -> int:
    return int(time.time())


class ChatFrames:
    """SSE frames of one chat completion stream: each chunk carries its choice's index; each choice starts with
    the assistant's role and ends with its own finish_reason."""

    def __init__(
        self, generation: Generation, rid: str, model: str, include_usage: bool, fingerprint: str | None
    ) -> None:
        self.generation, self.rid, self.model, self.include_usage = generation, rid, model, include_usage
        self.fingerprint = fingerprint
        self.created = created_now()
        self.started: set[int] = set()
        self.calls = StreamedCalls(generation.tools)

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        """`is_first`: the stream's first delta; each choice's own first is told by `started`."""
        index = self.generation.index_of(out)
        first = index not in self.started
        self.started.add(index)
        frames = []
        text, calls, reason = out.text, None, out.finish_reason
        if self.calls.active:
            text, calls, reason = self.calls.delta(index, out.text, out.finished, out.finish_reason)
        if first or text or calls or out.logprobs:
            content = text if text or not calls else None
            role = "assistant" if first else None
            delta = Delta(role=role, content=content, tool_calls=calls)
            chunk = fmt.chat_chunk(
                self.rid, self.created, self.model, delta, out.logprobs, None, index, self.fingerprint
            )
            frames.append(b"data: " + encoder.encode(chunk) + b"\n\n")
        if out.finished and out.finish_reason != "abort":
            end = fmt.chat_chunk(self.rid, self.created, self.model, Delta(), None, reason, index, self.fingerprint)
            frames.append(fmt.sse(end))
        return frames

    async def closing(self) -> list[bytes]:
        if not self.include_usage:
            return []
        usage = usage_of(self.generation)
        return [fmt.sse(fmt.chat_usage_chunk(self.rid, self.created, self.model, usage, self.fingerprint))]


class CompletionFrames:
    """SSE frames of one text completion stream, each choice's logprob offsets counted on its own text."""

    def __init__(
        self, generation: Generation, rid: str, model: str, include_usage: bool, fingerprint: str | None
    ) -> None:
        self.generation, self.rid, self.model, self.include_usage = generation, rid, model, include_usage
        self.fingerprint = fingerprint
        self.created = created_now()
        self.offsets = [0] * len(generation.finals)

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        reason = out.finish_reason if out.finished and out.finish_reason != "abort" else None
        if not (out.text or out.logprobs or reason):
            return []
        index = self.generation.index_of(out)
        logprobs = fmt.completion_logprobs(out.logprobs, self.offsets[index])
        self.offsets[index] += len(out.text)
        choice = fmt.completion_choice(index, out.text, logprobs, reason)
        return [fmt.sse(fmt.completion(self.rid, self.created, self.model, [choice], None, self.fingerprint))]

    async def closing(self) -> list[bytes]:
        if not self.include_usage:
            return []
        usage = usage_of(self.generation)
        return [fmt.sse(fmt.completion(self.rid, self.created, self.model, [], usage, self.fingerprint))]
