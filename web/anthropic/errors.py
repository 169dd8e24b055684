"""Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}` with Anthropic's statuses, for
every answer on the Messages API's paths: the app's one mapping (web/errors.py) decides the refusal, this module
only restates it, so both APIs refuse the same things for the same reasons."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request, Response

from web.anthropic.schemas import encoder
from web.errors import AppError

PATH = "/v1/messages"
OVERLOADED = 529  # Anthropic's status for "try again shortly": its clients back off and retry
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
Handler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


def status_and_type(status: int, code: str | None) -> tuple[int, str]:
    """Anthropic's status and error type for a refusal the app answers with `status` and OpenAI's `code`."""
    if code == "overloaded":  # the engine's queue is full
        return OVERLOADED, "overloaded_error"
    if status >= 500:
        return status, "api_error"
    return status, _TYPES.get(status, "invalid_request_error")


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def event_of(error: AppError) -> bytes:
    """A failure after the stream started: Anthropic's clients raise on an `error` event."""
    _, type_ = status_and_type(error.status_code, error.code)
    return sse("error", error_body(type_, _message(error.message, error.param)))


def sse(event: str, payload: object) -> bytes:
    """One Server-Sent Event as Anthropic sends them: its `event:` line names the payload's type."""
    return b"event: " + event.encode() + b"\ndata: " + encoder.encode(payload) + b"\n\n"


def _message(message: str, param: str | None) -> str:
    """Anthropic names the offending field in the message itself (it has no `param`)."""
    return f"{param}: {message}" if param and not message.startswith(param) else message


def restated(response: Response[Any]) -> Response[Any]:
    """An error response of web/errors.py's (OpenAI's shape) in Anthropic's shape, its headers kept."""
    error = response.content["error"]
    status, type_ = status_and_type(response.status_code or 500, error.get("code"))
    body = error_body(type_, _message(error["message"], error.get("param")))
    return Response(body, status_code=status, headers=dict(response.headers))


def on_messages_paths(handlers: Mapping[int | type[Exception], Handler]) -> dict[int | type[Exception], Handler]:
    """The app's exception handlers, answering in Anthropic's shape on the Messages API's paths: at the app's
    level, so that Litestar's own refusals there (no such route, a wrong method) are restated too."""

    def wrapped(handler: Handler) -> Handler:
        def handle(request: Request[Any, Any, Any], exc: Any) -> Response[Any]:
            response = handler(request, exc)
            path = request.url.path
            # An error body to restate: a client gone early gets an empty 499, which is left as it is.
            if isinstance(response.content, dict) and (path == PATH or path.startswith(PATH + "/")):
                return restated(response)
            return response

        return handle

    return {kind: wrapped(handler) for kind, handler in handlers.items()}
