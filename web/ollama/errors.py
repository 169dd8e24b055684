"""Errors in Ollama's shape, `{"error": "..."}`, on every answer under /api/ (but the chat page's own
/api/conversations, which answers in the app's shape): the app's one mapping (web/errors.py) decides the refusal and
its status, this module only restates it (Ollama's clients read `error`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request, Response

from web.errors import AppError
from web.ollama.schemas import Error
from web.ollama.streaming import line

PREFIX = "/api/"
NOT_OLLAMA = "/api/conversations"  # web/people/conversations_api.py
Handler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


def message_of(message: str, param: str | None) -> str:
    """Ollama has no `param`: the field goes in the message."""
    return f"{param}: {message}" if param and not message.startswith(param) else message


def error_line(error: AppError) -> bytes:
    """A failure after the stream started: Ollama's clients raise on a line with `error`."""
    return line(Error(message_of(error.message, error.param)))


def _not_ollama(path: str) -> bool:
    return path == NOT_OLLAMA or path.startswith(NOT_OLLAMA + "/")


def on_ollama_paths(handlers: Mapping[int | type[Exception], Handler]) -> dict[int | type[Exception], Handler]:
    """The app's exception handlers, answering in Ollama's shape under /api/ (Litestar's own refusals there, an
    unknown route or a wrong method, included)."""

    def wrapped(handler: Handler) -> Handler:
        def handle(request: Request[Any, Any, Any], exc: Any) -> Response[Any]:
            response = handler(request, exc)
            # An error body to restate: a client gone early gets an empty 499, which is left as it is.
            path = request.url.path
            if isinstance(response.content, dict) and path.startswith(PREFIX) and not _not_ollama(path):
                error = response.content["error"]
                body = {"error": message_of(error["message"], error.get("param"))}
                return Response(body, status_code=response.status_code, headers=dict(response.headers))
            return response

        return handle

    return {kind: wrapped(handler) for kind, handler in handlers.items()}
