"""The OpenAPI document the fuzzing runs against: Litestar's own generation from the app's route table, completed
where it is silent or wrong (BUGS.md B1): the /v1 bodies from the app's msgspec types, the limits the server
enforces (web/openai/service.py, engine SamplingParams, KeyLimits), and OpenAI's error shape on every refusal."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.config.app import AppConfig
from litestar.openapi import OpenAPIConfig

from engine.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from web.history.record import STATUSES
from web.keys.service import PERIODS
from web.openai.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from web.openai.service import MAX_LOGPROBS

REF = "#/components/schemas/{name}"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1  # what crosses to the engine process in msgpack, and what manual_seed takes (BUGS.md B10)
INT64 = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
ENGINE_INT = {"type": "integer", "minimum": INT64_MIN, "maximum": UINT64_MAX}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
# The request bodies and 200 bodies of the /v1 routes: their handlers read the raw body and return Response[Any],
# so Litestar cannot see these types.
V1_TYPES: dict[tuple[str, str], tuple[type | None, type]] = {
    ("post", "/v1/chat/completions"): (ChatCompletionRequest, ChatCompletion),
    ("post", "/v1/completions"): (CompletionRequest, Completion),
    ("get", "/v1/models"): (None, ModelList),
    ("get", "/v1/models/{model_id}"): (None, ModelCard),
}
# What each event of a stream carries: a chunk, an error after the stream started, or the closing [DONE].
CHUNKS: dict[str, type] = {"/v1/chat/completions": ChatCompletionChunk, "/v1/completions": Completion}
PUBLIC = ("/health", "/ready")


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _bounded(minimum: int, maximum: int = INT64_MAX) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


@dataclass(frozen=True)
class Room:
    """How big generated requests may be. Requests that fit the document must fit the model's context too, which a
    schema cannot say; so valid requests are kept small, while invalid ones break only the server's own limits."""

    text: int | None  # characters of one message or prompt (the fake tokenizer: one token per character)
    items: int | None  # messages, content parts, prompt token ids
    completion: int  # max_tokens

    def cap(self, schema: dict[str, Any], key: str, value: int | None) -> dict[str, Any]:
        return {**schema, key: value} if value is not None else schema


FITS_CONTEXT = Room(text=40, items=4, completion=64)
SERVER_LIMITS = Room(text=None, items=None, completion=INT64_MAX)


