"""The chat page at /: a static shell; the browser talks to /v1/chat/completions itself with the user's key."""

from __future__ import annotations

from litestar import Router, get
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Template

from web import deps
from web.console.render import PAGE_HEADERS


@get("/", include_in_schema=False, sync_to_thread=False)
def chat_page(gate: deps.Gate, router: deps.Router) -> Template:
    """The page chats with the box's model, or (with remote backends only) the first model they serve."""
    name = gate.model_name
    served = router.served(name) if name else None
    info = served.info if served is not None else gate.client.model_info
    context = {"model": name or "", "max_model_len": info.max_model_len if info else 0}
    return Template(template_name="chat.html", context=context, headers={"Cache-Control": "no-cache"})


chat_router = Router(path="/", route_handlers=[chat_page], request_class=HTMXRequest, response_headers=PAGE_HEADERS)
