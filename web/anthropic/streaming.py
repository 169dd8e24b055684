"""One Messages stream as Anthropic sends it: message_start (usage with the prompt's tokens), ping, each content
block's start, deltas and stop (text, or a tool call's input as JSON fragments), then message_delta (stop
reason, final usage) and message_stop."""

from __future__ import annotations

from engine import RequestOutput
from web.anthropic.errors import sse
from web.anthropic.formatting import CALL_ID_PREFIX, Blocks, stop_reason, usage_of
from web.anthropic.schemas import MessageBody, MessageDelta, MessageStart, MessageStop, Ping, StopDelta
from web.generation.run import Generation
from web.tools import CallDelta, ContentDelta, ToolPlan


class MessageFrames:
    def __init__(self, generation: Generation, rid: str, model: str, plan: ToolPlan) -> None:
        self.generation, self.rid, self.model = generation, rid, model
        self.blocks = Blocks()
        self.calls = plan.stream(CALL_ID_PREFIX) if plan.mode != "off" else None

    def frames(self, out: RequestOutput, is_first: bool) -> list[bytes]:
        events = []
        if is_first:
            usage = usage_of(self.generation.log)
            start = MessageBody(self.rid, self.model, [], None, None, usage)
            events += [sse("message_start", MessageStart(start)), sse("ping", Ping())]
        ended = out.finished and out.finish_reason != "abort"
        if self.calls is None:
            events += self.blocks.text(out.text)
        else:
            for event in self.calls.feed(out.text) + (self.calls.finish() if ended else []):
                events += self._block_events(event)
        if ended:
            events += self.blocks.close()
        return events

    def _block_events(self, event: ContentDelta | CallDelta) -> list[bytes]:
        if isinstance(event, ContentDelta):
            return self.blocks.text(event.text)
        if event.id is not None and event.name is not None:
            return self.blocks.tool_use(event.id, event.name, event.arguments)
        return self.blocks.arguments(event.arguments)

    async def closing(self) -> list[bytes]:
        """After the Generation closed: its usage is the final one."""
        final = self.generation.final
        assert final is not None  # closing() follows the last delta
        reason, sequence = stop_reason(final, called=self.calls is not None and self.calls.calls > 0)
        delta = MessageDelta(StopDelta(reason, sequence), usage_of(self.generation.log))
        return [sse("message_delta", delta), sse("message_stop", MessageStop())]
