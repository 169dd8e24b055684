"""One line per HTTP request in the log (method, path, status, who — a key's name, never the key —, tokens: those
a generation was charged, which the pipeline leaves in the scope's state when it settles —, duration) and every
refusal counted in /metrics by its code, answered or not (an unknown route, a wrong key); HEAD answered on every
GET route. Wraps the whole app, so it sees what routing refuses too."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, cast

from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send

from web.system.metrics import Metrics

log = logging.getLogger("web.access")

MAX_ERROR_BODY = 64 << 10  # an error body read for its code; a larger one is not one of ours
MAX_CODES = 64  # distinct codes a counter label takes before the rest count as "other"
_CODE = re.compile(r"^[a-z][a-z_]{0,47}$")


class AccessLog:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._codes: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self._serve(cast(HTTPScope, scope), receive, send)

    async def _serve(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        head = scope["method"] == "HEAD"
        # A HEAD is routed as the GET it asks about (its body dropped below), in a copy of the scope: the server
        # reads its own scope's method to know that no body follows the headers, and took a changed one for a GET
        # whose body was cut short ("Response content shorter than Content-Length", logged on every HEAD).
        scope.setdefault("state", {})  # one state for both: what the app leaves in it is logged below
        routed = cast(HTTPScope, {**scope, "method": "GET"}) if head else scope
        start = time.monotonic()
        status, error_body = 0, bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                if status >= 400 and len(error_body) <= MAX_ERROR_BODY:
                    error_body.extend(message.get("body", b""))
                if head:
                    message = {**message, "body": b""}
            await send(message)

        try:
            await self.app(routed, receive, sending)
        finally:
            self._record(scope, status, bytes(error_body), time.monotonic() - start)

    def _record(self, scope: HTTPScope, status: int, error_body: bytes, seconds: float) -> None:
        state: dict[str, Any] = scope.get("state") or {}
        key = state.get("api_key")
        signed_in = state.get("signed_in")
        who = getattr(key, "name", None) or (signed_in.person.username if signed_in is not None else "-")
        tokens = state.get("tokens")
        code = ""
        if status >= 400:
            code = self._bounded(_error_code(error_body))
            self.metrics.observe_refusal(status, code)
        log.info(
            '%s "%s %s" %d %s tokens=%s %.3fs%s',
            _client(scope),
            scope["method"],
            scope["path"][:200],
            status,
            who,
            "-" if tokens is None else tokens,
            seconds,
            f" {code}" if code else "",
        )

    def _bounded(self, code: str) -> str:
        if not _CODE.match(code):
            return "other"
        if code not in self._codes and len(self._codes) >= MAX_CODES:
            return "other"
        self._codes.add(code)
        return code


def _error_code(body: bytes) -> str:
    """OpenAI's error.code, or Anthropic's error.type; '' where the body is neither."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    code = error.get("code") or error.get("type")
    return code if isinstance(code, str) else ""


def _client(scope: HTTPScope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "-"
