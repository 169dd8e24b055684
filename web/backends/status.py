"""What the console and /admin/api/backends show of one backend, a snapshot taken by the router."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class BackendState(StrEnum):
    """Whether a backend takes requests (only when up), as /ready, the console and the doctor name it."""

    UP = "up"
    DRAINING = "draining"
    DOWN = "down"
    CIRCUIT_OPEN = "circuit open"  # up, but its breaker holds requests off after failures in a row
    LOADING = "loading"


@dataclass(frozen=True, slots=True)
class BackendStatus:
    name: str  # as history rows name it: "embedded", or the URL's host:port (never its key)
    kind: str  # "embedded" or "remote"
    url: str | None  # the base URL without its password (None for the embedded engine)
    state: BackendState
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
