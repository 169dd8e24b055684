"""Tool turns of a conversation in the HF shape chat templates take: an assistant's calls with their arguments
as a dict, and tool results tied to an earlier call by id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from web.errors import InvalidRequest
from web.tools.calls import loads


def hf_call(call_id: str, name: str, arguments: str | dict[str, Any], param: str) -> dict[str, Any]:
    """One call of an assistant turn. Clients send OpenAI's arguments as JSON text; templates index into a dict,
    so text that is not a JSON object is refused, naming `param`."""
    value = loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(value, dict):
        raise InvalidRequest(f"{param} must be a JSON object as a string", param=param)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": value}}


def unmatched_tool_result(messages: Sequence[dict[str, Any]]) -> int | None:
    """The index of the first tool message whose tool_call_id no earlier assistant call has, if any."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or ():
            seen.add(call["id"])
        if m["role"] == "tool" and m.get("tool_call_id") not in seen:
            return i
    return None
