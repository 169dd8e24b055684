"""The API-key guard of the /v1 routes: runs before the body is read, so a missing key is 401 whatever the body."""

from __future__ import annotations

import time
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from web.errors import AuthenticationFailed
from web.models import utcnow
from web.state import services_of


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthenticationFailed("the Authorization header must be 'Bearer <API key>'")
    return token.strip() or None


async def api_key_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Authenticate, and note when the request arrived (wall clock and monotonic) for its history row."""
    connection.state.arrival = (utcnow(), time.monotonic())
    services = services_of(connection)
    connection.state.api_key = await services.keys.authenticate(bearer_token(connection.headers.get("authorization")))
