"""The OpenAPI document the fuzzing runs against: the one the app serves (web/system/openapi.py), fetched as a client
fetches it, with the engine's sampling limits added (the web room may not import them: engine does not export
them), and, for the requests meant to be valid, kept within the fake model's context and clear of what a schema
cannot say."""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from engine.sampling_params import MAX_REPETITION_PENALTY, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from tests.web.conftest import ADMIN, web_config
from tests.web.fakes import FakeEngineClient
from web.app import create_app
from web.system.openapi import bounded, nullable

DOCUMENT_PATH = "/admin/api/openapi.json"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1  # what crosses to the engine process in msgpack, and what manual_seed takes (BUGS.md B10)
# Requests that fit the document must fit the model's context too, which a schema cannot say: valid requests are
# kept small (characters of a text, items of a list, max_tokens), while invalid ones break only the server's limits.
TEXT, ITEMS, COMPLETION = 40, 4, 64
# A date-time on the calendar's first or last day may leave it once in UTC (refused: 400); RFC 3339 cannot say so.
INSIDE_THE_CALENDAR = "^(?!0001-01-01|9999-12-31)"


def served_document() -> dict[str, Any]:
    """GET the document from the app on the fake engine, once the model is loaded (the document names it)."""
    with tempfile.TemporaryDirectory() as directory:
        app = create_app(web_config(Path(directory) / "appliance.db"), FakeEngineClient())
        with TestClient(app=app) as http:
            deadline = time.monotonic() + 60  # a hung app, not a slow one: these run beside the rest of the suite
            while http.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "the app never became ready"
                time.sleep(0.01)
            response = http.get(DOCUMENT_PATH, headers=ADMIN)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def _requests(doc: dict[str, Any]) -> list[dict[str, Any]]:
    schemas = doc["components"]["schemas"]
    return [schemas["ChatCompletionRequest"]["properties"], schemas["CompletionRequest"]["properties"]]


def with_engine_limits(served: dict[str, Any]) -> dict[str, Any]:
    """The limits engine/sampling_params.py enforces on the fields both /v1 bodies share."""
    doc = copy.deepcopy(served)
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
    limits = {
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable(bounded(-1, INT64_MAX)),
        "seed": nullable(bounded(INT64_MIN, UINT64_MAX)),
        "stop": nullable({"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP_STRINGS}]}),
        "repetition_penalty": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_REPETITION_PENALTY}),
    }
    for properties in _requests(doc):
        properties.update(limits)
    responses = doc["components"]["schemas"]["ResponsesResponsesRequest"]["properties"]
    responses.update({name: limit for name, limit in limits.items() if name in responses})
    messages = doc["components"]["schemas"]["AnthropicMessagesRequest"]["properties"]
    messages["stop_sequences"] = nullable({"type": "array", "items": stop, "maxItems": MAX_STOP_STRINGS})
    return doc


