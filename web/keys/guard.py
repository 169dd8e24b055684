"""The API-key guard of the /v1 routes: runs before the body is read, so a missing key is 401 whatever the body."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from web.errors import AuthenticationFailed
from web.keys.service import KeyService
from web.models import utcnow
from web.people.plans import Plans


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


def api_key_guard(keys: KeyService, plans: Plans) -> Guard:
    """Authenticate, and note when the request arrived (wall clock and monotonic) for its history row. A
    personal key runs under its owner's plan."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        connection.state.arrival = (utcnow(), time.monotonic())
        presented = presented_key(connection.headers)
        if presented is None:
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer sk-...' or 'x-api-key: sk-...'",
                code="missing_api_key",
            )
        connection.state.api_key = await plans.apply(await keys.authenticate(presented))

    return guard
