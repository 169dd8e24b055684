"""Per-key (or per-person: web.keys.info.person_holder) cap on concurrent requests, kept in memory: the
appliance is a single process."""

from __future__ import annotations

from collections import defaultdict

from web.errors import RETRY_AFTER_SECONDS, RateLimited


class ConcurrencyLimiter:
    def __init__(self) -> None:
        self._in_flight: defaultdict[int | str, int] = defaultdict(int)

    def acquire(self, key_id: int | str, cap: int | None) -> None:
        """Count one more request of this key, or raise 429 when it already has `cap` in flight."""
        if cap is not None and self._in_flight[key_id] >= cap:
            raise RateLimited(
                f"this {'API key' if isinstance(key_id, int) else 'plan'} allows at most {cap} concurrent request(s); "
                "wait for one to finish and retry",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},  # requests end in seconds: a short wait helps
            )
        self._in_flight[key_id] += 1

    def release(self, key_id: int | str) -> None:
        left = self._in_flight[key_id] - 1
        if left > 0:
            self._in_flight[key_id] = left
        else:
            self._in_flight.pop(key_id, None)

    def in_flight(self, key_id: int | str) -> int:
        return self._in_flight.get(key_id, 0)
