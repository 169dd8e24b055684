"""What a request says about tools, in one shape for both APIs: the tools it offers (ToolSpec), which of them the
model must or may call (ToolChoice), and the calls it made (ToolCall)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from web.errors import InvalidRequest

# OpenAI's rule for function names (Anthropic's is the same): templates and parsers can rely on it.
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function the model may call. `parameters` is its arguments' JSON Schema (an object schema)."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    schema_param: str = "tools"  # the body's field holding `parameters`, for errors: "tools[2].function.parameters"
    name_param: str = "tools"  # and the one holding `name`

    def as_openai(self) -> dict[str, Any]:
        """The shape chat templates take in `tools=` (transformers documents OpenAI's)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


ChoiceKind = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """none: no calls; auto: the model decides; required: at least one call; named: exactly that function."""

    kind: ChoiceKind
    name: str | None = None


AUTO = ToolChoice("auto")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made: `arguments` is a JSON object as text (OpenAI's wire form)."""

    id: str
    name: str
    arguments: str

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as a dict (Anthropic's tool_use.input); a streamed call cut short gives {}."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def new_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


def tool_spec(
    name: str, description: str | None, parameters: Mapping[str, Any] | None, name_param: str, schema_param: str
) -> ToolSpec:
    """A ToolSpec from either API's fields, refused (naming the body's fields, e.g. "tools[2].function.name")
    when its name is not a function name or its parameters are not an object schema. The schema's own validity
    is the grammar compiler's to judge (constraint()), when a forced choice needs it."""
    if not NAME.match(name):
        raise InvalidRequest(f"{name_param}: a function name is 1 to 64 letters, digits, '_' or '-'", param=name_param)
    schema = EMPTY_PARAMETERS if parameters is None else parameters
    kind = schema.get("type", "object")
    if kind != "object":
        raise InvalidRequest(
            f"{schema_param} must describe a JSON object (type 'object'), not {json.dumps(kind)[:64]}",
            param=schema_param,
        )
    try:  # rendered and compiled as JSON text later: a schema nested past the recursion limit cannot be
        json.dumps(schema)
    except RecursionError:
        raise InvalidRequest(f"{schema_param} is nested too deeply", param=schema_param) from None
    return ToolSpec(name, description, schema, schema_param, name_param)


def check_unique(tools: Sequence[ToolSpec]) -> None:
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            raise InvalidRequest(f"a second function named '{tool.name}' in tools", param=tool.name_param)
        seen.add(tool.name)


def named_choice(tools: Sequence[ToolSpec], name: str, param: str = "tool_choice") -> ToolChoice:
    """A choice of one function, which must be among `tools` (else a 400 naming `param`)."""
    if all(t.name != name for t in tools):
        offered = ", ".join(t.name for t in tools) or "none"
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise InvalidRequest(f"tool_choice names '{shown}', which is not in tools (offered: {offered})", param=param)
    return ToolChoice("named", name)
