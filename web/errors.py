"""The one error tree of the web room and its single mapping to HTTP: every error leaves as OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`, including Litestar's own (validation, 404, 405, 413)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from types import CodeType
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.serialization import decode_json
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from engine import ContextLengthError, EngineDeadError, EngineError, InvalidRequestError, QueueFullError
from web.generation.disconnect import CLIENT_CLOSED, ClientDisconnected

log = logging.getLogger("web.errors")
_FIELD = re.compile(r"field `([^`]+)`")

RETRYABLE_4XX = (408, 409, 429)  # a timeout, a conflict, a rate limit: the same request may pass later
RETRY_AFTER_SECONDS = 1
STORAGE_RETRY_AFTER_SECONDS = 5  # a lock outlasting the busy timeout, or a full disk, does not clear in a second


class AppError(Exception):
    """Base of the errors the web room raises on purpose; each subclass fixes status, type and code."""

    status_code = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})


class InvalidRequest(AppError):
    status_code = 400
    type = "invalid_request_error"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class AuthenticationFailed(AppError):
    status_code = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class AdminAuthRequired(AppError):
    status_code = 401
    type = "invalid_request_error"
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": 'Basic realm="appliance admin"'})


class SignInFailed(AppError):
    """A person's sign-in refused: one message for an unknown name and a wrong password."""

    status_code = 401
    type = "invalid_request_error"
    code = "sign_in_failed"


class Conflict(AppError):
    """A change the stored state forbids: retrying the same request cannot help (unlike 409's usual meaning)."""

    status_code = 409
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, headers={"x-should-retry": "false"})


class NameTaken(Conflict):
    """A user or plan name already in use."""

    code = "name_taken"


class LastAdmin(Conflict):
    """Suspending, demoting or deleting the last active admin: nobody could run the console any more."""

    code = "last_admin"


class NotFound(AppError):
    status_code = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class PayloadTooLarge(AppError):
    status_code = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(AppError):
    status_code = 429
    type = "requests"
    code = "rate_limit_exceeded"


class InsufficientQuota(AppError):
    status_code = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        # The openai client retries a 429 twice unless told not to: an empty quota does not refill in seconds.
        super().__init__(message, headers={**(headers or {}), "x-should-retry": "false"})


class ServiceUnavailable(AppError):
    """The engine cannot take the request now (loading, draining, queue full, dead); the client may retry."""

    status_code = 503
    type = "server_error"
    code = "service_unavailable"

    def __init__(self, message: str, *, code: str | None = None, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


class StorageUnavailable(ServiceUnavailable):
    """The database refused a write (locked past the busy timeout, disk full, I/O error); the client may retry."""

    code = "storage_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=STORAGE_RETRY_AFTER_SECONDS)


def from_engine_error(exc: EngineError) -> AppError:
    """The engine's refusals in the web room's terms (the only place that knows both trees)."""
    if isinstance(exc, QueueFullError):
        return ServiceUnavailable(f"the server is overloaded: {exc}", code="overloaded")
    if isinstance(exc, ContextLengthError):
        return ContextLengthExceeded(str(exc), param=exc.param or "messages")
    if isinstance(exc, InvalidRequestError):
        return InvalidRequest(str(exc), param=exc.param)
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailable(f"the engine is unavailable: {exc}", code="engine_unavailable")
    return ServiceUnavailable(f"the engine failed: {exc}", code="engine_error")


def undecodable_body(exc: RecursionError | UnicodeDecodeError) -> InvalidRequest:
    """msgspec's refusals of a body that are not DecodeErrors: nesting deeper than it recurses (in a field typed
    Any, or one it skips), or invalid UTF-8 inside a string."""
    why = "it is nested too deeply" if isinstance(exc, RecursionError) else "a string in it is not valid UTF-8"
    return InvalidRequest(f"the request body is not valid JSON: {why}")


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _respond(
    status: int, message: str, type_: str, param: str | None, code: str | None, headers: Mapping[str, str]
) -> Response[dict[str, Any]]:
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        # Retrying cannot fix it: clients that honour the header (OpenAI's and Anthropic's SDKs, Claude Code)
        # fail at once instead of backing off for minutes.
        headers = {**headers, "x-should-retry": "false"}
    return Response(error_body(message, type_, param, code), status_code=status, headers=dict(headers))


def handle_app_error(_: Request[Any, Any, Any], exc: AppError) -> Response[dict[str, Any]]:
    return _respond(exc.status_code, exc.message, exc.type, exc.param, exc.code, exc.headers)


def handle_engine_error(request: Request[Any, Any, Any], exc: EngineError) -> Response[dict[str, Any]]:
    return handle_app_error(request, from_engine_error(exc))


_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    """Litestar's own exceptions (routing, body parsing and size, validation) in OpenAI's shape."""
    status = exc.status_code
    if status >= 500:
        return handle_unexpected(request, exc)
    message, param = str(exc.detail), None
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            param, detail = first.get("key") or None, str(first.get("message", ""))
            if param == "data":  # the body as a whole: name the field the message names, if any
                named = _FIELD.search(detail)
                param = named.group(1) if named else None
                message = f"invalid request body: {detail}"
            else:
                message = f"invalid value for '{param}': {detail}" if param else f"invalid request: {detail}"
    elif status == 404:
        message = f"no route for {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif status == 413:
        message = "the request body is too large"
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() in ("allow", "retry-after")}
    return _respond(status, message, "invalid_request_error", param, _HTTP_CODES.get(status), headers)


def handle_undecodable_body(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Litestar's own JSON parsing (the admin API's bodies) lets these two through; elsewhere they are bugs."""
    if isinstance(exc, RecursionError | UnicodeDecodeError) and _raised_in(exc, decode_json.__code__):
        return handle_app_error(request, undecodable_body(exc))
    return handle_unexpected(request, exc)


def _raised_in(exc: BaseException, code: CodeType) -> bool:
    """Whether the innermost Python frame of the exception's traceback runs `code` (msgspec is C: its caller)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is code


def handle_client_gone(_: Request[Any, Any, Any], __: ClientDisconnected) -> Response[bytes]:
    """A client that left before its response began: nobody reads the answer; the access log's 499 says why."""
    return Response(b"", status_code=CLIENT_CLOSED)


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(HTTP_500_INTERNAL_SERVER_ERROR, "internal server error", "server_error", None, None, {})


EXCEPTION_HANDLERS: dict[int | type[Exception], Any] = {
    AppError: handle_app_error,
    ClientDisconnected: handle_client_gone,
    EngineError: handle_engine_error,
    HTTPException: handle_http_exception,
    RecursionError: handle_undecodable_body,
    UnicodeDecodeError: handle_undecodable_body,
    Exception: handle_unexpected,
}
