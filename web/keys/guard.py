"""The API-key guard of the /v1 routes: runs before the body is read, so a missing key is 401 whatever the body."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from web.errors import AuthenticationFailed
from web.keys.info import KeyInfo
from web.keys.keyless import Keyless
from web.keys.service import KeyService
from web.models import utcnow
from web.people.guard import CSRF_HEADER, SESSION_COOKIE
from web.people.plans import run_as_owner
from web.people.sessions import SessionStore, tokens_match

# The routes the chat page calls with its session instead of a key.
SESSION_PATHS = frozenset({"/v1/chat/completions", "/v1/models"})


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthenticationFailed("the Authorization header must be 'Bearer <API key>'")
    return token.strip() or None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key as OpenAI's clients send it (Authorization: Bearer) or Anthropic's (x-api-key, which wins)."""
    api_key = headers.get("x-api-key")
    if api_key is not None:
        return api_key.strip() or None
    return bearer_token(headers.get("authorization"))


async def signed_in_person(connection: ASGIConnection[Any, Any, Any, Any], store: SessionStore) -> KeyInfo | None:
    """The person the chat page's session cookie names, as their requests run (their plan's limits), on the routes
    the chat page calls, with the session's CSRF token in its header (a page of another site can send the cookie,
    never the header); None without a cookie."""
    cookie = connection.cookies.get(SESSION_COOKIE)
    if not cookie or connection.scope["path"] not in SESSION_PATHS:
        return None
    session = await store.get(cookie)
    if session is None or not session.person.may_chat:
        raise AuthenticationFailed("your session has ended: sign in again at /login", code="session_expired")
    if not tokens_match(session.csrf_token, connection.headers.get(CSRF_HEADER)):
        raise AuthenticationFailed(
            "a request by a signed-in session needs the page's CSRF token in X-CSRF-Token", code="csrf_token_invalid"
        )
    return run_as_owner(
        KeyInfo.signed_in(session.person.id, session.person.username, session.created_at), session.owner
    )


def api_key_guard(keys: KeyService, store: SessionStore, keyless: Keyless) -> Guard:
    """Authenticate (an API key, or on the chat page's routes a signed-in session, or with neither the keyless
    key where the operator opened one), and note when the request arrived (wall clock and monotonic) for its
    history row. A person's key or session runs under their plan."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        connection.state.arrival = (utcnow(), time.monotonic())
        presented = presented_key(connection.headers)
        person = await signed_in_person(connection, store) if presented is None else None
        if person is not None:
            connection.state.api_key = person
            return
        if presented is None:
            keyless_id = keyless.key_for(connection.client.host if connection.client else None)
            if keyless_id is not None:
                connection.state.api_key = await keys.keyless(keyless_id)
                return
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer sk-...' or 'x-api-key: sk-...'",
                code="missing_api_key",
            )
        connection.state.api_key = await keys.authenticate(presented)

    return guard
