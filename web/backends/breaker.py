"""A circuit breaker per backend: after FAILURES failures in a row it opens and the router sends it nothing for
a cool-down (doubling up to MAX_COOLDOWN_S while it keeps failing). Then one request may try it (half-open), or
a good health probe lets requests in again on probation: one more failure opens it for longer. A success
closes it."""

from __future__ import annotations

import time

FAILURES = 3
COOLDOWN_S = 2.0
MAX_COOLDOWN_S = 30.0


class Breaker:
    def __init__(self) -> None:
        self.failures = 0  # in a row
        self.total_failures = 0
        self._opened_at: float | None = None
        self._cooldown = COOLDOWN_S
        self._trial = False  # a half-open trial is in flight

    @property
    def open(self) -> bool:
        """Whether it refuses requests now (open, or half-open with its one trial taken)."""
        if self._opened_at is None:
            return False
        if time.monotonic() - self._opened_at < self._cooldown:
            return True
        return self._trial

    def allow(self) -> None:
        """A request goes to it: when half-open, this is its one trial."""
        if self._opened_at is not None:
            self._trial = True

    def success(self) -> None:
        self.failures = 0
        self._opened_at = None
        self._cooldown = COOLDOWN_S
        self._trial = False

    def recovered(self) -> None:
        """Its health probe answers again: once the cool-down is over, requests may go (on probation)."""
        if self._opened_at is not None and time.monotonic() - self._opened_at >= self._cooldown:
            self._opened_at, self._trial = None, False
            self.failures = FAILURES - 1
            self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN_S)

    def failure(self) -> None:
        self.failures += 1
        self.total_failures += 1
        if self._opened_at is not None:  # a failed trial: open again, for longer
            self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN_S)
            self._opened_at, self._trial = time.monotonic(), False
        elif self.failures >= FAILURES:
            self._opened_at = time.monotonic()
