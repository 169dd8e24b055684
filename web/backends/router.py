"""Which backend serves a request: among the backends up that serve its model and have a free seat, the less
loaded of two picked at random (load = waiting + running from the backend's metrics, never less than this
gateway's own requests in flight there), skipping any above KV_FULL of KV use while another is below; optionally
a conversation sticks to one backend (its prefix cache) while that one is not much busier than the least busy.
With every seat taken the request waits in the gateway's fair queue (web/backends/seats.py). A request that
fails before its first delta (the backend is gone, or overloaded) is retried once on another backend
(web/backends/routed.py)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Sequence

import httpx

from engine import EngineDeadError, QueuePosition, SamplingParams, Tenant
from web.backends.embedded import EmbeddedBackend
from web.backends.fetched import FetchedTokenizers
from web.backends.protocol import Backend, Served
from web.backends.remote import RemoteBackend, TokenizerFor
from web.backends.routed import RoutedStream
from web.backends.seats import Seats
from web.backends.spec import BackendSpec
from web.backends.status import BackendState, BackendStatus

log = logging.getLogger("web.backends")

KV_FULL = 0.9
PROBE_EVERY_S = 1.0
STICKY_TOKENS = 256  # the prompt's head that names a conversation (its system prompt and first turn)
STICKY_SLACK = 2  # how many requests busier than the least busy backend a sticky one may be
TTFT_WINDOW = 64  # recent requests whose time to first token the console shows, per backend


class Router:
    def __init__(
        self,
        backends: Sequence[Backend],
        sticky: bool = False,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        seats: Mapping[str, int | None] | None = None,
    ) -> None:
        """`seats`: per backend name, how many requests it may have in flight from this gateway (absent or None:
        no limit; the embedded engine queues fairly itself)."""
        self.backends = list(backends)
        self._http = http  # the remote backends' connections, closed with the router
        self.sticky = sticky
        self._rng = rng or random.Random()
        self.seats = Seats(seats or {})
        self._requests: Counter[str] = Counter()  # routed to each since the start
        self._ttfts: dict[str, deque[float]] = {b.name: deque(maxlen=TTFT_WINDOW) for b in self.backends}
        self._known: set[str] = set()  # every model name a backend has served: 503 rather than 404 while down
        self._streams: dict[str, RoutedStream] = {}

    @property
    def has_remotes(self) -> bool:
        return any(b.kind == "remote" for b in self.backends)

    @property
    def embedded(self) -> EmbeddedBackend | None:
        for backend in self.backends:
            if isinstance(backend, EmbeddedBackend):
                return backend
        return None

    @property
    def remotes(self) -> list[RemoteBackend]:
        return [b for b in self.backends if isinstance(b, RemoteBackend)]

    def remote_reasons(self) -> list[str]:
        """'name: why' for each remote backend that serves less than it lists (readiness, console, doctor)."""
        return [f"{b.name}: {why}" for b in self.remotes if (why := b.reason()) is not None]

    def model_names(self) -> list[str]:
        """The union of the models the backends up serve now, in the order of the backends."""
        names: dict[str, None] = {}
        for backend in self.backends:
            names.update(dict.fromkeys(backend.models()))
        self._known.update(names)
        return list(names)

    def served(self, model: str, besides: Served | None = None) -> Served | None:
        """The model as the first backend up that serves it serves it (they share a tokenizer and context); with
        `besides`, the first whose tokenizer is another (that one failed: its backend is gone, though its probe
        has not said so yet)."""
        for backend in self.backends:
            served = backend.models().get(model)
            if served is not None and (besides is None or served.tokenizer is not besides.tokenizer):
                self._known.add(model)
                return served
        return None

    def known(self, model: str) -> bool:
        """Whether some backend served this model since the start (it may be down now), or the local engine will
        (it loads)."""
        embedded = self.embedded
        return model in self._known or (embedded is not None and model == embedded.model_name())

    def up(self) -> list[str]:
        return [b.name for b in self.backends if b.state() == BackendState.UP]

    def generate(
        self,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> RoutedStream:
        stream = RoutedStream(self, model, prompt_ids, params, request_id, arrival_time, tenant)
        self._streams[request_id] = stream
        self.seats.arrive(stream.entry)
        return stream

    def pick(self, model: str, prompt_ids: Sequence[int], exclude: frozenset[str] = frozenset()) -> Backend | None:
        """A backend up that serves `model` and has a free seat, or None."""
        candidates = [b for b in self._serving(model, exclude) if self.seats.free(b.name)]
        if not candidates:
            return None
        roomy = [b for b in candidates if (self._kv(b) or 0.0) <= KV_FULL]
        candidates = roomy or candidates
        if self.sticky and len(candidates) > 1:
            preferred = max(candidates, key=lambda b: _affinity(prompt_ids, b.name))
            if self._load(preferred) <= min(self._load(b) for b in candidates) + STICKY_SLACK:
                return preferred
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        load_a, load_b = self._load(a), self._load(b)
        if load_a == load_b:
            return self._rng.choice((a, b))
        return a if load_a < load_b else b

    def _serving(self, model: str, exclude: frozenset[str]) -> list[Backend]:
        return [b for b in self.backends if b.name not in exclude and model in b.models()]

    def serving(self, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        """Whether a backend up (other than those in exclude) serves the model, seats free or not."""
        return bool(self._serving(model, exclude))

    async def seat(self, stream: RoutedStream, exclude: frozenset[str]) -> Backend:
        """A backend for the stream now, or once a seat frees (the fair queue's order); EngineDeadError when no
        backend up serves its model."""
        if not self._serving(stream.model, exclude):
            raise EngineDeadError(f"no backend serving {stream.model!r} is up")
        backend = self.pick(stream.model, stream.prompt_ids, exclude)
        if backend is not None:
            self._seated(backend, stream)
            return backend
        waiter = self.seats.wait(stream.request_id, stream.entry, stream.model, stream.prompt_ids, exclude)
        try:
            backend = await waiter.granted
        finally:
            self.seats.withdraw(waiter)
        self._requests[backend.name] += 1
        return backend

    def _seated(self, backend: Backend, stream: RoutedStream) -> None:
        self.seats.take(backend.name, stream.entry, len(stream.prompt_ids))
        self._requests[backend.name] += 1

    def _dispatch(self) -> None:
        """Free seats to the waiting requests, in the fair queue's order; those whose model no backend up serves
        any more fail."""
        for waiter in self.seats.order():
            if waiter.granted.done():
                continue
            backend = self.pick(waiter.model, waiter.prompt_ids, waiter.exclude)
            if backend is not None:
                self.seats.grant(waiter, backend)
            elif not self._serving(waiter.model, waiter.exclude):
                self.seats.fail(waiter, f"no backend serving {waiter.model!r} is up")

    def _load(self, backend: Backend) -> int:
        load = backend.load()
        own = self.seats.taken[backend.name]
        return own if load is None else max(load.requests, own)

    def _kv(self, backend: Backend) -> float | None:
        load = backend.load()
        return None if load is None else load.kv_usage

    def released(self, stream: RoutedStream, backend: Backend) -> None:
        self.seats.give_back(backend.name)
        self._dispatch()

    def first_token(self, backend: Backend, seconds: float) -> None:
        self._ttfts.setdefault(backend.name, deque(maxlen=TTFT_WINDOW)).append(seconds)

    def generated(self, stream: RoutedStream, tokens: int) -> None:
        self.seats.generated(stream.entry, tokens)

    def ended(self, stream: RoutedStream) -> None:
        self._streams.pop(stream.request_id, None)
        self.seats.left(stream.entry)

    async def abort(self, request_id: str) -> None:
        if self.seats.abort(request_id):
            return
        stream = self._streams.get(request_id)
        if stream is not None and stream.backend is not None:
            await stream.backend.abort(request_id)

    def queue_position(self, request_id: str) -> QueuePosition | None:
        """Where a request waits: for a seat in the gateway's queue, or in the embedded engine's (a remote server's
        own queue is its own)."""
        position = self.seats.position(request_id)
        if position is not None:
            return QueuePosition(position, None)
        stream = self._streams.get(request_id)
        if stream is None or not isinstance(stream.backend, EmbeddedBackend):
            return None
        return stream.backend.client.queue_position(request_id)

    async def probe(self) -> None:
        await asyncio.gather(*(b.probe() for b in self.backends))
        self.model_names()
        self._dispatch()  # a backend that came back takes waiting requests; one that went may fail them

    async def monitor(self) -> None:
        """Probe every backend about once a second, for as long as the gateway runs."""
        while True:
            try:
                await self.probe()
            except Exception:  # a probe must never end the loop; the next one tries again
                log.exception("probing the backends failed")
            await asyncio.sleep(PROBE_EVERY_S)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def statuses(self) -> list[BackendStatus]:
        out = []
        for b in self.backends:
            load = b.load()
            remote = b if isinstance(b, RemoteBackend) else None
            ttfts = list(self._ttfts.get(b.name, ()))
            out.append(
                BackendStatus(
                    name=b.name,
                    kind=b.kind,
                    url=b.url,
                    state=b.state(),
                    models=tuple(b.models()),
                    running=None if load is None else load.running,
                    waiting=None if load is None else load.waiting,
                    kv_usage=None if load is None else load.kv_usage,
                    in_flight=self.seats.taken[b.name],
                    ttft_p50_s=statistics.median(ttfts) if ttfts else None,
                    errors=remote.breaker.failures if remote is not None else 0,
                    requests=self._requests[b.name],
                    last_error=remote.last_error if remote is not None else None,
                    reason=remote.reason() if remote is not None else None,
                )
            )
        return out


def _affinity(prompt_ids: Sequence[int], name: str) -> bytes:
    """Rendezvous hashing: each conversation ranks the backends its own way; the top one is its home."""
    head = ",".join(map(str, prompt_ids[:STICKY_TOKENS]))
    return hashlib.blake2b(f"{name}|{head}".encode(), digest_size=8).digest()


def remote_backends(
    specs: Sequence[BackendSpec], tokenizer_for: TokenizerFor
) -> tuple[list[Backend], httpx.AsyncClient]:
    """The remote backends over one connection pool (keep-alive to each server, HTTP/1.1 streams)."""
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64), trust_env=False)
    fetched = FetchedTokenizers()
    return [RemoteBackend(spec, http, tokenizer_for, fetched) for spec in specs], http
