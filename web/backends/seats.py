"""The gateway's own fair queue in front of backends whose seats it counts (remote servers: their in-flight target,
APPLIANCE_BACKEND_MAX_IN_FLIGHT or an entry's #max_in_flight=N). While every seat that could serve a request is
taken, the request waits here, and a seat that frees goes to the waiting request whose tenant has received the
least service, by the embedded scheduler's own ledger (engine.TenantBook: the Virtual Token Counter, interactive
before batch, FIFO within a tenant): an upstream first-come-first-served queue never decides who waits. The
embedded engine has no seat limit here; it queues fairly itself."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine import DEFAULT_TENANT, EngineDeadError, Tenant, TenantBook
from web.backends.protocol import Backend


class Withdrawn(Exception):
    """A waiting request was aborted before it got a seat."""


@dataclass(eq=False)
class Seated:
    """One request as the ledger counts it: whose it is, and whether it holds a seat."""

    tenant: Tenant = DEFAULT_TENANT
    running: bool = False


@dataclass(eq=False)
class Waiter:
    request_id: str
    entry: Seated
    model: str
    prompt_ids: Sequence[int]
    exclude: frozenset[str]
    seq: int
    granted: asyncio.Future[Backend] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Seats:
    def __init__(self, limits: Mapping[str, int | None]) -> None:
        self.limits = dict(limits)  # per backend name; None: no limit
        self.taken: Counter[str] = Counter()
        self.book = TenantBook()
        self._waiting: list[Waiter] = []
        self._seq = itertools.count()

    def free(self, name: str) -> bool:
        limit = self.limits.get(name)
        return limit is None or self.taken[name] < limit

    def arrive(self, entry: Seated) -> None:
        self.book.arrive(entry)

    def take(self, name: str, entry: Seated, prompt_tokens: int) -> None:
        self.taken[name] += 1
        if not entry.running:
            entry.running = True
            self.book.admitted(entry, prompt_tokens)

    def give_back(self, name: str) -> None:
        self.taken[name] = max(self.taken[name] - 1, 0)

    def generated(self, entry: Seated, tokens: int) -> None:
        self.book.generated(entry, tokens)

    def left(self, entry: Seated) -> None:
        self.book.left(entry, entry.running)

    def wait(
        self, request_id: str, entry: Seated, model: str, prompt_ids: Sequence[int], exclude: frozenset[str]
    ) -> Waiter:
        waiter = Waiter(request_id, entry, model, prompt_ids, exclude, next(self._seq))
        self._waiting.append(waiter)
        return waiter

    def withdraw(self, waiter: Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)

    def order(self) -> list[Waiter]:
        """The waiting requests in the order seats go to them."""
        return sorted(self._waiting, key=self._rank)

    def _rank(self, w: Waiter) -> tuple[int, float, int]:
        st = self.book.of(w.entry)
        return st.band, st.counter, w.seq

    def grant(self, waiter: Waiter, backend: Backend) -> None:
        self.withdraw(waiter)
        self.take(backend.name, waiter.entry, len(waiter.prompt_ids))
        waiter.granted.set_result(backend)

    def fail(self, waiter: Waiter, message: str) -> None:
        self.withdraw(waiter)
        waiter.granted.set_exception(EngineDeadError(message))

    def abort(self, request_id: str) -> bool:
        """Stop a request waiting here (it ends with finish_reason "abort"); False if it does not wait here."""
        for waiter in self._waiting:
            if waiter.request_id == request_id:
                self.withdraw(waiter)
                waiter.granted.set_exception(Withdrawn(request_id))
                return True
        return False

    def position(self, request_id: str) -> int | None:
        """1-based place in line among the requests waiting for the same model; None when not waiting here."""
        order = self.order()
        me = next((w for w in order if w.request_id == request_id), None)
        if me is None:
            return None
        return 1 + sum(1 for w in order[: order.index(me)] if w.model == me.model)
