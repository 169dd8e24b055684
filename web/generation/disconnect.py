"""Racing work against the client going away, for the time before a response starts (queue wait, prefill,
a whole non-streamed completion): a disconnect then cancels the work, which aborts the engine request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from litestar.types import Receive

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the log does


class ClientDisconnected(Exception):
    """The client closed the connection before the response was sent (or before its body was read)."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnected
