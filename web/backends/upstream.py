"""One OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, another appliance) as the gateway speaks to it:
a request goes to its /v1/completions with the prompt as token ids and the sampling in OpenAI's (and vLLM's)
fields, streamed with usage; its chunks come back as the engine's RequestOutput deltas. Everything it sends is
untrusted: bodies are parsed defensively and its error messages are cut before they reach a client. Its key is
sent as a bearer token and never appears in a message, a log line or a repr."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from engine import (
    ContextLengthError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    Logprob,
    QueueFullError,
    RequestOutput,
    SamplingParams,
    Timings,
    Usage,
)
from web.backends.scrape import Load, read_load
from web.backends.status import BackendState

log = logging.getLogger("web.backends")

MESSAGE_CHARS = 300  # of an upstream's error message passed on to a client
MAX_LINE_BYTES = 1 << 20  # one SSE line from an upstream; a longer one is a broken (or hostile) server
CONNECT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 2.0
MAX_TOKENIZER_BYTES = 160 << 20  # a published tokenizer as JSON (escaping can double its 64 MiB of files)


@dataclass(frozen=True, slots=True)
class UpstreamModel:
    id: str
    max_model_len: int | None  # vLLM says it in /v1/models; servers that do not leave it None


class UpstreamError(EngineDeadError):
    """The server failed the request before any output (unreachable, 5xx, a refused key): another may serve it."""


class Upstream:
    def __init__(self, base_url: str, api_key: str | None, http: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http

    def __repr__(self) -> str:
        return f"Upstream({self.base_url!r})"

    def generate(
        self,
        model: str,
        prompt: Sequence[int] | str,
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> UpstreamStream:
        body = completion_body(model, prompt, params, request_id)
        return UpstreamStream(self, body, request_id, arrival_time or time.monotonic())

    def _open(self, body: dict[str, Any]) -> Any:
        return self._http.stream(
            "POST", f"{self.base_url}/v1/completions", json=body, headers=self._headers, timeout=_stream_timeout()
        )

    async def health(self) -> BackendState:
        """Up (200), draining (503: vLLM answers so while it shuts down), loading or down. An appliance
        answers its /health while alive and its /ready while it can serve: both are asked. llama.cpp's server
        answers /health as an appliance does but has no /ready (404; 401 without the key, when it has one): its
        /health decides, and a wrong key is for the model list to say."""
        try:
            r = await self._http.get(f"{self.base_url}/health", headers=self._headers, timeout=PROBE_TIMEOUT_S)
            if r.status_code == 200 and json_body(r.content[:1024]) == {"status": "ok"}:
                r = await self._http.get(f"{self.base_url}/ready", headers=self._headers, timeout=PROBE_TIMEOUT_S)
                if r.status_code in (401, 403, 404):
                    return BackendState.UP
        except httpx.HTTPError:
            return BackendState.DOWN
        if r.status_code == 200:
            return BackendState.UP
        if r.status_code == 503:
            why = error_message(json_body(r.content[:4096])).lower()
            if "loading" in why:
                return BackendState.LOADING
            return BackendState.DRAINING if "drain" in why or not why else BackendState.DOWN
        return BackendState.DOWN

    async def models(self) -> list[UpstreamModel]:
        r = await self._http.get(f"{self.base_url}/v1/models", headers=self._headers, timeout=PROBE_TIMEOUT_S)
        r.raise_for_status()
        data = json_body(r.content).get("data")
        out = []
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and 0 < len(entry["id"]) <= 256:
                max_len = entry.get("max_model_len")
                meta = entry.get("meta")
                if max_len is None and isinstance(meta, dict):
                    max_len = meta.get("n_ctx")  # llama.cpp's: a request's context (its slots share -c)
                ok = isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
                out.append(UpstreamModel(entry["id"], max_len if ok else None))
        return out

    async def post(self, path: str, body: dict[str, Any], timeout: float, max_bytes: int) -> httpx.Response:
        """One JSON request to the server's own API (vLLM's /tokenize), on its key; an answer over max_bytes is a
        broken (or hostile) server's."""
        async with self._http.stream(
            "POST", f"{self.base_url}{path}", json=body, headers=self._headers, timeout=timeout
        ) as r:
            raw = bytearray()
            async for chunk in r.aiter_bytes():
                raw += chunk
                if len(raw) > max_bytes:
                    raise UpstreamError(f"the backend's {path} answered more than {max_bytes} bytes")
        return httpx.Response(r.status_code, content=bytes(raw), request=r.request)

    async def tokenizer_files(self, model: str) -> dict[str, str] | None:
        """The tokenizer files another appliance publishes for `model` (web/backends/publish.py), or None where the
        server publishes none (vLLM, SGLang, llama.cpp) or sends something else."""
        try:
            async with self._http.stream(
                "GET", f"{self.base_url}/v1/tokenizer", params={"model": model}, headers=self._headers
            ) as r:
                if r.status_code != 200:
                    return None
                raw = bytearray()
                async for chunk in r.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_TOKENIZER_BYTES:
                        return None
        except httpx.HTTPError:
            return None
        files = json_body(bytes(raw)).get("files")
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return None
        return files

    async def scrape(self) -> Load | None:
        """Its load from /metrics (None: it exports none the gateway knows)."""
        try:
            r = await self._http.get(f"{self.base_url}/metrics", headers=self._headers, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        if r.status_code != 200 or len(r.content) > 8 << 20:
            return None
        return read_load(r.text)


class UpstreamStream:
    """One request's deltas. A reader task streams the response into a queue, so that abort() (from another task)
    can stop it at once: the connection closes, which is how vLLM is told to abort, and the consumer gets a final
    delta with finish_reason "abort". Closing the stream early (aclose) closes the connection too."""

    def __init__(self, upstream: Upstream, body: dict[str, Any], request_id: str, arrival: float) -> None:
        self._upstream = upstream
        self._body = body
        self.request_id = request_id
        self._arrival = arrival
        self._queue: asyncio.Queue[tuple[float, RequestOutput | BaseException]] = asyncio.Queue()
        self.received_at: float | None = None  # when the gateway read the delta __anext__ returned last
        self._task: asyncio.Task[None] | None = None
        self._first_token: float | None = None
        self._done = False

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._task is None:
            self._task = asyncio.create_task(self._read(), name=f"upstream-{self.request_id}")
        self.received_at, item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait((time.perf_counter(), item))

    async def abort(self) -> None:
        if self._done:
            return
        await self._stop()
        self._put(self._final("abort", None))

    async def aclose(self) -> None:
        self._done = True
        await self._stop()

    async def _stop(self) -> None:
        """Cancel the reader, which closes the connection on its way out. Waited for with asyncio.wait, not
        `await task`: a caller cancelled meanwhile (a client disconnect cancels the handler's scope at every
        await) would pass its cancellation on to the reader and cut the close short, leaving the upstream
        request running."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})

    async def _read(self) -> None:
        try:
            async with self._upstream._open(self._body) as response:
                if response.status_code != 200:
                    raise await _refusal(response)
                await self._chunks(response)
        except asyncio.CancelledError:
            raise
        except EngineError as exc:
            self._put(exc)
        except (httpx.HTTPError, OSError) as exc:
            where = "during the stream" if self._first_token is not None else "before any output"
            self._put(UpstreamError(f"{self._upstream.base_url} failed {where}: {_what(exc)}"))

    async def _chunks(self, response: httpx.Response) -> None:
        usage: Usage | None = None
        finish: tuple[str, Any] | None = None
        async for line in response.aiter_lines():
            if len(line) > MAX_LINE_BYTES:
                raise UpstreamError(f"{self._upstream.base_url} sent an SSE line over {MAX_LINE_BYTES} bytes")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json_body(data.encode())
            if "error" in chunk:  # vLLM's in-band error after the stream began
                raise UpstreamError(f"{self._upstream.base_url} failed mid-stream: {error_message(chunk)}")
            usage = _usage(chunk.get("usage")) or usage
            choice = _first_choice(chunk)
            if choice is None:
                continue
            delta = self._delta(choice)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                finish = (reason, choice.get("stop_reason"))
            if delta is not None:
                self._put(delta)
        if finish is None:
            raise UpstreamError(f"{self._upstream.base_url} ended the stream without a finish reason")
        reason, stop_reason = finish
        final = self._final(reason if reason in ("stop", "length") else "stop", usage)
        if isinstance(stop_reason, int | str) and not isinstance(stop_reason, bool):
            final.stop_reason = stop_reason if isinstance(stop_reason, int) else stop_reason[:MESSAGE_CHARS]
        self._put(final)

    def _delta(self, choice: dict[str, Any]) -> RequestOutput | None:
        text = choice.get("text")
        text = text if isinstance(text, str) else ""
        ids = choice.get("token_ids")
        if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            token_ids = list(ids)
        else:  # a server that does not return ids: a non-empty chunk counts as one token (usage corrects it)
            token_ids = [-1] if text else []
        if not token_ids and not text:
            return None
        now = time.monotonic()
        first = self._first_token is None and bool(token_ids)
        if first:
            self._first_token = now
        out = RequestOutput(self.request_id, token_ids, text, logprobs=_logprobs(choice.get("logprobs"), token_ids))
        if first:
            out.timings = Timings(self._arrival, None, now, None)
        return out

    def _final(self, reason: str, usage: Usage | None) -> RequestOutput:
        timings = Timings(self._arrival, None, self._first_token, time.monotonic())
        return RequestOutput(self.request_id, [], "", True, reason, usage=usage, timings=timings)


def completion_body(model: str, prompt: Sequence[int] | str, params: SamplingParams, request_id: str) -> dict[str, Any]:
    """The request in OpenAI's completion fields plus vLLM's extras (SGLang and llama.cpp read most of them; an
    appliance ignores the ones it does not know). The prompt: token ids, or text for servers that take no ids."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        "return_token_ids": True,
        "request_id": request_id,
    }
    optional = {
        "top_k": params.top_k or None,
        "seed": params.seed,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "ignore_eos": params.ignore_eos or None,
        "logprobs": params.logprobs,
        "min_p": params.min_p or None,
        "repetition_penalty": params.repetition_penalty if params.repetition_penalty != 1.0 else None,
        "presence_penalty": params.presence_penalty or None,
        "frequency_penalty": params.frequency_penalty or None,
        "logit_bias": {str(t): b for t, b in params.logit_bias} or None,
        "response_format": _response_format(params),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _response_format(params: SamplingParams) -> dict[str, Any] | None:
    guided = params.guided
    if guided is None:
        return None
    if guided.kind == "json_schema" and guided.schema is not None:
        schema = msgspec.json.decode(guided.schema)
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    return {"type": "json_object"}


def _stream_timeout() -> httpx.Timeout:
    # No read timeout: a long queue wait upstream is not a failure (the health probe finds a dead server).
    return httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=None, write=30.0, pool=CONNECT_TIMEOUT_S)


