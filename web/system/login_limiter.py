"""The limit on guessing the admin password: failed sign-ins per client address in a sliding window, shared by
the console's login form and HTTP Basic on the admin API and /metrics."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


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
