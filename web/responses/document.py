"""The Responses API in the OpenAPI document (web/system/openapi.py): its body and answers from the structs in
web/responses/ (their components named Responses*), its stream's events; its refusals are OpenAI's error shape,
which the document's common completion adds."""

from __future__ import annotations

from typing import Any

import msgspec

from web.responses.objects import EVENTS, Deleted, ResponseBody
from web.responses.schemas import ResponsesRequest

PREFIX = "Responses"
REF = "#/components/schemas/{name}"
CREATE, ONE = "/v1/responses", "/v1/responses/{response_id}"
ERROR_REF = REF.format(name="OpenAIError")


def _ref(t: type) -> dict[str, str]:
    return {"$ref": REF.format(name=PREFIX + t.__name__)}


def _components() -> dict[str, Any]:
    types = [ResponsesRequest, ResponseBody, Deleted, *EVENTS]
    _, components = msgspec.json.schema_components(types, ref_template=REF.format(name=PREFIX + "{name}"))
    components = {PREFIX + name: schema for name, schema in components.items()}
    # A message item may leave out its type (OpenAI's "easy input message"): the server fills it in.
    message = components[PREFIX + "MessageItem"]
    message["required"] = [name for name in message["required"] if name != "type"]
    items = components[PREFIX + "ResponsesRequest"]["properties"]["input"]["anyOf"][1]["items"]
    items.pop("discriminator", None)  # the type is not always there to tell them apart
    return components


def _stream_event() -> dict[str, Any]:
    payloads = [*(_ref(t) for t in EVENTS), {"$ref": ERROR_REF}]
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": payloads}}
    return {"type": "object", "required": ["event", "data"], "properties": {"event": {"type": "string"}, "data": data}}


def complete(doc: dict[str, Any], model: str | None, max_model_len: int | None) -> None:
    """Describe the Responses API's operations in `doc` (already holding what Litestar generated for them)."""
    components = doc["components"]["schemas"]
    mine = _components()
    clash = set(mine) & set(components)
    assert not clash, f"schema component names used twice: {sorted(clash)}"
    components.update(mine)
    request = components[PREFIX + "ResponsesRequest"]["properties"]
    if max_model_len:
        request["max_output_tokens"] = {
            "anyOf": [{"type": "integer", "minimum": 1, "maximum": max_model_len - 1}, {"type": "null"}]
        }
    if model is not None:
        request["model"] = {"type": "string", "enum": [model]}
    create = doc["paths"][CREATE]["post"]
    create["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(ResponsesRequest)}}}
    answer = {"application/json": {"schema": _ref(ResponseBody)}}
    create["responses"]["200"] = {
        "description": "OK",
        "content": {**answer, "text/event-stream": {"schema": _stream_event()}},
    }
    one = doc["paths"][ONE]
    one["get"]["responses"]["200"] = {"description": "OK", "content": answer}
    deleted = {"application/json": {"schema": _ref(Deleted)}}
    one["delete"]["responses"]["200"] = {"description": "OK", "content": deleted}
