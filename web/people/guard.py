"""The one session cookie of the chat page and the console, and the guard of their routes: a live session (of an
admin, for the console), and the session's CSRF token on every state-changing request (a header from htmx and
fetch, or a hidden form field)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers import BaseRouteHandler
from litestar.response import Redirect
from litestar.types import ExceptionHandlersMap, Guard

from web.console.render import PAGE_HEADERS
from web.people.sessions import MAX_AGE_S, SessionStore, SignedIn, tokens_match

SESSION_COOKIE = "appliance_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class LoginRequired(Exception):
    """No live session (or not an admin's, where the console asks for one): go to `login_path`."""

    def __init__(self, login_path: str) -> None:
        super().__init__(login_path)
        self.login_path = login_path


class CsrfRejected(Exception):
    """A state-changing request without the session's CSRF token."""


def cookie(connection: ASGIConnection[Any, Any, Any, Any], key: str, value: str, max_age: int, path: str) -> Cookie:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure behind TLS."""
    return Cookie(
        key=key,
        value=value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=connection.url.scheme == "https",
    )


def session_cookie(connection: ASGIConnection[Any, Any, Any, Any], signed_in: SignedIn | None) -> Cookie:
    """The cookie that carries this session, or (None) the one that deletes it."""
    if signed_in is None:
        return cookie(connection, SESSION_COOKIE, "", 0, "/")
    return cookie(connection, SESSION_COOKIE, signed_in.token, MAX_AGE_S, "/")


async def presented_csrf(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
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


def session_guard(store: SessionStore, login_path: str, admin_only: bool = False) -> Guard:
    """Sets connection.state.signed_in; raises LoginRequired or CsrfRejected."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        signed_in = await store.get(connection.cookies.get(SESSION_COOKIE))
        if signed_in is None or (admin_only and signed_in.person.role != "admin"):
            raise LoginRequired(login_path)
        if connection.scope.get("method", "GET") not in SAFE_METHODS and not tokens_match(
            signed_in.csrf_token, await presented_csrf(connection)
        ):
            raise CsrfRejected
        connection.state.signed_in = signed_in

    return guard


def signed_in(request: Request[Any, Any, Any]) -> SignedIn:
    """The session the guard found for this request."""
    found: SignedIn = request.state.signed_in
    return found


def handle_login_required(request: Request[Any, Any, Any], exc: LoginRequired) -> Response[Any]:
    if request.headers.get("hx-request") == "true":
        return Response(b"", status_code=401, headers={"HX-Redirect": exc.login_path})
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return Redirect(f"{exc.login_path}?next={quote(target, safe='')}", status_code=303)


def handle_csrf_rejected(_: Request[Any, Any, Any], __: CsrfRejected) -> Response[str]:
    return Response(
        "This request lacks the page's security token (CSRF). Reload the page and try again.",
        status_code=403,
        media_type="text/plain",
        headers=PAGE_HEADERS,  # an exception handler's response does not get the router's response_headers
    )


EXCEPTION_HANDLERS: ExceptionHandlersMap = {LoginRequired: handle_login_required, CsrfRejected: handle_csrf_rejected}
