"""What the console and /admin/api/backends show of one backend, a snapshot taken by the router."""

from __future__ import annotations

from dataclasses import dataclass

STATES = ("up", "draining", "down", "circuit open", "loading")


@dataclass(frozen=True, slots=True)
class BackendStatus:
    name: str  # as history rows name it: "embedded", or the URL's host:port (never its key)
    kind: str  # "embedded" or "remote"
    url: str | None  # the base URL without its password (None for the embedded engine)
    state: str  # one of STATES
    models: tuple[str, ...]  # the served names it answers for (aliases applied)
    running: int | None  # None: the backend exports no such figure
    waiting: int | None
    kv_usage: float | None  # 0..1
    in_flight: int  # requests this gateway has open on it now
    ttft_p50_s: float | None  # over its recent requests through this gateway
    errors: int  # failures in the recent window (the circuit breaker's count)
    requests: int  # requests routed to it since the gateway started
    last_error: str | None
    reason: str | None = None  # why it serves nothing, or less than it lists (RemoteBackend.reason)
