"""The API-key guard of the /v1 routes: runs before the body is read, so a missing key is 401 whatever the body."""

from __future__ import annotations

import time
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from web.errors import AuthenticationFailed
from web.keys.service import KeyService
from web.models import utcnow


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthenticationFailed("the Authorization header must be 'Bearer <API key>'")
    return token.strip() or None


def api_key_guard(keys: KeyService) -> Guard:
    """Authenticate, and note when the request arrived (wall clock and monotonic) for its history row."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        connection.state.arrival = (utcnow(), time.monotonic())
        connection.state.api_key = await keys.authenticate(bearer_token(connection.headers.get("authorization")))

    return guard