def _body_limits(room: Room, vocab: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The limits of the fields both endpoints share, of chat's own fields, and of completions' own fields."""
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
    max_tokens = nullable(_bounded(1, room.completion))
    shared = {
        "max_tokens": max_tokens,
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable(_bounded(-1, UINT64_MAX)),
        "seed": nullable(ENGINE_INT),
        "stop": nullable({"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP_STRINGS}]}),
        "n": nullable({"const": 1}),
        "presence_penalty": nullable({"const": 0}),
        "frequency_penalty": nullable({"const": 0}),
        "logit_bias": nullable({"type": "object", "maxProperties": 0}),
    }
    text = room.cap({"type": "string"}, "maxLength", room.text)
    part = {"type": "object", "required": ["type", "text"], "properties": {"type": {"const": "text"}, "text": text}}
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            # tool and function are OpenAI roles too; this server refuses them (400 unsupported_parameter)
            "role": {"enum": ["system", "developer", "user", "assistant"]},
            "content": {"anyOf": [text, room.cap({"type": "array", "items": part}, "maxItems", room.items)]},
            "name": nullable({"type": "string"}),
            "tool_calls": {"type": "null"},
        },
    }
    chat = {
        "messages": room.cap({"type": "array", "minItems": 1, "items": message}, "maxItems", room.items),
        "max_completion_tokens": max_tokens,
        "top_logprobs": {"type": "null"},  # needs logprobs: true, which a schema cannot say simply; hand cases do
        "tools": {"type": "null"},
        "functions": {"type": "null"},
        "tool_choice": nullable({"const": "none"}),
        "response_format": nullable({"type": "object", "properties": {"type": {"const": "text"}}}),
    }
    prompt_text = room.cap({"type": "string", "minLength": 1}, "maxLength", room.text)
    tokens = room.cap({"type": "array", "minItems": 1, "items": _bounded(0, vocab - 1)}, "maxItems", room.text)
    one = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [prompt_text, tokens]}}
    completion = {
        "prompt": {"anyOf": [prompt_text, tokens, one]},
        "logprobs": nullable(_bounded(0, MAX_LOGPROBS)),
        "echo": {"const": False},
        "suffix": nullable({"const": ""}),
        "best_of": nullable({"const": 1}),
    }
    return shared, chat, completion


def _key_limits(room: Room) -> dict[str, Any]:
    limit = nullable(_bounded(1))
    # Not blank after str.strip(), which strips more than a pattern's \s: valid names are kept simple.
    name = {"type": "string", "pattern": "[0-9A-Za-z]"} if room is FITS_CONTEXT else {"type": "string"}
    return {
        "name": name,
        "max_tokens_per_request": limit,
        "quota_tokens": limit,
        "quota_period": {"enum": list(PERIODS)},
        "max_concurrent": limit,
    }


def generated_document(app: Litestar) -> dict[str, Any]:
    """What Litestar would serve at /schema/openapi.json for this app's routes if the app enabled it."""
    plugin = OpenAPIPlugin(app)
    plugin.on_app_init(AppConfig(openapi_config=OpenAPIConfig(title="LLM appliance", version="0.1.0")))
    for route in app.routes:
        plugin.receive_route(route)
    return copy.deepcopy(plugin.provide_openapi_schema())


def error_statuses(method: str, path: str, operation: dict[str, Any]) -> set[int]:
    """The refusals each operation can answer with, by what it takes and what guards it."""
    statuses = {405}
    if operation.get("parameters") or operation.get("requestBody") or path.startswith("/v1"):
        statuses.add(400)
    if path not in PUBLIC:
        statuses.add(401)
    if "{" in path:
        statuses.add(404)
    if method in ("post", "patch", "put"):
        statuses.add(413)
    if path.startswith("/v1/") and method == "post":
        statuses |= {404, 429, 503}  # unknown model; key quota or concurrency; engine not ready or overloaded
    if path == "/ready":
        statuses.add(503)
    return statuses


def negatable(operation: dict[str, Any]) -> bool:
    """Whether a request can break this operation's document: a body, or a parameter more precise than a string."""
    return "requestBody" in operation or any(p["schema"] != {"type": "string"} for p in operation.get("parameters", []))


def _describe_parameter(path: str, parameter: dict[str, Any]) -> None:
    """The history filters as the server reads them: the statuses there are, ids within SQLite's integers, and
    since/until also as Unix seconds (Litestar parses a number as a timestamp)."""
    name, schema = parameter["name"], parameter["schema"]
    if name in ("key_id", "offset") and schema.get("type") == "integer":
        schema.update(maximum=INT64_MAX, minimum=schema.get("minimum", INT64_MIN))
    if path != "/admin/api/requests":
        return
    if name == "status":
        parameter["schema"] = nullable({"enum": list(STATUSES)})
    elif name in ("since", "until"):
        schema["oneOf"].append({"type": "number", "minimum": 0, "maximum": 253_402_300_799})  # to 9999-12-31
    elif name == "key_id":
        parameter["schema"] = nullable(INT64)


def completed_document(app: Litestar, model: str, vocab: int, room: Room = SERVER_LIMITS) -> dict[str, Any]:
    """The document the app should serve; `model` is the name it serves, `vocab` its tokenizer's size."""
    doc = generated_document(app)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    named = {t for pair in V1_TYPES.values() for t in pair if t is not None} | set(CHUNKS.values())
    types = sorted(named, key=lambda t: t.__name__)
    _, extra = msgspec.json.schema_components(types, ref_template=REF)
    clash = set(extra) & set(components)
    assert not clash, f"component names used twice: {clash}"
    components.update(extra)
    model_name = {"type": "string", "enum": [model]}
    shared, chat, completion = _body_limits(room, vocab)
    for name, limits in (("ChatCompletionRequest", chat), ("CompletionRequest", completion)):
        components[name]["properties"].update({**shared, **limits, "model": model_name})
    for name in ("KeyCreate", "KeyUpdate"):  # forbid_unknown_fields=True
        components[name]["properties"].update(_key_limits(room))
        components[name]["additionalProperties"] = False
    components["OpenAIError"] = ERROR_SCHEMA
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            _complete_operation(path, method, operation)
    return doc


def _event(chunk: type) -> dict[str, Any]:
    payload = {"anyOf": [{"$ref": REF.format(name=chunk.__name__)}, {"$ref": REF.format(name="OpenAIError")}]}
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": payload}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}, "event": {"const": "message"}},
    }


def _complete_operation(path: str, method: str, operation: dict[str, Any]) -> None:
    request_type, response_type = V1_TYPES.get((method, path), (None, None))
    if request_type is not None:
        schema = {"$ref": REF.format(name=request_type.__name__)}
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    for parameter in operation.get("parameters", []):
        _describe_parameter(path, parameter)
    responses = operation["responses"]
    if response_type is not None:
        content = {"application/json": {"schema": {"$ref": REF.format(name=response_type.__name__)}}}
        if request_type is not None:
            content["text/event-stream"] = {"schema": _event(CHUNKS[path])}
        responses["200"] = {"description": "OK", "content": content}
    if path == "/metrics":
        responses["200"] = {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    for status in error_statuses(method, path, operation):
        error = {"application/json": {"schema": {"$ref": REF.format(name="OpenAIError")}}}
        responses[str(status)] = {"description": "An error in OpenAI's shape", "content": error}
