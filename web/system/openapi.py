"""The API's OpenAPI document, served to the admin at /admin/api/openapi.json: what Litestar generates from the API
routers, completed where it cannot see: the /v1 bodies (their handlers decode the raw body themselves), the limits
the web room enforces, the statuses guards and limits answer, every refusal in OpenAI's error shape, /metrics as
Prometheus text."""

import copy
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import Any

import msgspec
from litestar import Litestar, Router, get
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.types import Guard

from web import deps
from web.anthropic import document as anthropic_document
from web.db import SQLITE_INT_MAX, SQLITE_INT_MIN
from web.generation.gate import EngineGate
from web.history.record import BACKEND_MAX, STATUSES
from web.keys.periods import PERIODS
from web.ollama import document as ollama_document
from web.openai.document import (
    STREAM_OPTIONS_NEED_STREAM,
    logit_bias_schema,
    max_tokens_schema,
    message_schema,
    prompt_schema,
    template_kwargs_schema,
)
from web.openai.embeddings import INPUT_SCHEMA, EmbeddingList, EmbeddingRequest
from web.openai.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from web.responses import document as responses_document

TITLE = "LLM appliance"
REF = "#/components/schemas/{name}"
ERROR = "OpenAIError"
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
# The /v1 handlers read the raw body and return Response[Any]: Litestar sees neither type.
V1_TYPES: dict[tuple[str, str], tuple[type | None, type]] = {
    ("post", "/v1/chat/completions"): (ChatCompletionRequest, ChatCompletion),
    ("post", "/v1/completions"): (CompletionRequest, Completion),
    ("post", "/v1/embeddings"): (EmbeddingRequest, EmbeddingList),
    ("get", "/v1/models"): (None, ModelList),
    ("get", "/v1/models/{model_id}"): (None, ModelCard),
}
# What each event of a stream carries: a chunk, an error once the stream has started, or the closing [DONE].
CHUNKS: dict[str, type] = {"/v1/chat/completions": ChatCompletionChunk, "/v1/completions": Completion}
PUBLIC = ("/health", "/ready")
BASIC_AUTH = ("/admin/api/", "/metrics")  # the admin's credential, its guesses limited (429)
STATE_CHANGING = ("post", "put", "patch", "delete")
# Unix seconds that are a date-time in the years 1 to 9999 (the history filters take either).
FIRST_SECOND, END_SECOND = -62_135_596_800, 253_402_300_800


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def bounded(minimum: int, maximum: int | None = None) -> dict[str, Any]:
    schema = {"type": "integer", "minimum": minimum}
    return schema if maximum is None else {**schema, "maximum": maximum}


def generated_document(routers: Sequence[Router], dependencies: Mapping[str, Provide]) -> dict[str, Any]:
    """What Litestar generates for these routers, through its public API: an app built only to be read (routers
    are copied when registered, so they can be registered again; their handlers' dependencies must resolve)."""
    config = OpenAPIConfig(title=TITLE, version=version("llm-appliance"), render_plugins=[JsonRenderPlugin()])
    reader = Litestar(
        route_handlers=list(routers), dependencies=dict(dependencies), openapi_config=config, logging_config=None
    )
    schema = reader.openapi_schema.to_schema()
    # By path: a handler of several paths keeps them in a set, whose order changes from process to process.
    schema["paths"] = dict(sorted(schema["paths"].items()))
    return schema


def completed_document(
    generated: dict[str, Any], model: str | None, max_model_len: int | None, vocab: int | None
) -> dict[str, Any]:
    """The generated document completed for the model being served (None while the engine is not ready)."""
    doc = copy.deepcopy(generated)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    named = {t for pair in V1_TYPES.values() for t in pair if t is not None} | set(CHUNKS.values())
    _, extra = msgspec.json.schema_components(sorted(named, key=lambda t: t.__name__), ref_template=REF)
    clash = set(extra) & set(components)
    assert not clash, f"schema component names used twice: {sorted(clash)}"
    components.update(extra)
    _for_the_served_model(components, model, max_model_len, vocab)
    # forbid_unknown_fields=True
    for name in (
        *("KeyCreate", "KeyUpdate", "PersonCreate", "PersonUpdate", "Overrides", "CsvImport"),
        *("InviteCreate", "PlanCreate", "PlanUpdate"),
    ):
        components[name]["additionalProperties"] = False
    components[ERROR] = ERROR_SCHEMA
    responses_document.complete(doc, model, max_model_len)  # before: its body decides the statuses added below
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            _complete_operation(path, method, operation)
    anthropic_document.complete(doc, model, max_model_len)  # after: its operations answer in Anthropic's shape
    ollama_document.complete(doc, model)  # and these in Ollama's
    return doc


def _for_the_served_model(
    components: dict[str, Any], model: str | None, max_model_len: int | None, vocab: int | None
) -> None:
    """The request bodies' declared limits (web/openai/schemas.py) completed with the served model's: its name,
    its context (the prompt takes one token at least), its vocabulary; and the shapes msgspec cannot type."""
    chat, completion = components["ChatCompletionRequest"], components["CompletionRequest"]
    for body in (chat, completion):
        if model is not None:
            body["properties"]["model"] = {"type": "string", "enum": [model]}
        for name in ("max_tokens", "max_completion_tokens"):
            if name in body["properties"]:
                body["properties"][name] = max_tokens_schema(max_model_len - 1 if max_model_len else None)
        body["dependentSchemas"] = STREAM_OPTIONS_NEED_STREAM
        body["properties"]["logit_bias"] = logit_bias_schema(body["properties"]["logit_bias"], vocab)
    chat["properties"]["chat_template_kwargs"] = template_kwargs_schema(chat["properties"]["chat_template_kwargs"])
    completion["properties"]["prompt"] = prompt_schema(vocab)
    components["EmbeddingRequest"]["properties"]["input"] = INPUT_SCHEMA
    components["ChatMessage"] = message_schema(components["ChatMessage"])


