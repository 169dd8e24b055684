"""One request to an upstream server and its answer: the body sent to its /v1/completions (the prompt as token ids,
the sampling in OpenAI's and vLLM's fields, streamed with usage) and the stream of its chunks read back as the
engine's RequestOutput deltas. Every chunk is untrusted: parsed defensively, an over-long line refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import msgspec

from engine import EngineError, Logprob, RequestOutput, SamplingParams, Timings, Usage
from web.backends.upstream_errors import MESSAGE_CHARS, UpstreamError, describe, error_message, json_body, refusal

MAX_LINE_BYTES = 1 << 20  # one SSE line from an upstream; a longer one is a broken (or hostile) server
CONNECT_TIMEOUT_S = 5.0
# Opens the POST of a completion body, streamed (Upstream.generate binds its address, key and client).
Opener = Callable[[dict[str, Any]], AbstractAsyncContextManager[httpx.Response]]


class UpstreamStream:
    """One request's deltas. A reader task streams the response into a queue, so that abort() (from another task)
    can stop it at once: the connection closes, which is how vLLM is told to abort, and the consumer gets a final
    delta with finish_reason "abort". Closing the stream early (aclose) closes the connection too."""

    def __init__(self, opener: Opener, base_url: str, body: dict[str, Any], request_id: str, arrival: float) -> None:
        self._opener = opener
        self._base_url = base_url
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
            async with self._opener(self._body) as response:
                if response.status_code != 200:
                    raise await refusal(response)
                await self._chunks(response)
        except asyncio.CancelledError:
            raise
        except EngineError as exc:
            self._put(exc)
        except (httpx.HTTPError, OSError) as exc:
            where = "during the stream" if self._first_token is not None else "before any output"
            self._put(UpstreamError(f"{self._base_url} failed {where}: {describe(exc)}"))

    async def _chunks(self, response: httpx.Response) -> None:
        usage: Usage | None = None
        finish: tuple[str, Any] | None = None
        async for line in response.aiter_lines():
            if len(line) > MAX_LINE_BYTES:
                raise UpstreamError(f"{self._base_url} sent an SSE line over {MAX_LINE_BYTES} bytes")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json_body(data.encode())
            if "error" in chunk:  # vLLM's in-band error after the stream began
                raise UpstreamError(f"{self._base_url} failed mid-stream: {error_message(chunk)}")
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
            raise UpstreamError(f"{self._base_url} ended the stream without a finish reason")
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


def stream_timeout() -> httpx.Timeout:
    # No read timeout: a long queue wait upstream is not a failure (the health probe finds a dead server).
    return httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=None, write=30.0, pool=CONNECT_TIMEOUT_S)


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
