"""Tool calls for both APIs: the tools a request offers (ToolSpec, ToolChoice), rendered into the chat template
(render.template_inputs, with a fallback prompt for templates without tool support), the grammar behind forced
choices (constraint), and the model's output read back into calls, whole (ToolPlan.parse) or delta by delta
(ToolCallStream, which never lets a call marker out as content).

Use: build ToolSpecs with tool_spec() (naming the body's field in errors), a ToolChoice (named_choice() checks the
name), then ToolPlan.of(specs, choice, parallel, tokenizer); render with template_inputs(hf_messages, plan,
tokenizer), constrain with plan.guided(), read with plan.parse(text) or plan.stream().feed(delta)/finish().
Conversation turns in the HF shape: conversation.hf_call(), conversation.unmatched_tool_result()."""

from web.tools.calls import CallDelta, ContentDelta, Event, Parsed, collect
from web.tools.constraint import constraint
from web.tools.conversation import hf_call, unmatched_tool_result
from web.tools.formats import ToolFormat, detect_format, supports_tools
from web.tools.plan import NO_TOOLS, ToolPlan
from web.tools.render import template_inputs
from web.tools.spec import AUTO, ToolCall, ToolChoice, ToolSpec, named_choice, new_call_id, tool_spec
from web.tools.stream import ToolCallStream

__all__ = [
    "AUTO",
    "NO_TOOLS",
    "CallDelta",
    "ContentDelta",
    "Event",
    "Parsed",
    "ToolCall",
    "ToolCallStream",
    "ToolChoice",
    "ToolFormat",
    "ToolPlan",
    "ToolSpec",
    "collect",
    "constraint",
    "detect_format",
    "hf_call",
    "named_choice",
    "new_call_id",
    "supports_tools",
    "template_inputs",
    "tool_spec",
    "unmatched_tool_result",
]
