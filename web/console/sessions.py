"""Admin console sessions kept in memory (the appliance is one process; a restart logs the admin out), each with
its CSRF token and expiry. The limit on failed logins is the admin credential's (web/system/login_limiter.py)."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from web.system.login_limiter import LoginLimiter as LoginLimiter  # re-exported: where the console's tests look

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
