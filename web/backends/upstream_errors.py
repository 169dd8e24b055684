"""What an upstream server's failures become: its error bodies read defensively (they are untrusted) and cut before
they reach a client, and a refused request mapped to the engine error it means (overloaded, too long, invalid, or
failed: another backend may serve it)."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from engine import ContextLengthError, EngineDeadError, EngineError, InvalidRequestError, QueueFullError

MESSAGE_CHARS = 300  # of an upstream's error message passed on to a client


class UpstreamError(EngineDeadError):
    """The server failed the request before any output (unreachable, 5xx, a refused key): another may serve it."""


async def refusal(response: httpx.Response) -> EngineError:
    """A non-200 answer as the engine error it means; 4xx other than overload/auth/model are the request's own."""
    try:
        raw = await response.aread()
    except httpx.HTTPError:
        raw = b""
    message = error_message(json_body(raw[:65536])) or f"HTTP {response.status_code}"
    status = response.status_code
    if status in (429, 503):
        return QueueFullError(f"{response.url.host}:{response.url.port} is overloaded: {message}")
    if status == 400 or status == 422:
        if "context length" in message.lower() or "maximum context" in message.lower():
            return ContextLengthError(message, "messages")
        return InvalidRequestError(message)
    return UpstreamError(f"{response.url.host}:{response.url.port} answered {status}: {message}")


def json_body(raw: bytes) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def error_message(body: dict[str, Any]) -> str:
    error = body.get("error", body)
    text = error.get("message") if isinstance(error, dict) else error
    if not isinstance(text, str):
        text = body.get("detail") if isinstance(body.get("detail"), str) else ""
    return str(text)[:MESSAGE_CHARS]


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:MESSAGE_CHARS]}" if str(exc) else type(exc).__name__
