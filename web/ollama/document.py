"""Ollama's API in the OpenAPI document (web/system/openapi.py): its bodies and answers from web/ollama/schemas.py
(components named Ollama*), its error shape {"error": ...} and the statuses each route answers."""

from __future__ import annotations

from typing import Any

import msgspec

from web.ollama.schemas import (
    ChatLine,
    ChatRequest,
    Embedded,
    EmbedRequest,
    GenerateLine,
    GenerateRequest,
    LegacyEmbedded,
    LegacyEmbedRequest,
    ModelRequest,
    Running,
    Shown,
    Tags,
    Version,
)

PREFIX = "Ollama"
REF = "#/components/schemas/{name}"
ERROR = PREFIX + "Error"
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {"type": "string", "minLength": 1}},
}
GENERATING = (400, 401, 404, 413, 429, 503)  # bad body; key; unknown model; too large; quota; not ready
MANAGED = (401, 403)
# path -> method, its body, its answer, the refusals it answers with
OPERATIONS: dict[str, tuple[str, type | None, type | None, tuple[int, ...]]] = {
    "/api/version": ("get", None, Version, ()),
    "/api/tags": ("get", None, Tags, (401,)),
    "/api/ps": ("get", None, Running, (401,)),
    "/api/show": ("post", ModelRequest, Shown, (400, 401, 404, 413)),
    "/api/chat": ("post", ChatRequest, ChatLine, GENERATING),
    "/api/generate": ("post", GenerateRequest, GenerateLine, GENERATING),
    "/api/embed": ("post", EmbedRequest, Embedded, GENERATING),
    "/api/embeddings": ("post", LegacyEmbedRequest, LegacyEmbedded, GENERATING),
    **{f"/api/{name}": ("post", None, None, MANAGED) for name in ("pull", "push", "create", "copy")},
    "/api/delete": ("delete", None, None, MANAGED),
}


def _components() -> dict[str, Any]:
    types = {t for _, body, answer, _ in OPERATIONS.values() for t in (body, answer) if t is not None}
    _, components = msgspec.json.schema_components(
        sorted(types, key=lambda t: t.__name__), ref_template=REF.format(name=PREFIX + "{name}")
    )
    return {PREFIX + name: schema for name, schema in components.items()}


def complete(doc: dict[str, Any], model: str | None) -> None:
    """Describe Ollama's operations in `doc` (already holding what Litestar generated for them)."""
    components = doc["components"]["schemas"]
    mine = _components()
    clash = set(mine) & set(components)
    assert not clash, f"schema component names used twice: {sorted(clash)}"
    components.update(mine)
    components[ERROR] = ERROR_SCHEMA
    if model is not None:
        for name in ("ChatRequest", "GenerateRequest"):
            components[PREFIX + name]["properties"]["model"] = {"type": "string", "enum": [model, model + ":latest"]}
    error = {"application/json": {"schema": {"$ref": REF.format(name=ERROR)}}}
    refusal = {"description": "A refusal in Ollama's error shape", "content": error}
    for path, (method, body, answer, statuses) in OPERATIONS.items():
        operation = doc["paths"][path][method]
        if body is not None:
            schema = {"$ref": REF.format(name=PREFIX + body.__name__)}
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        responses: dict[str, Any] = {str(status): refusal for status in statuses}
        if answer is not None:
            content: dict[str, Any] = {
                "application/json": {"schema": {"$ref": REF.format(name=PREFIX + answer.__name__)}}
            }
            if answer in (ChatLine, GenerateLine):
                content["application/x-ndjson"] = {"schema": {"type": "string"}}
            responses["200"] = {"description": "OK", "content": content}
        responses["5XX"] = {"description": "A server error in Ollama's error shape", "content": error}
        operation["responses"] = responses