def _walk(schema: Any, change: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(schema, dict):
        change(schema)
        for value in schema.values():
            _walk(value, change)
    elif isinstance(schema, list):
        for value in schema:
            _walk(value, change)


def _small(schema: dict[str, Any]) -> None:
    if schema.get("type") == "string" and not {"const", "enum", "format"} & schema.keys():
        schema["maxLength"] = min(schema.get("maxLength", TEXT), TEXT)
    if schema.get("type") == "array":
        schema["maxItems"] = min(schema.get("maxItems", ITEMS), ITEMS)


def fits_context(served: dict[str, Any]) -> dict[str, Any]:
    """For valid requests: small enough for the fake model's context, and clear of the rules that tie two fields
    (top_logprobs needs logprobs: true; seed and n), a name that str.strip() leaves blank, and the calendar's
    edges."""
    doc = with_engine_limits(served)
    chat, completion = _requests(doc)
    max_tokens = nullable(bounded(1, COMPLETION))
    for properties in (chat, completion):
        properties["max_tokens"] = max_tokens
        properties["seed"] = nullable(bounded(INT64_MIN, UINT64_MAX - 8))  # n choices: seed .. seed + n - 1
    chat["max_completion_tokens"] = max_tokens
    chat["top_logprobs"] = {"type": "null"}
    _walk(chat["messages"], _small)
    _walk(completion["prompt"], _small)
    schemas = doc["components"]["schemas"]
    # Tools: the fallback prompt listing them outgrows the fake model's context, a named tool_choice must name one
    # of the tools, a tool result must answer an earlier call, and a call's arguments must be JSON text.
    chat["tools"] = {"type": "null"}
    chat["tool_choice"] = nullable({"const": "none"})
    message = schemas["ChatMessage"]
    message["anyOf"] = [m for m in message["anyOf"] if m["properties"]["role"] != {"const": "tool"}]
    for branch in message["anyOf"]:
        branch["properties"].pop("tool_calls", None)
    # Any JSON Schema fits the document; only the engine's compiler says which ones it can enforce.
    schemas["JsonSchemaSpec"]["properties"]["schema"] = nullable({"const": {"type": "object"}})
    _anthropic_fits(schemas)
    _responses_fit(schemas)
    for name in ("KeyCreate", "KeyUpdate"):
        schemas[name]["properties"]["name"] = {"type": "string", "pattern": "[0-9A-Za-z]"}
    for parameter in doc["paths"]["/admin/api/requests"]["get"]["parameters"]:
        if parameter["name"] in ("since", "until"):
            parameter["schema"]["anyOf"][0]["pattern"] = INSIDE_THE_CALENDAR
    return doc


def _anthropic_fits(schemas: dict[str, Any]) -> None:
    """The Messages API's valid requests: small, text only (image and document blocks are refused: a text-only
    model), no tool blocks (a tool_result must answer an earlier tool_use, one only in its role's messages), no
    tools (as for chat), and structured output as chat's."""
    for name in ("AnthropicMessagesRequest", "AnthropicCountTokensRequest"):
        properties = schemas[name]["properties"]
        properties["tools"] = {"type": "null"}
        properties["tool_choice"] = {"type": "null"}
        _walk(properties["messages"], _small)
        _walk(properties["system"], _small)
    schemas["AnthropicMessagesRequest"]["properties"]["max_tokens"] = bounded(1, COMPLETION)
    # As response_format's: the compiler says which schemas it can enforce; and one of the two spellings at a time.
    schemas["AnthropicOutputFormat"]["properties"]["schema"] = {"const": {"type": "object"}}
    schemas["AnthropicMessagesRequest"]["properties"]["output_format"] = {"type": "null"}
    content = schemas["AnthropicMessage"]["properties"]["content"]
    blocks = next(branch for branch in content["anyOf"] if branch.get("type") == "array")
    kept = ("AnthropicTextBlock", "AnthropicThinkingBlock", "AnthropicRedactedThinkingBlock")
    blocks["items"] = {"anyOf": [{"$ref": f"#/components/schemas/{name}"} for name in kept]}
    for name in ("AnthropicTextBlock", "AnthropicThinkingBlock", "AnthropicRedactedThinkingBlock", "AnthropicMetadata"):
        _walk(schemas[name], _small)


def _responses_fit(schemas: dict[str, Any]) -> None:
    """The Responses API's valid requests: small, text only, no function call items (an output must answer an
    earlier call, whose arguments are JSON text), no tools (as for chat), no previous response (none is stored: a
    400 naming the setting), a JSON schema the compiler takes."""
    properties = schemas["ResponsesResponsesRequest"]["properties"]
    properties["tools"] = {"type": "null"}
    properties["tool_choice"] = nullable({"enum": ["none", "auto"]})
    properties["previous_response_id"] = {"type": "null"}
    properties["max_output_tokens"] = nullable(bounded(1, COMPLETION))
    properties["seed"] = nullable(bounded(INT64_MIN, UINT64_MAX))
    items = properties["input"]["anyOf"][1]["items"]
    items["anyOf"] = [{"$ref": "#/components/schemas/ResponsesMessageItem"}]
    schemas["ResponsesMessageItem"]["properties"]["role"] = {"enum": ["user", "system", "developer", "assistant"]}
    part = schemas["ResponsesMessageItem"]["properties"]["content"]["anyOf"][1]["items"]
    texts = ("ResponsesInputText", "ResponsesOutputText", "ResponsesRefusal")
    part.pop("discriminator", None)
    part["anyOf"] = [{"$ref": f"#/components/schemas/{name}"} for name in texts]
    schemas["ResponsesJsonSchemaFormat"]["properties"]["schema"] = {"const": {"type": "object"}}
    _walk(properties["input"], _small)
    _walk(properties["instructions"], _small)
    for name in ("ResponsesMessageItem", *texts):
        _walk(schemas[name], _small)


def negatable(operation: dict[str, Any]) -> bool:
    """Whether a request can break this operation's document: a body, or a parameter more precise than a string."""
    return "requestBody" in operation or any(p["schema"] != {"type": "string"} for p in operation.get("parameters", []))
