"""Console sign-in: an admin account's name and password (web/people) start the one server-side session the chat
page also uses; the login form carries its own double-submit token; failed sign-ins are limited per address and per
name (web/people/signin.py)."""

import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromQuery
from litestar.plugins.htmx import HTMXRequest, HTMXTemplate
from litestar.response import Redirect
from msgspec import Struct

from web import deps
from web.console.live import ThroughputMeter
from web.console.render import render
from web.errors import AdminAuthRequired, RateLimited
from web.people.guard import CSRF_FIELD as CSRF_FIELD
from web.people.guard import CSRF_HEADER as CSRF_HEADER
from web.people.guard import SESSION_COOKIE as SESSION_COOKIE
from web.people.guard import cookie, session_cookie, signed_in
from web.people.sessions import tokens_match
from web.system.admin_auth import client_address

LOGIN_COOKIE = "appliance_login"  # pre-session CSRF token of the login form (double submit)
LOGIN_PATH = "/admin/login"


@dataclass(slots=True)
class ConsoleState:
    """What the console keeps in memory for one app: the throughput meter (sessions are in the database)."""

    throughput: ThroughputMeter = field(default_factory=ThroughputMeter)


Console = NamedDependency[ConsoleState]  # provided per app by web.console.mount


class LoginForm(Struct, kw_only=True):
    username: str = "admin"
    password: str = ""
    csrf_token: str = ""
    next: str = ""


def _safe_next(target: str) -> str:
    """Only a path inside the console; never another origin (`//host`, `/\\host`) or a scheme."""
    if target.startswith("/admin") and not target.startswith(("//", "/\\")) and "\\" not in target:
        return target
    return "/admin"


def _login_page(
    request: HTMXRequest, *, error: str | None = None, status_code: int = 200, next_path: str = "", retry: int = 0
) -> HTMXTemplate:
    token = secrets.token_urlsafe(24)
    page = render(
        "console/login.html",
        {"error": error, "login_token": token, "next": next_path},
        status_code=status_code,
        headers={"Retry-After": str(retry)} if retry else None,
    )
    page.cookies.append(cookie(request, LOGIN_COOKIE, token, 3600, LOGIN_PATH))
    return page


@get("/login")
async def login_page(request: HTMXRequest, web_sessions: deps.WebSessions, next: FromQuery[str] = "") -> Response[Any]:
    current = await web_sessions.get(request.cookies.get(SESSION_COOKIE))
    if current is not None and current.person.role == "admin":
        return Redirect(_safe_next(next), status_code=303)
    return _login_page(request, next_path=next)


@post("/login")
async def login(
    request: HTMXRequest,
    web_sessions: deps.WebSessions,
    admin: deps.Admin,
    data: Annotated[LoginForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    if not tokens_match(request.cookies.get(LOGIN_COOKIE, ""), data.csrf_token):
        return _login_page(
            request, error="The login form expired. Please sign in again.", status_code=403, next_path=data.next
        )
    try:
        person = await admin.sign_in(data.username, data.password, client_address(request))
    except RateLimited as exc:
        wait = int(exc.headers["Retry-After"])
        message = f"Too many failed sign-ins from your address or for this name. Try again in {wait} s."
        return _login_page(request, error=message, status_code=429, next_path=data.next, retry=wait)
    except AdminAuthRequired as exc:
        if exc.message.startswith("no admin credential"):
            return _login_page(request, error=exc.message, status_code=503, next_path=data.next)
        return _login_page(request, error="Wrong user name or password.", status_code=401, next_path=data.next)
    await web_sessions.end(request.cookies.get(SESSION_COOKIE))  # a fresh session id at every sign-in
    session = await web_sessions.create(person.id, client_address(request))
    response = Redirect(_safe_next(data.next), status_code=303)
    response.cookies.append(session_cookie(request, session))
    response.cookies.append(cookie(request, LOGIN_COOKIE, "", 0, LOGIN_PATH))
    return response


@post("/logout")
async def logout(request: HTMXRequest, web_sessions: deps.WebSessions) -> Response[Any]:
    await web_sessions.end(request.cookies.get(SESSION_COOKIE))
    response = Redirect(LOGIN_PATH, status_code=303)
    response.cookies.append(session_cookie(request, None))
    return response


def page_context(request: Request[Any, Any, Any], page: str, **values: Any) -> dict[str, Any]:
    """What every console page's layout needs: the CSRF token (meta tag, hx-headers, hidden fields) and the
    active navigation entry."""
    return {"csrf": signed_in(request).csrf_token, "page": page, **values}
