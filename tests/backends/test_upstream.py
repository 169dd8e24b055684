"""What the gateway makes of what an upstream server sends: its stream as deltas, its refusals as the engine's
errors, and hostile or broken answers as clean failures (the bytes come from an httpx transport: the upstream
here is the network's worst case, which no real server produces on purpose)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from engine import (
    ContextLengthError,
    EngineError,
    GuidedDecoding,
    InvalidRequestError,
    QueueFullError,
    RequestOutput,
    SamplingParams,
)
from web.backends.upstream import Upstream
from web.backends.upstream_errors import MESSAGE_CHARS, UpstreamError
from web.backends.upstream_stream import MAX_LINE_BYTES, completion_body

KEY = "sk-upstream-secret"


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def chunk(text: str, ids: list[int] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, **extra}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "cmpl-1", "choices": [choice]}


USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
}


def upstream(respond: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request] | None = None) -> Upstream:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return respond(request)

    return Upstream("http://up:8000/", KEY, httpx.AsyncClient(transport=httpx.MockTransport(handler)))


async def run(up: Upstream, params: SamplingParams | None = None) -> list[RequestOutput]:
    return [out async for out in up.generate("m", [1, 2, 3], params or SamplingParams(max_tokens=2), "req-1", 10.0)]


def test_a_vllm_stream_becomes_deltas_with_its_usage() -> None:
    body = sse(chunk("Hel", [7]), chunk("lo", [8], "stop", stop_reason=None), USAGE, b"[DONE]")
    seen: list[httpx.Request] = []
    outs = asyncio.run(run(upstream(lambda r: httpx.Response(200, content=body), seen)))
    assert [(o.token_ids, o.text) for o in outs[:2]] == [([7], "Hel"), ([8], "lo")]
    final = outs[-1]
    assert final.finished and final.finish_reason == "stop" and final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.cached_prompt_tokens) == (5, 2, 3)
    assert outs[0].timings is not None and outs[0].timings.arrival == 10.0 and outs[0].timings.first_token
    request = seen[0]
    assert request.url == "http://up:8000/v1/completions" and request.headers["authorization"] == f"Bearer {KEY}"
    sent = json.loads(request.content)
    assert sent["prompt"] == [1, 2, 3] and sent["stream"] and sent["stream_options"]["include_usage"]


def test_a_server_without_token_ids_counts_a_chunk_a_token() -> None:
    body = sse(chunk("a"), chunk(""), chunk("b", finish="length"), b"[DONE]")
    outs = asyncio.run(run(upstream(lambda r: httpx.Response(200, content=body))))
    assert [len(o.token_ids) for o in outs] == [1, 1, 0] and outs[-1].finish_reason == "length"
    assert outs[-1].usage is None  # the gateway's own count stands


@pytest.mark.parametrize(
    ("status", "message", "error"),
    [
        (400, "temperature must be positive", InvalidRequestError),
        (400, "This model's maximum context length is 2048 tokens. However, you requested 4000", ContextLengthError),
        (429, "too many requests", QueueFullError),
        (503, "overloaded", QueueFullError),
        (500, "boom", UpstreamError),
        (401, "bad key", UpstreamError),
        (404, "The model `m` does not exist.", UpstreamError),
    ],
)
def test_refusals_become_the_engines_errors(status: int, message: str, error: type[EngineError]) -> None:
    body = {"error": {"message": message * 50, "type": "x"}}
    with pytest.raises(error) as raised:
        asyncio.run(run(upstream(lambda r: httpx.Response(status, json=body))))
    assert message[:40] in str(raised.value) and len(str(raised.value)) < MESSAGE_CHARS + 100
    assert KEY not in str(raised.value)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"data: {not json\n\ndata: [DONE]\n\n", "without a finish reason"),
        (b"data: " + b"x" * (MAX_LINE_BYTES + 10) + b"\n\n", "SSE line over"),
        (sse({"error": {"message": "engine died <script>"}}), "failed mid-stream: engine died"),
        (sse(chunk("a", [1])), "without a finish reason"),  # cut before its end
        (sse({"choices": "nope"}, [1, 2], "str", chunk("a", ["x"], finish="stop")), None),
    ],
)
def test_broken_or_hostile_streams_fail_cleanly(content: bytes, needle: str | None) -> None:
    up = upstream(lambda r: httpx.Response(200, content=content))
    if needle is None:  # garbage is skipped; a chunk with bad ids counts as one token
        outs = asyncio.run(run(up))
        assert outs[-1].finished and [len(o.token_ids) for o in outs] == [1, 0]
        return
    with pytest.raises(UpstreamError, match=needle):
        asyncio.run(run(up))


def test_an_unreachable_server_is_a_failure_before_any_output() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(UpstreamError, match="before any output: ConnectError"):
        asyncio.run(run(upstream(refuse)))


def test_abort_ends_the_stream_with_an_abort_delta() -> None:
    async def scenario() -> list[RequestOutput]:
        gate = asyncio.Event()

        async def slow_body() -> Any:
            yield sse(chunk("a", [1]))
            await gate.wait()  # never set: the server would stream on

        up = upstream(lambda r: httpx.Response(200, content=slow_body()))
        stream = up.generate("m", [1], SamplingParams(max_tokens=9), "req-2")
        first = await anext(stream)
        await stream.abort()
        return [first] + [out async for out in stream]

    outs = asyncio.run(scenario())
    assert outs[0].text == "a" and outs[-1].finished and outs[-1].finish_reason == "abort"


def test_sampling_fields_travel_in_openai_and_vllm_names() -> None:
    params = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_k=5,
        seed=3,
        stop=("x",),
        logprobs=2,
        min_p=0.1,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        logit_bias=((9, -5.0),),
        guided=GuidedDecoding(kind="json_schema", schema='{"type": "object"}'),
    )
    body = completion_body("m", [1], params, "r")
    assert body["max_tokens"] == 7 and body["top_k"] == 5 and body["seed"] == 3 and body["stop"] == ["x"]
    assert body["logprobs"] == 2 and body["min_p"] == 0.1 and body["repetition_penalty"] == 1.2
    assert body["logit_bias"] == {"9": -5.0} and body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    plain = completion_body("m", [1], SamplingParams(), "r")
    assert not {"top_k", "seed", "stop", "logit_bias", "response_format", "min_p"} & set(plain)


@pytest.mark.parametrize(
    ("ready", "state"),
    [
        (httpx.Response(200, json={"status": "ready"}), "up"),  # an appliance that can serve
        (httpx.Response(503, json={"error": {"message": "the model is loading"}}), "loading"),  # one that cannot yet
        (httpx.Response(404, json={"error": {"message": "File Not Found"}}), "up"),  # llama.cpp: no /ready
        (httpx.Response(401, json={"error": {"message": "Invalid API Key"}}), "up"),  # llama.cpp, a wrong key
    ],
)
def test_a_health_like_an_appliances_asks_ready_and_a_server_without_one_is_up(
    ready: httpx.Response, state: str
) -> None:
    """llama.cpp's server answers /health as an appliance does ({"status": "ok"}) but has no /ready: its /health
    decides (a wrong key is the model list's to say), where an appliance's /ready does."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        assert request.headers["authorization"] == "Bearer sk-k"
        return ready

    async def go() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return str(await Upstream("http://box2:8000", "sk-k", http).health())

    assert asyncio.run(go()) == state
