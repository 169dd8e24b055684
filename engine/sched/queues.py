"""The scheduler's waiting queues: first come first served, or fair (the tenant with the smallest counter
first, first come first served within a tenant). Both put a preempted request back at the front of its line.
Pure Python, no torch."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from engine.sched.fair import W_IN, W_OUT, TenantBook, TenantState
from engine.sched.request import Request


class WaitingQueue(Protocol):
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...
    def __contains__(self, req: object) -> bool: ...
    def push(self, req: Request) -> None: ...
    def push_front(self, req: Request) -> None: ...
    def peek(self) -> Request: ...
    def take(self, req: Request) -> None: ...
    def remove(self, req: Request) -> None: ...
    def ordered(self, limit: int) -> list[Request]: ...
    def __getitem__(self, index: int) -> Request: ...


class FcfsQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __contains__(self, req: object) -> bool:
        return req in self._queue

    def push(self, req: Request) -> None:
        self._queue.append(req)

    def push_front(self, req: Request) -> None:
        self._queue.appendleft(req)

    def peek(self) -> Request:
        return self._queue[0]

    def take(self, req: Request) -> None:
        """Remove req, which peek() just returned."""
        assert self._queue[0] is req
        self._queue.popleft()

    def remove(self, req: Request) -> None:
        self._queue.remove(req)

    def ordered(self, limit: int) -> list[Request]:
        return list(itertools.islice(self._queue, limit))

    def __getitem__(self, index: int) -> Request:
        return self._queue[index]


class _Line(deque[Request]):
    """One tenant's waiting requests, holding its ledger entry: the head scan reads it without a lookup (the
    book never forgets a tenant that has requests waiting)."""

    __slots__ = ("state",)

    def __init__(self, state: TenantState) -> None:
        super().__init__()
        self.state = state

    def key(self) -> tuple[int, float, float, float]:
        st = self.state
        return (st.band, st.counter, st.running / st.tenant.weight, self[0].arrival_time)


class FairQueue:
    """One FIFO line per tenant; the head is the first request of the tenant first in (band, counter) order.
    Ties go to the tenant with fewer seats per weight (one back from idle is lifted to exactly the smallest
    counter, level with a tenant that may hold every seat), then to the earliest arrival. With a single
    tenant it orders exactly like FcfsQueue."""

    def __init__(self, book: TenantBook) -> None:
        self._book = book
        self._lines: dict[str, _Line] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        return itertools.chain.from_iterable(self._lines.values())

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Request) and req in self._lines.get(req.tenant.id, ())

    def push(self, req: Request) -> None:
        self._line(req).append(req)
        self._len += 1

    def push_front(self, req: Request) -> None:
        self._line(req).appendleft(req)
        self._len += 1

    def _line(self, req: Request) -> _Line:
        line = self._lines.get(req.tenant.id)
        if line is None:
            line = self._lines[req.tenant.id] = _Line(self._book.of(req))
        return line

    def peek(self) -> Request:
        # A scan over the waiting tenants (at most one per key): counters change every step for tenants with
        # running requests, so a heap would need re-keying as often as it is read. Band and counter decide
        # almost always; the full key is built only on a tie.
        best: _Line | None = None
        band, counter = 2, math.inf
        for line in self._lines.values():
            st = line.state
            if st.band < band or (
                st.band == band
                and (st.counter < counter or (st.counter == counter and best is not None and line.key() < best.key()))
            ):
                best, band, counter = line, st.band, st.counter
        if best is None:
            raise IndexError("peek from an empty queue")
        return best[0]

    def take(self, req: Request) -> None:
        """Remove req, which peek() just returned."""
        line = self._lines[req.tenant.id]
        assert line[0] is req
        line.popleft()
        self._drop_if_empty(req.tenant.id, line)

    def remove(self, req: Request) -> None:
        line = self._lines[req.tenant.id]
        line.remove(req)
        self._drop_if_empty(req.tenant.id, line)

    def ordered(self, limit: int) -> list[Request]:
        """The first `limit` requests in projected admission order: each tenant's line is spread along its
        counter as if every request ahead in it were charged its prompt and max_tokens (an upper bound on the
        service it will draw), and the lines are merged by band then projected counter."""
        heap = [(*line.key(), tid, 0) for tid, line in self._lines.items()]
        heapq.heapify(heap)
        out: list[Request] = []
        while heap and len(out) < limit:
            band, counter, seats, _, tid, index = heapq.heappop(heap)
            line = self._lines[tid]
            req = line[index]
            out.append(req)
            if index + 1 < len(line):
                cost = (W_IN * req.num_prompt_tokens + W_OUT * req.params.max_tokens) / line.state.tenant.weight
                nxt = line[index + 1]
                heapq.heappush(heap, (band, counter + cost, seats, nxt.arrival_time, tid, index + 1))
        return out

    def __getitem__(self, index: int) -> Request:
        """The index-th request in projected admission order ([0] is the head)."""
        if not 0 <= index < self._len:
            raise IndexError(f"queue index {index} out of range")
        return self.peek() if index == 0 else self.ordered(index + 1)[index]

    def _drop_if_empty(self, tid: str, line: deque[Request]) -> None:
        self._len -= 1
        if not line:
            del self._lines[tid]
