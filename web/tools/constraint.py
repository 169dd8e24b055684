"""The grammar behind tool_choice required and named: a JSON schema the engine's guided decoding enforces, so
the arguments always match the function's parameters schema (unless max_tokens cuts the output short)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine import GuidedDecoding, InvalidRequestError, validate_guided
from web.errors import InvalidRequest
from web.tools.spec import ToolChoice, ToolSpec


def call_schema(tool: ToolSpec) -> dict[str, Any]:
    """One call as the output spells it under tool_choice required: {"name": ..., "arguments": {...}}."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _checked(tool: ToolSpec) -> ToolSpec:
    """The tool, once the grammar compiler accepts its parameters schema (else a 400 naming that tool's field)."""
    try:
        validate_guided(GuidedDecoding(kind="json_schema", schema=json.dumps(dict(tool.parameters))))
    except InvalidRequestError as exc:
        raise InvalidRequest(f"{tool.schema_param}: {exc}", param=tool.schema_param) from None
    return tool


def constraint(tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool) -> GuidedDecoding | None:
    """named: the output IS the arguments object (the name is known, so the model spends no tokens on it);
    required: one call object (any of the tools), or an array of at least one when `parallel`; otherwise none.
    Each schema the grammar uses is checked first, so a bad one is refused naming its tool."""
    if choice.kind == "named":
        tool = _checked(next(t for t in tools if t.name == choice.name))
        schema: dict[str, Any] = dict(tool.parameters)
    elif choice.kind == "required" and tools:
        calls = [call_schema(_checked(t)) for t in tools]
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
    else:
        return None
    return GuidedDecoding(kind="json_schema", schema=json.dumps(schema))
