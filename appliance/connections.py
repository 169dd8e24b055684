"""Guards on the server's HTTP connections against clients that open many and never finish a request (issue 17,
S1): a deadline to send a whole request, a cap on open connections, and an open-file limit that fits the cap.

uvicorn has neither a header nor a body read timeout, and its `limit_concurrency` answers 503 only once a
request's headers are complete, so half-open sockets pile up until accept() fails for everyone. The guard works
in the protocol, under the ASGI app."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("appliance.connections")

# Files the process needs besides its connections: the database, model files, the engine's pipes, libraries.
RESERVED_FILES = 256
REPORT_EVERY_S = 60.0


def _plain_response(status: str, text: str, *headers: str) -> bytes:
    """A whole response for a connection the guard closes before (or instead of) the app."""
    body = text.encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", f"content-length: {len(body)}"]
    return "\r\n".join([*head, *headers, "connection: close", "", ""]).encode() + body


REQUEST_TIMEOUT = _plain_response("408 Request Timeout", "the request was not sent in time")
TOO_MANY = _plain_response("503 Service Unavailable", "too many open connections", "retry-after: 1")


@dataclass(slots=True)
class ConnectionGuard:
    """What all connections of one server share: the limits, the connections not inside a request (oldest
    first: the ones a new connection may replace at the cap), and counts for a periodic log line."""

    max_connections: int
    read_timeout: float
    idle: dict[GuardedProtocol, None] = field(default_factory=dict)
    closed: Counter[str] = field(default_factory=Counter)
    _reported_at: float = 0.0

    def count(self, reason: str) -> None:
        """Count a connection the guard closed; a flood gets one warning a minute, not one line per socket."""
        self.closed[reason] += 1
        now = time.monotonic()
        if now - self._reported_at >= REPORT_EVERY_S:
            self._reported_at = now
            summary = ", ".join(f"{n} {what}" for what, n in sorted(self.closed.items()))
            log.warning("closed HTTP connections since the last report: %s", summary)
            self.closed.clear()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guard's deadline and cap. The deadline runs from the connection (or
    a request's first byte) until the request's body is complete; idle time between requests stays governed by
    the keep-alive timeout."""

    guard: ConnectionGuard  # set on the subclass that `guarded_protocol` makes for one server

    _deadline: asyncio.TimerHandle | None = None
    _reading = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.guard.idle[self] = None
        if len(self.connections) > self.guard.max_connections and not self._replace_an_idle_one():
            self.guard.count("refused at the connection cap")
            self._close(TOO_MANY)
            return
        self._start_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading()
        self.guard.idle.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            self._start_reading()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self.guard.idle.pop(self, None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._stop_reading()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        starts_a_pipelined_request = bool(self.pipeline)
        super().on_response_complete()
        if not starts_a_pipelined_request and not self.transport.is_closing():
            self.guard.idle[self] = None

    def _replace_an_idle_one(self) -> bool:
        """Close the oldest connection that has no request in progress (never this new one)."""
        for victim in self.guard.idle:
            if victim is not self:
                break
        else:
            return False
        self.guard.count("replaced at the connection cap")
        victim._close(REQUEST_TIMEOUT if victim._reading else b"")
        return True

    def _start_reading(self) -> None:
        self._reading = True
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.guard.read_timeout, self._deadline_passed)

    def _stop_reading(self) -> None:
        self._reading = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.flow.read_paused:
            # The server stopped reading (a pipelined request waits for the one before it): not the client's delay.
            self._deadline = self.loop.call_later(self.guard.read_timeout, self._deadline_passed)
            return
        self.guard.count("timed out sending a request")
        # Once the headers are in, the app may have answered already: a 408 would then corrupt the stream.
        self._close(REQUEST_TIMEOUT if self in self.guard.idle else b"")

    def _close(self, response: bytes) -> None:
        self._stop_reading()
        self.guard.idle.pop(self, None)
        self.connections.discard(self)  # counted out now, not when the loop reports the close
        if not self.transport.is_closing():
            if response:
                self.transport.write(response)
            self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """The protocol class for uvicorn's `http=` option, bound to one server's guard."""
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), {"guard": guard})


def fit_open_file_limit(max_connections: int) -> int:
    """Raise the soft open-file limit towards what the cap needs (up to the hard limit, as Go's runtime does) and
    return the cap that fits: lower than asked, with a warning, where the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitted = max(1, soft - RESERVED_FILES)
        log.warning(
            "the open-file limit is %d (LimitNOFILE= in the unit, or ulimit -n): at most %d connections, not %d",
            soft,
            fitted,
            max_connections,
        )
        return fitted
    return max_connections
