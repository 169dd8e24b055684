"""Which backend serves a request: among the backends up that serve its model, the less loaded of two picked at
random (load = waiting + running from the backend's metrics, never less than this gateway's own requests in
flight there), skipping any above KV_FULL of KV use while another is below; optionally a conversation sticks to
one backend (its prefix cache) while that one is not much busier than the least busy. A request that fails
before its first delta (the backend is gone, or overloaded) is retried once on another backend."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import statistics
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence

import httpx

from engine import EngineDeadError, QueueFullError, QueuePosition, RequestOutput, SamplingParams, Tenant
from web.backends.embedded import EmbeddedBackend
from web.backends.protocol import Backend, Served
from web.backends.remote import RemoteBackend, TokenizerFor
from web.backends.spec import BackendSpec
from web.backends.status import BackendStatus

log = logging.getLogger("web.backends")

KV_FULL = 0.9
PROBE_EVERY_S = 1.0
STICKY_TOKENS = 256  # the prompt's head that names a conversation (its system prompt and first turn)
STICKY_SLACK = 2  # how many requests busier than the least busy backend a sticky one may be
RETRIES = 1
TTFT_WINDOW = 64  # recent requests whose time to first token the console shows, per backend


class Router:
    def __init__(
        self,
        backends: Sequence[Backend],
        sticky: bool = False,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.backends = list(backends)
        self._http = http  # the remote backends' connections, closed with the router
        self.sticky = sticky
        self._rng = rng or random.Random()
        self._in_flight: dict[str, int] = {b.name: 0 for b in self.backends}
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

    def model_names(self) -> list[str]:
        """The union of the models the backends up serve now, in the order of the backends."""
        names: dict[str, None] = {}
        for backend in self.backends:
            names.update(dict.fromkeys(backend.models()))
        self._known.update(names)
        return list(names)

    def served(self, model: str) -> Served | None:
        """The model as the first backend up that serves it serves it (they share a tokenizer and context)."""
        for backend in self.backends:
            served = backend.models().get(model)
            if served is not None:
                self._known.add(model)
                return served
        return None

    def known(self, model: str) -> bool:
        """Whether some backend served this model since the start (it may be down now), or the local engine will
        (it loads)."""
        embedded = self.embedded
        return model in self._known or (embedded is not None and model == embedded.model_name())

    def up(self) -> list[str]:
        return [b.name for b in self.backends if b.state() == "up"]

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
        return stream

    def pick(self, model: str, prompt_ids: Sequence[int], exclude: frozenset[str] = frozenset()) -> Backend | None:
        candidates = [b for b in self.backends if b.name not in exclude and model in b.models()]
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

    def _load(self, backend: Backend) -> int:
        load = backend.load()
        own = self._in_flight.get(backend.name, 0)
        return own if load is None else max(load.requests, own)

    def _kv(self, backend: Backend) -> float | None:
        load = backend.load()
        return None if load is None else load.kv_usage

    def _opened(self, backend: Backend) -> None:
        self._in_flight[backend.name] = self._in_flight.get(backend.name, 0) + 1
        self._requests[backend.name] += 1

    def _first_token(self, backend: Backend, seconds: float) -> None:
        self._ttfts.setdefault(backend.name, deque(maxlen=TTFT_WINDOW)).append(seconds)

    def _closed(self, backend: Backend) -> None:
        self._in_flight[backend.name] = max(self._in_flight.get(backend.name, 0) - 1, 0)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and stream.backend is not None:
            await stream.backend.abort(request_id)

    def queue_position(self, request_id: str) -> QueuePosition | None:
        """Where a request waits in the embedded engine's queue (a remote one's queue is its own)."""
        stream = self._streams.get(request_id)
        if stream is None or not isinstance(stream.backend, EmbeddedBackend):
            return None
        return stream.backend.client.queue_position(request_id)

    async def probe(self) -> None:
        await asyncio.gather(*(b.probe() for b in self.backends))
        self.model_names()

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
                    in_flight=self._in_flight.get(b.name, 0),
                    ttft_p50_s=statistics.median(ttfts) if ttfts else None,
                    errors=remote.breaker.failures if remote is not None else 0,
                    requests=self._requests[b.name],
                    last_error=remote.last_error if remote is not None else None,
                )
            )
        return out


def _affinity(prompt_ids: Sequence[int], name: str) -> bytes:
    """Rendezvous hashing: each conversation ranks the backends its own way; the top one is its home."""
    head = ",".join(map(str, prompt_ids[:STICKY_TOKENS]))
    return hashlib.blake2b(f"{name}|{head}".encode(), digest_size=8).digest()


class RoutedStream:
    """One request's deltas from the backend the router picked (`backend`, None before the first delta is
    asked for); a failure before the first delta moves it once to another backend."""

    def __init__(
        self,
        router: Router,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> None:
        self._router = router
        self._args = (model, prompt_ids, params, request_id, arrival_time, tenant)
        self.backend: Backend | None = None
        self._stream: AsyncIterator[RequestOutput] | None = None
        self._started = False
        self._closed = False  # forgotten by the router
        self._opened_at: float | None = None  # until its first token

    @property
    def backend_name(self) -> str | None:
        return None if self.backend is None else self.backend.name

    def __aiter__(self) -> RoutedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._started:
            return await self._next()
        self._started = True
        return await self._first()

    async def _first(self) -> RequestOutput:
        tried: set[str] = set()
        while True:
            backend = self._open(frozenset(tried))
            tried.add(backend.name)
            try:
                return await self._next(retrying=True)
            except (EngineDeadError, QueueFullError) as exc:
                await self._release(close=False)
                model, prompt_ids = self._args[0], self._args[1]
                if len(tried) > RETRIES or self._router.pick(model, prompt_ids, frozenset(tried)) is None:
                    self._end()
                    raise
                log.warning(
                    "request %s: %s failed before any output, retried elsewhere: %s", self._args[3], backend.name, exc
                )

    def _open(self, exclude: frozenset[str]) -> Backend:
        model, prompt_ids, params, request_id, arrival_time, tenant = self._args
        backend = self._router.pick(model, prompt_ids, exclude)
        if backend is None:
            self._end()
            raise EngineDeadError(f"no backend serving {model!r} is up")
        served = backend.models()[model]
        self.backend = backend
        self._stream = backend.generate(served, prompt_ids, params, request_id, arrival_time, tenant)
        self._router._opened(backend)
        self._opened_at = time.monotonic()
        return backend

    async def _next(self, retrying: bool = False) -> RequestOutput:
        """The current backend's next delta; the stream ends with its last one, or with a failure (which a
        retry before the first delta handles instead)."""
        if self._stream is None:
            raise StopAsyncIteration
        try:
            out = await anext(self._stream)
        except (EngineDeadError, QueueFullError):
            if not retrying:
                await self._release(close=False)
                self._end()
            raise
        except BaseException:  # cancelled (the client went away), or anything else: the backend's request stops
            await self.aclose()
            raise
        if self._opened_at is not None and out.token_ids and self.backend is not None:
            self._router._first_token(self.backend, time.monotonic() - self._opened_at)
            self._opened_at = None
        if out.finished:
            await self._release(close=False)
            self._end()
        return out

    async def _release(self, close: bool = True) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if self.backend is not None:
            self._router._closed(self.backend)
        aclose = getattr(stream, "aclose", None)
        if close and aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._router._forget(self._args[3])

    async def aclose(self) -> None:
        """Closing early aborts the request on its backend (a remote one sees its connection close)."""
        await self._release()
        self._end()


def remote_backends(
    specs: Sequence[BackendSpec], tokenizer_for: TokenizerFor
) -> tuple[list[Backend], httpx.AsyncClient]:
    """The remote backends over one connection pool (keep-alive to each server, HTTP/1.1 streams)."""
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64), trust_env=False)
    return [RemoteBackend(spec, http, tokenizer_for) for spec in specs], http
