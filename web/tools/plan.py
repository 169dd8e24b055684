"""A request's tools decided once, in web terms: what to render, what to constrain, how to read the output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine import GuidedDecoding
from web.tools.calls import Parsed, collect
from web.tools.constraint import constraint
from web.tools.formats import ToolFormat, detect_format
from web.tools.spec import AUTO, ToolChoice, ToolSpec, check_unique
from web.tools.stream import ParseMode, ToolCallStream


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """tools offered, the choice, whether several calls may come at once, and the model's call format."""

    tools: tuple[ToolSpec, ...]
    choice: ToolChoice = AUTO
    parallel: bool = True
    format: ToolFormat = "hermes"

    @classmethod
    def of(
        cls, tools: Sequence[ToolSpec], choice: ToolChoice | None, parallel: bool | None, tokenizer: Any
    ) -> ToolPlan:
        """The plan for this model (its template says the format). The default choice is auto with tools,
        none without (OpenAI's)."""
        check_unique(tools)
        default = AUTO if tools else ToolChoice("none")
        return cls(tuple(tools), choice or default, True if parallel is None else parallel, detect_format(tokenizer))

    @property
    def mode(self) -> ParseMode:
        if not self.tools or self.choice.kind == "none":
            return "off"
        return self.choice.kind

    @property
    def rendered(self) -> tuple[ToolSpec, ...]:
        """The tools the prompt shows: none under tool_choice none (the model is told of no tools, so it answers
        in words; vLLM's default renders them and then parses nothing)."""
        return () if self.mode == "off" else self.tools

    def guided(self) -> GuidedDecoding | None:
        return constraint(self.tools, self.choice, self.parallel)

    def stream(self, id_prefix: str = "call_") -> ToolCallStream:
        names = frozenset(t.name for t in self.tools)
        return ToolCallStream(self.mode, names, self.format, self.choice.name, self.parallel, id_prefix)

    def parse(self, text: str, id_prefix: str = "call_") -> Parsed:
        """A whole answer into content and calls (the stream parser fed all of it, so both agree)."""
        stream = self.stream(id_prefix)
        return collect([*stream.feed(text), *stream.finish()])


NO_TOOLS = ToolPlan(())
