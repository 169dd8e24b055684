"""Console login and its guards: server-side sessions behind an HttpOnly SameSite=Strict cookie, a CSRF token
on every state-changing request (header from htmx, or hidden form field), failed logins limited per address."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

from litestar import Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.handlers import BaseRouteHandler
from litestar.params import Body, FromQuery
from litestar.plugins.htmx import HTMXRequest, HTMXTemplate
from litestar.response import Redirect
from litestar.types import Guard
from msgspec import Struct

from web import deps
from web.console.live import ThroughputMeter
from web.console.render import PAGE_HEADERS, render
from web.console.sessions import MAX_AGE_S, AdminSession, SessionStore, tokens_match
from web.errors import AdminAuthRequired, RateLimited
from web.system.admin_auth import client_address

SESSION_COOKIE = "appliance_admin"
LOGIN_COOKIE = "appliance_login"  # pre-session CSRF token of the login form (double submit)
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_PATH = "/admin/login"


@dataclass(slots=True)
class ConsoleState:
    """What the console keeps in memory for one app: sessions and the throughput meter (failed logins are the
    admin credential's to count: AdminAuth)."""

    sessions: SessionStore = field(default_factory=SessionStore)
    throughput: ThroughputMeter = field(default_factory=ThroughputMeter)


Console = NamedDependency[ConsoleState]  # provided per app by web.console.mount


class LoginRequired(Exception):
    """No live admin session: plain visits are redirected to the login page, htmx is told to go there."""


class CsrfRejected(Exception):
    """A state-changing request without the session's CSRF token."""


def _cookie(request: ASGIConnection[Any, Any, Any, Any], key: str, value: str, max_age: int, path: str) -> Cookie:
    return Cookie(
        key=key,
        value=value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def _presented_csrf(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    header = connection.headers.get(CSRF_HEADER)
    if header:
        return header
    content_type = connection.headers.get("content-type", "")
    if isinstance(connection, Request) and content_type.startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        value = (await connection.form()).get(CSRF_FIELD)
        return value if isinstance(value, str) else None
    return None


def session_guard(console: ConsoleState) -> Guard:
    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        session = console.sessions.get(connection.cookies.get(SESSION_COOKIE))
        if session is None:
            raise LoginRequired
        if connection.scope.get("method", "GET") not in SAFE_METHODS and not tokens_match(
            session.csrf_token, await _presented_csrf(connection)
        ):
            raise CsrfRejected
        connection.state.admin_session = session

    return guard


def admin_session(request: Request[Any, Any, Any]) -> AdminSession:
    session: AdminSession = request.state.admin_session
    return session


def handle_login_required(request: Request[Any, Any, Any], _: LoginRequired) -> Response[Any]:
    if request.headers.get("hx-request") == "true":
        return Response(b"", status_code=401, headers={"HX-Redirect": LOGIN_PATH})
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return Redirect(f"{LOGIN_PATH}?next={quote(target, safe='')}", status_code=303)


def handle_csrf_rejected(_: Request[Any, Any, Any], __: CsrfRejected) -> Response[str]:
    return Response(
        "This request lacks the page's security token (CSRF). Reload the page and try again.",
        status_code=403,
        media_type="text/plain",
        headers=PAGE_HEADERS,  # an exception handler's response does not get the router's response_headers
    )


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
    page.cookies.append(_cookie(request, LOGIN_COOKIE, token, 3600, LOGIN_PATH))
    return page


@get("/login")
async def login_page(request: HTMXRequest, console: Console, next: FromQuery[str] = "") -> Response[Any]:
    if console.sessions.get(request.cookies.get(SESSION_COOKIE)) is not None:
        return Redirect(_safe_next(next), status_code=303)
    return _login_page(request, next_path=next)


@post("/login")
async def login(
    request: HTMXRequest,
    console: Console,
    admin: deps.Admin,
    data: Annotated[LoginForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    if not tokens_match(request.cookies.get(LOGIN_COOKIE, ""), data.csrf_token):
        return _login_page(
            request, error="The login form expired. Please sign in again.", status_code=403, next_path=data.next
        )
    try:
        await admin.sign_in(data.username, data.password, client_address(request))
    except RateLimited as exc:
        wait = int(exc.headers["Retry-After"])
        message = f"Too many failed sign-ins from your address. Try again in {wait} s."
        return _login_page(request, error=message, status_code=429, next_path=data.next, retry=wait)
    except AdminAuthRequired as exc:
        if exc.message.startswith("no admin credential"):
            return _login_page(request, error=exc.message, status_code=503, next_path=data.next)
        return _login_page(request, error="Wrong user name or password.", status_code=401, next_path=data.next)
    console.sessions.end(request.cookies.get(SESSION_COOKIE))  # a fresh session id at every sign-in
    session = console.sessions.create()
    response = Redirect(_safe_next(data.next), status_code=303)
    response.cookies.append(_cookie(request, SESSION_COOKIE, session.token, MAX_AGE_S, "/admin"))
    response.cookies.append(_cookie(request, LOGIN_COOKIE, "", 0, LOGIN_PATH))
    return response


@post("/logout")
async def logout(request: HTMXRequest, console: Console) -> Response[Any]:
    console.sessions.end(request.cookies.get(SESSION_COOKIE))
    response = Redirect(LOGIN_PATH, status_code=303)
    response.cookies.append(_cookie(request, SESSION_COOKIE, "", 0, "/admin"))
    return response


def page_context(request: Request[Any, Any, Any], page: str, **values: Any) -> dict[str, Any]:
    """What every console page's layout needs: the CSRF token (meta tag, hx-headers, hidden fields) and the
    active navigation entry."""
    return {"csrf": admin_session(request).csrf_token, "page": page, **values}
