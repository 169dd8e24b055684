"""A request's first steps on every generation route, whichever API it speaks: its history record (who, when,
from where) and its raw body (Litestar's own refusals of it recorded like any bad input)."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request
from litestar.exceptions import HTTPException, InternalServerException

from web.errors import InvalidRequest, PayloadTooLarge
from web.generation.disconnect import ClientDisconnected
from web.history.record import RequestLog


def new_log(request: Request[Any, Any, Any], endpoint: str, id_prefix: str) -> RequestLog:
    """The record of an authenticated request (the API-key guard noted its key and arrival)."""
    wall, mono = request.state.arrival
    client = request.client.host if request.client else None
    key = request.state.api_key
    return RequestLog(
        id=id_prefix + uuid.uuid4().hex,
        key_id=key.id,
        user_id=key.user_id,
        model="",
        endpoint=endpoint,
        stream=False,
        arrival_at=wall,
        arrival_mono=mono,
        client_addr=client,
    )


async def read_body(request: Request[Any, Any, Any]) -> bytes:
    """The body; a client gone before it was read raises ClientDisconnected (its row says cancelled, not a bad
    input: Litestar raises a 500 for it, which no client sees)."""
    try:
        return await request.body()
    except InternalServerException:  # Litestar's stream() raises only this one, for an http.disconnect
        raise ClientDisconnected from None
    except HTTPException as exc:  # Litestar's size limit and framing errors, recorded like any bad input
        if exc.status_code == 413:
            raise PayloadTooLarge("the request body is too large") from None
        raise InvalidRequest(f"the request body could not be read: {exc.detail}") from None
