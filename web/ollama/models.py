"""Ollama's model routes: /api/version, /api/tags, /api/show and /api/ps describe what the appliance serves (the
chat models its backends serve, and the embedding model); /api/pull, push, create, copy and delete are refused
with the reason: the operator manages the models (APPLIANCE_MODEL, the console), not the API's clients."""

import hashlib
from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler

from web import deps
from web.backends.router import Router
from web.errors import AppError
from web.generation.intake import read_body
from web.generation.prompts import model_refusal
from web.ollama import service
from web.ollama.schemas import Details, ListedModel, Running, RunningModel, Shown, Tags, Version
from web.ollama.streaming import encoder

# The Ollama API version this dialect follows; clients check it (GitHub Copilot asks for 0.6.4 at least).
OLLAMA_VERSION = "0.12.6"
ARCHITECTURE = "appliance"  # model_info's keys are "<architecture>.<field>"; clients read the context length there
NEVER = "9999-12-31T23:59:59Z"  # /api/ps's expires_at: the appliance keeps its models loaded
AnyRequest = Request[Any, Any, Any]


class OperatorManaged(AppError):
    status_code = 403
    type = "permission_error"
    code = "operator_managed"


def resolved(router: Router, model: str) -> str:
    """The served name an Ollama client means: Ollama's default tag (name:latest) names the model without it."""
    stripped = model.removesuffix(":latest")
    return stripped if stripped != model and stripped in router.model_names() else model


def _digest(name: str) -> str:
    """A stable stand-in for Ollama's content digest (clients use it as an identity): the name's hash."""
    return hashlib.sha256(name.encode()).hexdigest()


def _details(family: str, quantization: str = "") -> Details:
    return Details("safetensors", family, [family], quantization_level=quantization)


def _json(value: Any) -> Response[Any]:
    return Response(encoder.encode(value), media_type="application/json")


def _served(gate: deps.Gate, router: Router) -> list[tuple[str, int, Details]]:
    """Each chat model served now: its name, context and details."""
    models = []
    for name in router.model_names():
        served = router.served(name)
        if served is not None:
            info = served.info
            models.append((name, info.max_model_len, _details(ARCHITECTURE, info.quantization)))
    return models


@get("/version", status_code=200)
async def version() -> Response[Any]:
    return _json(Version(OLLAMA_VERSION))


@get("/tags", status_code=200)
async def tags(gate: deps.Gate, router: deps.Router, embedder: deps.Embedder) -> Response[Any]:
    started = _started(gate)
    listed = [ListedModel(n, n, started, 0, _digest(n), details) for n, _, details in _served(gate, router)]
    if (info := embedder.info) is not None:
        listed.append(ListedModel(info.name, info.name, started, 0, _digest(info.name), _details("bert")))
    return _json(Tags(listed))


@get("/ps", status_code=200)
async def ps(gate: deps.Gate, router: deps.Router, embedder: deps.Embedder) -> Response[Any]:
    running = [
        RunningModel(n, n, 0, _digest(n), details, NEVER, 0, context) for n, context, details in _served(gate, router)
    ]
    if (info := embedder.info) is not None:
        name = info.name
        running.append(RunningModel(name, name, 0, _digest(name), _details("bert"), NEVER, 0, info.max_input_tokens))
    return _json(Running(running))


@post("/show", status_code=200)
async def show(request: AnyRequest, gate: deps.Gate, router: deps.Router, embedder: deps.Embedder) -> Response[Any]:
    name = service.model_name(service.decode_model(await read_body(request)))
    model = resolved(router, name)
    started = _started(gate)
    served = router.served(model)
    if served is not None:
        context, capabilities = served.info.max_model_len, ["completion", "tools"]
        details = _details(ARCHITECTURE, served.info.quantization)
    elif (info := embedder.info) is not None and info.name == name.removesuffix(":latest"):
        model, context, capabilities, details = info.name, info.max_input_tokens, ["embedding"], _details("bert")
    else:
        raise model_refusal(router, model)
    model_info = {
        "general.architecture": ARCHITECTURE,
        "general.basename": model,
        f"{ARCHITECTURE}.context_length": context,
    }
    return _json(Shown("", "", "", details, model_info, capabilities, started))


def _started(gate: deps.Gate) -> str:
    """When the appliance started serving: the models' modified_at."""
    return datetime.fromtimestamp(gate.started_at, UTC).isoformat().replace("+00:00", "Z")


def _managed(action: str) -> OperatorManaged:
    return OperatorManaged(
        f"{action} is not available: this appliance's models are managed by its operator (APPLIANCE_MODEL, "
        "APPLIANCE_EMBEDDING_MODEL and the admin console); /api/tags lists the models it serves"
    )


@post(["/pull", "/push", "/create", "/copy"], status_code=200)
async def manage(request: AnyRequest) -> None:
    raise _managed(request.url.path.removeprefix("/api/"))


@delete("/delete", status_code=200)
async def remove() -> None:
    raise _managed("delete")


def info_routes() -> tuple[list[HTTPRouteHandler], list[HTTPRouteHandler]]:
    """The open routes (version), and those behind the API key."""
    return [version], [tags, ps, show, manage, remove]