def _key_limits() -> dict[str, Any]:
    """KeyLimits.check, and a name that is not empty (one of only spaces is refused too: no pattern says strip())."""
    limit = nullable(bounded(1, SQLITE_INT_MAX))
    return {
        "name": {"type": "string", "minLength": 1},
        "max_tokens_per_request": limit,
        "quota_tokens": limit,
        "quota_period": {"enum": list(PERIODS)},
        "max_concurrent": limit,
    }


def error_statuses(method: str, path: str, operation: dict[str, Any]) -> set[int]:
    """The refusals an operation can answer with, by what it takes and what guards it."""
    statuses = set()
    if operation.get("parameters") or operation.get("requestBody") or path.startswith("/v1/"):
        statuses.add(400)
    if path not in PUBLIC:
        statuses.add(401)
    if path.startswith(BASIC_AUTH):
        statuses.add(429)
        if method in STATE_CHANGING:
            statuses |= {403, 415}  # a cross-site request; a body that is not JSON (web/system/admin_auth.py)
    if "{" in path or path == "/v1/tokenizer":  # an id it does not know; a model it does not publish
        statuses.add(404)
    if "requestBody" in operation:
        statuses.add(413)
    if path in ("/admin/api/users", "/admin/api/invites", "/admin/api/keys") and method == "post":
        statuses.add(404)  # a plan_id (a key's front_end_plan_id) that names no plan
    if path in ("/admin/api/users", "/admin/api/plans") and method == "post":
        statuses.add(409)  # a name taken
    if path == "/admin/api/users/{user_id}" and method in ("patch", "delete"):
        statuses.add(409)  # the last active admin suspended, demoted or deleted
    if path.startswith("/v1/") and method == "post":
        statuses |= {404, 429, 503}  # unknown model; key quota or concurrency; engine not ready or overloaded
    if path == "/ready":
        statuses.add(503)
    return statuses


def _describe_parameter(path: str, parameter: dict[str, Any]) -> None:
    """Ids within SQLite's integers, and the history filters as the server reads them."""
    name = parameter["name"]
    # Litestar writes a parameter's ge/le as floats: SQLite's largest integer, 2**63 - 1, would read 2**63.
    if name == "key_id" or (name == "user_id" and path == "/admin/api/requests"):
        ids = bounded(SQLITE_INT_MIN, SQLITE_INT_MAX)
        parameter["schema"] = ids if parameter["in"] == "path" else nullable(ids)
    elif name == "offset":
        parameter["schema"] = {**bounded(0, SQLITE_INT_MAX), "default": 0}
    if path != "/admin/api/requests":
        return
    if name == "status":
        parameter["schema"] = nullable({"enum": list(STATUSES)})
    elif name == "backend":  # as is_backend_name reads it: no NUL (PostgreSQL refuses one in a query's text)
        parameter["schema"] = nullable(
            {"type": "string", "minLength": 1, "maxLength": BACKEND_MAX, "pattern": "^[^\\x00]*$"}
        )
    elif name in ("since", "until"):
        seconds = {"type": "number", "minimum": FIRST_SECOND, "exclusiveMaximum": END_SECOND}
        parameter["schema"] = {"anyOf": [{"type": "string", "format": "date-time"}, seconds]}
        parameter["description"] = "a date-time with its zone, or Unix seconds; in the years 1 to 9999 in UTC"


def _event(chunk: type) -> dict[str, Any]:
    payload = {"anyOf": [{"$ref": REF.format(name=chunk.__name__)}, {"$ref": REF.format(name=ERROR)}]}
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
        if path in CHUNKS:
            content["text/event-stream"] = {"schema": _event(CHUNKS[path])}
        responses["200"] = {"description": "OK", "content": content}
    if path == "/metrics":
        responses["200"] = {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    error = {"application/json": {"schema": {"$ref": REF.format(name=ERROR)}}}
    for status in error_statuses(method, path, operation):
        responses[str(status)] = {"description": "A refusal in OpenAI's error shape", "content": error}
    responses["5XX"] = {"description": "A server error in OpenAI's error shape", "content": error}


def _served_model(gate: EngineGate, trims: bool) -> tuple[str | None, int | None, int | None]:
    """The served model's name, the context that bounds max_tokens (none where a max_tokens that does not fit is
    trimmed, not refused) and its vocabulary."""
    info, tokenizer = gate.client.model_info, gate.client.tokenizer
    context = info.max_model_len if info and not trims else None
    return gate.model_name, context, len(tokenizer) if tokenizer is not None else None


def document_router(api: Sequence[Router], admin_guard: Guard, dependencies: Mapping[str, Provide]) -> Router:
    """GET /admin/api/openapi.json: the document of `api` and of this route, generated at its first request (the
    route table does not change) and completed for the model being served at each."""
    generated: list[dict[str, Any]] = []

    @get("/openapi.json", sync_to_thread=False)
    def openapi_document(gate: deps.Gate, prompts: deps.Prompts) -> dict[str, Any]:
        if not generated:
            generated.append(generated_document([*api, router], dependencies))
        return completed_document(generated[0], *_served_model(gate, prompts.trim_max_tokens))

    router = Router(path="/admin/api", route_handlers=[openapi_document], guards=[admin_guard])
    return router
