"""msgspec structs for the tool parts of OpenAI's chat bodies (web/openai/tools.py reads them): tools and
tool_choice as clients send them, the calls of earlier turns, and message.tool_calls and tool-call deltas as
OpenAI returns them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

FunctionName = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$", description="OpenAI's function names")]
MAX_TOOLS = 128  # OpenAI's own limit


class FunctionDef(Struct, kw_only=True):
    name: FunctionName
    description: Annotated[str, Meta(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; None: no arguments
    strict: bool | None = None  # forced choices follow the schema either way; auto parses what the model says


class ToolDef(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class FunctionRef(Struct, kw_only=True):
    name: FunctionName


class NamedToolChoice(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionRef


class CalledFunction(Struct, kw_only=True):
    name: FunctionName
    arguments: str  # a JSON object as text, as OpenAI returns it


class ToolCallIn(Struct, kw_only=True):
    """A call of an earlier assistant turn, as the client sends it back."""

    id: Annotated[str, Meta(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


# -- responses ----------------------------------------------------------------------------------------------


class FunctionCallBody(Struct):
    name: str
    arguments: str


class ToolCallBody(Struct):
    id: str
    function: FunctionCallBody
    type: str = "function"


class FunctionDeltaBody(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaBody(Struct, omit_defaults=True):
    """A call's first delta has its id, type and name; the later ones only more of its arguments."""

    index: int
    function: FunctionDeltaBody
    id: str | None = None
    type: str | None = None
