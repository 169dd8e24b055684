"""One Messages stream as Anthropic sends it: message_start (usage with the prompt's tokens), ping, each content
block's start, deltas and stop, then message_delta (stop reason, final usage) and message_stop."""

from __future__ import annotations

from engine import RequestOutput
from web.anthropic.errors import sse
from web.anthropic.formatting import Blocks, stop_reason, usage_of
from web.anthropic.schemas import MessageBody, MessageDelta, MessageStart, MessageStop, Ping, StopDelta
from web.generation.run import Generation


class MessageFrames:
    def __init__(self, generation: Generation, rid: str, model: str) -> None:
        self.generation, self.rid, self.model = generation, rid, model
        self.blocks = Blocks()

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        events = []
        if is_first:
            usage = usage_of(self.generation.log)
            start = MessageBody(self.rid, self.model, [], None, None, usage)
            events += [sse("message_start", MessageStart(start)), sse("ping", Ping())]
        events += self.blocks.text(out.text)
        if out.finished and out.finish_reason != "abort":
            events += self.blocks.close()
        return events

    def closing(self) -> list[bytes]:
        """After the Generation closed: its usage is the final one."""
        final = self.generation.final
        assert final is not None  # closing() follows the last delta
        reason, sequence = stop_reason(final, called=False)
        delta = MessageDelta(StopDelta(reason, sequence), usage_of(self.generation.log))
        return [sse("message_delta", delta), sse("message_stop", MessageStop())]
