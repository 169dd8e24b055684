"""One Responses stream as OpenAI sends it, each event with its `event:` line and sequence_number:
response.created and .in_progress, then each output item's added / deltas / done events (web/responses/output.py),
then response.completed (or .incomplete, cut by max_output_tokens) with usage; response.failed if the engine fails
once the stream has begun."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from msgspec import Struct

from engine import RequestOutput
from web.errors import AppError
from web.generation.run import Generation
from web.responses.objects import ResponseBody, ResponseError, ResponseEvent, encoder
from web.responses.output import Output, ending, usage_of

# The dialect's response object for a status and the output so far, and its storing of a finished one.
Snapshot = Callable[[str, Output], ResponseBody]
Keep = Callable[[ResponseBody, Output], Awaitable[None]]


def sse(event: Struct) -> bytes:
    kind = getattr(event, "type", None) or event.__struct_config__.tag
    return b"event: " + str(kind).encode() + b"\ndata: " + encoder.encode(event) + b"\n\n"


class ResponseFrames:
    def __init__(self, generation: Generation, snapshot: Snapshot, keep: Keep) -> None:
        self.generation, self.snapshot, self.keep = generation, snapshot, keep
        self.output = Output(generation.tools)

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        events: list[Struct] = []
        if is_first:
            for kind in ("response.created", "response.in_progress"):
                events.append(self._lifecycle(kind, self.snapshot("in_progress", self.output)))
        events += self.output.feed(out.text)
        if out.finished and out.finish_reason != "abort":
            status, _ = ending(out)
            events += self.output.finish(status)
        return [sse(e) for e in events]

    async def closing(self) -> list[bytes]:
        """After the Generation closed: its usage is the final one."""
        status, _ = ending(self.generation.final)
        response = self.snapshot(status, self.output)
        await self.keep(response, self.output)
        return [sse(self._lifecycle(f"response.{status}", response))]

    def failed(self, error: AppError) -> bytes:
        response = self.snapshot("failed", self.output)
        response.error = ResponseError(error.code or error.type, error.message)
        response.usage = usage_of(self.generation.log)
        return sse(self._lifecycle("response.failed", response))

    def _lifecycle(self, kind: str, response: ResponseBody) -> ResponseEvent:
        return ResponseEvent(type=kind, sequence_number=self.output.next_sequence(), response=response)
