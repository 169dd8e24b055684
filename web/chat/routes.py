"""The chat page at /: a static shell; the browser talks to /v1/chat/completions itself, with the signed-in
person's session (and its CSRF token, which the page carries) or, signed out, with an API key the user enters."""

from typing import Any

from litestar import Request, Router, get
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Template

from web import deps
from web.console.render import PAGE_HEADERS
from web.people.guard import SESSION_COOKIE


@get("/", include_in_schema=False)
async def chat_page(
    request: Request[Any, Any, Any], gate: deps.Gate, router: deps.Router, web_sessions: deps.WebSessions
) -> Template:
    """The page chats with the box's model, or (with remote backends only) the first model they serve."""
    name = gate.model_name
    served = router.served(name) if name else None
    info = served.info if served is not None else gate.client.model_info
    session = await web_sessions.get(request.cookies.get(SESSION_COOKIE))
    signed = session is not None and session.person.may_chat
    context = {
        "model": name or "",
        "max_model_len": info.max_model_len if info else 0,
        "person": session.person.username if session is not None and signed else "",
        "csrf": session.csrf_token if session is not None and signed else "",
    }
    # no-store when signed in: the page carries the session's CSRF token and the person's name.
    headers = {"Cache-Control": "no-store" if signed else "no-cache"}
    return Template(template_name="chat.html", context=context, headers=headers)


chat_router = Router(path="/", route_handlers=[chat_page], request_class=HTMXRequest, response_headers=PAGE_HEADERS)
