"""Admin console sessions kept in memory (the appliance is one process; a restart logs the admin out), each with
its CSRF token and expiry, and the per-address limit on failed logins."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

IDLE_TIMEOUT_S = 60 * 60  # a console left without requests (polling counts) logs out after an hour
MAX_AGE_S = 12 * 60 * 60  # and any session ends after twelve hours, open dashboard or not
MAX_SESSIONS = 64


@dataclass(slots=True)
class AdminSession:
    token: str
    csrf_token: str
    created: float
    last_seen: float

    def expired(self, now: float) -> bool:
        return now - self.last_seen > IDLE_TIMEOUT_S or now - self.created > MAX_AGE_S


@dataclass(slots=True)
class SessionStore:
    clock: Callable[[], float] = time.monotonic
    _sessions: dict[str, AdminSession] = field(default_factory=dict)

    def create(self) -> AdminSession:
        now = self.clock()
        self._purge(now)
        if len(self._sessions) >= MAX_SESSIONS:  # bounded memory: the oldest login gives way
            oldest = min(self._sessions.values(), key=lambda s: s.created)
            self._sessions.pop(oldest.token)
        session = AdminSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now)
        self._sessions[session.token] = session
        return session

    def get(self, token: str | None) -> AdminSession | None:
        """The live session for a cookie value, refreshed; None when unknown or expired."""
        if not token:
            return None
        session = self._sessions.get(token)
        now = self.clock()
        if session is None:
            return None
        if session.expired(now):
            self._sessions.pop(token, None)
            return None
        session.last_seen = now
        return session

    def end(self, token: str | None) -> None:
        if token:
            self._sessions.pop(token, None)

    def _purge(self, now: float) -> None:
        for token in [t for t, s in self._sessions.items() if s.expired(now)]:
            del self._sessions[token]


def tokens_match(expected: str, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(expected.encode(), (presented or "").encode())


@dataclass(slots=True)
class LoginLimiter:
    """At most `limit` failed logins per client address in a sliding `window_s`; then 429 until one ages out."""

    limit: int = 5
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    max_addresses: int = 10_000
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, address: str) -> int:
        """Seconds until this address may try again; 0 when it may now."""
        now = self.clock()
        failures = self._recent(address, now)
        if len(failures) < self.limit:
            return 0
        return max(1, int(failures[0] + self.window_s - now + 0.999))

    def failed(self, address: str) -> None:
        now = self.clock()
        if address not in self._failures and len(self._failures) >= self.max_addresses:
            self._prune(now)
        self._recent(address, now).append(now)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def _recent(self, address: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(address, deque())
        while failures and now - failures[0] >= self.window_s:
            failures.popleft()
        return failures

    def _prune(self, now: float) -> None:
        for address in list(self._failures):
            if not self._recent(address, now):
                del self._failures[address]
        while len(self._failures) >= self.max_addresses:  # still full of live attackers: forget the oldest
            del self._failures[next(iter(self._failures))]
