"""The Messages API in the OpenAPI document (web/system/openapi.py): its bodies and answers from the structs in
web/anthropic/schemas.py (their components named Anthropic*, beside OpenAI's), Anthropic's error shape and its
statuses (529 for an engine queue that is full)."""

from __future__ import annotations

from typing import Any

import msgspec

from web.anthropic.errors import OVERLOADED
from web.anthropic.schemas import (
    BlockDelta,
    BlockStart,
    BlockStop,
    CountTokensRequest,
    MessageBody,
    MessageDelta,
    MessagesRequest,
    MessageStart,
    MessageStop,
    Ping,
    TokenCount,
)

PREFIX = "Anthropic"
REF = "#/components/schemas/{name}"
ERROR = PREFIX + "Error"
ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "message": {"type": "string", "minLength": 1}},
        },
    },
}
OPERATIONS: dict[str, tuple[type, type]] = {
    "/v1/messages": (MessagesRequest, MessageBody),
    "/v1/messages/count_tokens": (CountTokensRequest, TokenCount),
}
EVENTS = (MessageStart, BlockStart, Ping, BlockDelta, BlockStop, MessageDelta, MessageStop)
# bad body; key; unknown model; too large; quota or concurrency; not ready; overloaded (messages only)
STATUSES = (400, 401, 404, 413, 429, 503)


def _components() -> dict[str, Any]:
    types = [t for pair in OPERATIONS.values() for t in pair] + list(EVENTS)
    _, components = msgspec.json.schema_components(types, ref_template=REF.format(name=PREFIX + "{name}"))
    return {PREFIX + name: schema for name, schema in components.items()}


def _stream_event() -> dict[str, Any]:
    """One event of a stream: its `event:` line names its data's type; an `error` event once the stream began."""
    names = [t.__struct_config__.tag for t in EVENTS]
    payloads = [{"$ref": REF.format(name=PREFIX + t.__name__)} for t in EVENTS] + [{"$ref": REF.format(name=ERROR)}]
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": payloads}}
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"enum": [*names, "error"]}, "data": data},
    }


def complete(doc: dict[str, Any], model: str | None, max_model_len: int | None) -> None:
    """Describe the Messages API's operations in `doc` (already holding what Litestar generated for them)."""
    components = doc["components"]["schemas"]
    mine = _components()
    clash = set(mine) & set(components)
    assert not clash, f"schema component names used twice: {sorted(clash)}"
    components.update(mine)
    components[ERROR] = ERROR_SCHEMA
    request = components[PREFIX + "MessagesRequest"]["properties"]
    if max_model_len:
        request["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": max_model_len - 1}
    if model is not None:
        for name in ("MessagesRequest", "CountTokensRequest"):
            components[PREFIX + name]["properties"]["model"] = {"type": "string", "enum": [model]}
    error = {"application/json": {"schema": {"$ref": REF.format(name=ERROR)}}}
    for path, (body, answer) in OPERATIONS.items():
        operation = doc["paths"][path]["post"]
        schema = {"$ref": REF.format(name=PREFIX + body.__name__)}
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        content: dict[str, Any] = {"application/json": {"schema": {"$ref": REF.format(name=PREFIX + answer.__name__)}}}
        if body is MessagesRequest:
            content["text/event-stream"] = {"schema": _stream_event()}
        statuses = STATUSES + ((OVERLOADED,) if body is MessagesRequest else ())
        refusal = {"description": "A refusal in Anthropic's error shape", "content": error}
        operation["responses"] = {
            "200": {"description": "OK", "content": content},
            **{str(status): refusal for status in statuses},
            "5XX": {"description": "A server error in Anthropic's error shape", "content": error},
        }
