"""The console's models page: the local models with their size and fit on this machine, the served one marked,
and "Serve this model" (a fit check, a drain, an engine restart: web.system.models.ModelSwitch)."""

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.plugins.htmx import HTMXRequest
from msgspec import Struct

from engine import EngineError
from web import deps
from web.console.auth import page_context
from web.console.render import render
from web.errors import AppError
from web.system.models import ModelSwitch


class ServeForm(Struct, kw_only=True):
    name: str = ""
    csrf_token: str = ""


async def _page(
    request: HTMXRequest, models: ModelSwitch, *, notice: str | None = None, error: str | None = None
) -> dict[str, Any]:
    entries = await models.models()
    return page_context(request, "models", models=entries, notice=notice, error=error, can_switch=bool(entries))


@get("/models")
async def models_page(request: HTMXRequest, models: deps.Models) -> Response[Any]:
    return render("console/models.html", await _page(request, models))


@post("/models/serve")
async def serve_model(
    request: HTMXRequest,
    models: deps.Models,
    data: Annotated[ServeForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    """Waits for the whole switch (drain and load) and answers with the page saying how it went."""
    try:
        entry = await models.switch(data.name)
    except (AppError, EngineError) as exc:  # EngineError: neither model loaded, the engine is down
        message = exc.message if isinstance(exc, AppError) else f"the engine is down: {exc}"
        return render("console/models.html", await _page(request, models, error=message), status_code=409)
    return render("console/models.html", await _page(request, models, notice=f"Now serving {entry.name}."))