async def _refusal(response: httpx.Response) -> EngineError:
    """A non-200 answer as the engine error it means; 4xx other than overload/auth/model are the request's own."""
    try:
        raw = await response.aread()
    except httpx.HTTPError:
        raw = b""
    message = error_message(json_body(raw[:65536])) or f"HTTP {response.status_code}"
    status = response.status_code
    if status in (429, 503):
        return QueueFullError(f"{response.url.host}:{response.url.port} is overloaded: {message}")
    if status == 400 or status == 422:
        if "context length" in message.lower() or "maximum context" in message.lower():
            return ContextLengthError(message, "messages")
        return InvalidRequestError(message)
    return UpstreamError(f"{response.url.host}:{response.url.port} answered {status}: {message}")


def json_body(raw: bytes) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def error_message(body: dict[str, Any]) -> str:
    error = body.get("error", body)
    text = error.get("message") if isinstance(error, dict) else error
    if not isinstance(text, str):
        text = body.get("detail") if isinstance(body.get("detail"), str) else ""
    return str(text)[:MESSAGE_CHARS]


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:MESSAGE_CHARS]}" if str(exc) else type(exc).__name__


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any] | None:
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    prompt, completion = _count(value.get("prompt_tokens")), _count(value.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = value.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(prompt, completion, cached or 0)


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
    return value if ok else None


def _logprobs(value: Any, token_ids: list[int]) -> list[Logprob] | None:
    """OpenAI's completion logprobs (tokens, token_logprobs, top_logprobs) as the engine's; the top entries name
    no ids upstream, so they carry -1."""
    if not isinstance(value, dict):
        return None
    tokens, lps, tops = value.get("tokens"), value.get("token_logprobs"), value.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(lps, list) or len(tokens) != len(lps):
        return None
    out = []
    for i, (token, lp) in enumerate(zip(tokens, lps, strict=True)):
        top_raw = tops[i] if isinstance(tops, list) and i < len(tops) and isinstance(tops[i], dict) else {}
        top = sorted(
            ((-1, str(t), float(p)) for t, p in top_raw.items() if isinstance(p, int | float)), key=_by_logprob
        )
        token_id = token_ids[i] if i < len(token_ids) else -1
        out.append(Logprob(token_id, str(token), float(lp) if isinstance(lp, int | float) else 0.0, top))
    return out


def _by_logprob(entry: tuple[int, str, float]) -> float:
    return -entry[2]
