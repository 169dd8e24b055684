"""An OpenAI-compatible server on the LAN as a backend: its state from health probes and its circuit breaker,
its load from its /metrics (or, where it exports none, this gateway's own requests in flight on it), and the
models it lists, each with the tokenizer the gateway prepares its requests with."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx

from engine import InvalidRequestError, ModelInfo, QueueFullError, RequestOutput, SamplingParams, Tenant
from web.backends.breaker import Breaker
from web.backends.fetched import FetchedTokenizers
from web.backends.protocol import Served
from web.backends.remote_tokenizer import RemoteTokenizer, TokenizerUnavailable, remote_tokenizer
from web.backends.scrape import Load
from web.backends.spec import BackendSpec
from web.backends.status import BackendState
from web.backends.upstream import Upstream, UpstreamModel
from web.backends.upstream_errors import MESSAGE_CHARS
from web.backends.upstream_stream import UpstreamStream

log = logging.getLogger("web.backends")

MODELS_EVERY_S = 10.0  # how often its model list is asked again (load and health: every probe)
DEFAULT_CONTEXT = 4096  # a server that does not say its context (llama.cpp, Ollama): the check leaves it to it

# (served name, the backend's tokenizer option) -> (tokenizer, its directory), or None where the gateway has none.
TokenizerFor = Callable[[str, str | None], "tuple[Any, str] | None"]


class RemoteBackend:
    kind = "remote"

    def __init__(
        self, spec: BackendSpec, http: httpx.AsyncClient, tokenizer_for: TokenizerFor, fetched: FetchedTokenizers
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.url: str | None = spec.base_url
        self.upstream = Upstream(spec.base_url, spec.api_key, http)
        self.breaker = Breaker()
        self._tokenizer_for = tokenizer_for
        self._fetched = fetched
        self._unfetchable: set[str] = set()  # models whose published tokenizer did not load: not fetched again
        self._health = BackendState.DOWN  # until the first probe answers
        self._load: Load | None = None
        self._served: dict[str, Served] = {}
        self._models_at = -MODELS_EVERY_S
        self._streams: dict[str, UpstreamStream] = {}
        self.last_error: str | None = None
        self.unservable: tuple[str, ...] = ()  # models it lists that the gateway has no tokenizer for
        self._remote: dict[str, RemoteTokenizer] = {}  # upstream id -> the tokenizer its /tokenize answers for
        self._no_remote: str | None = None  # why its /tokenize did not answer for a model (the last refresh's)
        self.unlisted: tuple[str, ...] = ()  # models its entry's aliases name that it does not list
        self.probed = False  # its first probe has finished (readiness waits for every backend's)
        self._models_error: str | None = None

    def models(self) -> dict[str, Served]:
        return self._served if self.state() == BackendState.UP else {}

    def state(self) -> BackendState:
        if self._health != BackendState.UP:
            return self._health
        return BackendState.CIRCUIT_OPEN if self.breaker.open else BackendState.UP

    def load(self) -> Load | None:
        return self._load

    def generate(
        self,
        served: Served,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> AsyncIterator[RequestOutput]:
        self.breaker.allow()
        prompt: Sequence[int] | str = prompt_ids
        if self.spec.text_prompt:  # the template is applied already: its special tokens stay in the text
            prompt = served.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        stream = self.upstream.generate(served.upstream_id, prompt, params, request_id, arrival_time)
        self._streams[request_id] = stream
        return _Tracked(self, stream)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            await stream.abort()

    def _ended(self, stream: UpstreamStream, error: BaseException | None) -> None:
        """The breaker counts the server's failures only: a refusal of the request itself (400) or an overload
        (429/503) says the server is alive."""
        self._streams.pop(stream.request_id, None)
        if isinstance(error, InvalidRequestError | QueueFullError):
            self.last_error = str(error)[:MESSAGE_CHARS]
            return
        if error is None:
            self.breaker.success()
            return
        self.last_error = str(error)[:MESSAGE_CHARS]
        self.breaker.failure()
        if self.breaker.open:
            log.warning("backend %s: circuit open after %d failures in a row", self.name, self.breaker.failures)

    def reason(self) -> str | None:
        """Why it serves nothing or less than it lists, in the words /ready, the console and the doctor use; None
        where it serves every model it lists."""
        if not self.probed:
            return "not probed yet"
        if self._health != BackendState.UP:
            return self._health + (f" ({self.last_error})" if self.last_error else "")
        if self.breaker.open:
            return f"circuit open ({self.last_error})" if self.last_error else "circuit open"
        if self._models_error is not None:
            return self._models_error
        problems = []
        if self.unservable:
            why = f", and {self._no_remote}" if self._no_remote else ""
            problems.append(
                f"no tokenizer for {', '.join(self.unservable)}: it publishes none{why} (add #tokenizer=DIR)"
            )
        if self.unlisted:
            problems.append(f"its entry names {', '.join(self.unlisted)}, which it does not list")
        if not problems and not self._served:
            problems.append("it lists no model")
        return "; ".join(problems) or None

    async def probe(self) -> None:
        """Health, then (when up) load and, every MODELS_EVERY_S, its models. A probe never raises."""
        try:
            await self._probe()
        finally:
            self.probed = True

    async def _probe(self) -> None:
        health = await self.upstream.health()
        if health != self._health:
            log.info("backend %s is %s", self.name, health)
        self._health = health
        if health != BackendState.UP:
            self._load = None
            return
        self.breaker.recovered()
        self._load = await self.upstream.scrape()
        if time.monotonic() - self._models_at >= MODELS_EVERY_S or not self._served:
            await self._refresh_models()

    async def _refresh_models(self) -> None:
        try:
            listed = await self.upstream.models()
        except httpx.HTTPStatusError as exc:
            status = exc.response.status_code
            self._models_error = f"its model list answered {status}" + (
                " (a wrong key in its entry?)" if status in (401, 403) else ""
            )
            self.last_error = self._models_error
            self._served = {}
            return
        except (httpx.HTTPError, OSError) as exc:
            self.last_error = f"its model list failed: {type(exc).__name__}"
            return
        self._models_error = None
        self._models_at = time.monotonic()
        listed_ids = {m.id for m in listed}
        self.unlisted = tuple(upstream_id for upstream_id, _ in self.spec.aliases if upstream_id not in listed_ids)
        served: dict[str, Served] = {}
        unservable = []
        self._no_remote = None  # this round's: a model that fails below sets it
        for model in listed:
            name = self.spec.served_name(model.id)
            found = await asyncio.to_thread(self._tokenizer_for, name, self.spec.tokenizer)
            if found is None and self.spec.tokenizer is None:
                found = await self._fetched_tokenizer(model.id)
            if found is None and self.spec.tokenizer is None and not self.spec.text_prompt:
                found = await self._remote_tokenizer(model.id)
            if found is None:
                unservable.append(name)
                continue
            served[name] = Served(name, model.id, _info(name, model, *found), found[0])
        if tuple(unservable) != self.unservable and unservable:
            log.warning(
                "backend %s: no tokenizer for %s: it publishes none%s (add #tokenizer=DIR to its entry in "
                "APPLIANCE_BACKENDS)",
                self.name,
                ", ".join(unservable),
                f", and {self._no_remote}" if self._no_remote else "",
            )
        self.unservable = tuple(unservable)
        self._served = served

    async def _remote_tokenizer(self, upstream_id: str) -> tuple[Any, str] | None:
        """The backend's own /tokenize for the model (vLLM's), asked once it answers; until then, each probe."""
        tokenizer = self._remote.get(upstream_id)
        if tokenizer is None:
            try:
                tokenizer = await remote_tokenizer(self.upstream, upstream_id)
            except TokenizerUnavailable as exc:
                self._no_remote = str(exc)
                return None
            self._remote[upstream_id] = tokenizer
            log.info("backend %s: %s is tokenized by its /tokenize", self.name, upstream_id)
        return tokenizer, f"{self.url}/tokenize?model={upstream_id}"

    async def _fetched_tokenizer(self, upstream_id: str) -> tuple[Any, str] | None:
        """The tokenizer this backend publishes for the model (another appliance does), fetched and loaded once."""
        tokenizer = self._fetched.get(self.name, upstream_id)
        if tokenizer is None and upstream_id not in self._unfetchable:
            files = await self.upstream.tokenizer_files(upstream_id)
            if files is not None:
                tokenizer = await asyncio.to_thread(self._fetched.load, self.name, upstream_id, files)
                if tokenizer is None:
                    self._unfetchable.add(upstream_id)
        return None if tokenizer is None else (tokenizer, f"{self.url}/v1/tokenizer?model={upstream_id}")


def _info(name: str, model: UpstreamModel, tokenizer: Any, tokenizer_dir: str) -> ModelInfo:
    """A remote model in ModelInfo's terms: its pool is unknown here, so the "pool" is its context."""
    context = model.max_model_len or _tokenizer_context(tokenizer) or DEFAULT_CONTEXT
    eos = getattr(tokenizer, "eos_token_id", None)
    return ModelInfo(
        name=name,
        max_model_len=context,
        tokenizer_dir=tokenizer_dir,
        eos_token_ids=[eos] if isinstance(eos, int) else [],
        device="remote",
        dtype="",
        quantization="",
        num_kv_blocks=context,
        block_size=1,
        kv_bytes_per_block=0,
    )


def _tokenizer_context(tokenizer: Any) -> int | None:
    n = getattr(tokenizer, "model_max_length", None)
    return n if isinstance(n, int) and 0 < n <= 1 << 22 else None


class _Tracked:
    """The upstream stream as the router hands it on: it tells the backend how it ended (its breaker)."""

    def __init__(self, backend: RemoteBackend, stream: UpstreamStream) -> None:
        self._backend = backend
        self._stream = stream
        self._ended = False

    def __aiter__(self) -> _Tracked:
        return self

    @property
    def received_at(self) -> float | None:
        return self._stream.received_at

    async def __anext__(self) -> RequestOutput:
        try:
            out = await anext(self._stream)
        except StopAsyncIteration:
            self._end(None)
            raise
        except Exception as exc:
            self._end(exc)
            raise
        if out.finished:
            self._end(None)
        return out

    async def aclose(self) -> None:
        self._end(None)
        await self._stream.aclose()

    def _end(self, error: BaseException | None) -> None:
        if not self._ended:
            self._ended = True
            self._backend._ended(self._stream, error)
