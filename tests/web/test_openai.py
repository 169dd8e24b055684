"""The OpenAI-compatible API on the fake engine: response shapes, streaming, parameters, and every bad input
answered with a clear 4xx in OpenAI's error shape."""

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import (
    MODEL,
    assert_openai_error,
    bearer,
    client_for,
    new_key,
    rows,
    sse_events,
)
from tests.web.fakes import FakeEngineClient

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


async def post(client: Any, key: str, path: str, body: Any) -> Any:
    return await client.post(path, json=body, headers=bearer(key))


async def test_chat_completion_shape(client: Any, key: str) -> None:
    response = await post(client, key, "/v1/chat/completions", {**CHAT, "max_tokens": 3})
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == MODEL and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "t0 t1 t2 "}
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"] == {
        "prompt_tokens": 19, "completion_tokens": 3, "total_tokens": 22, "prompt_tokens_details": {"cached_tokens": 0}
    }  # fmt: skip
    stopped = await post(client, key, "/v1/chat/completions", {**CHAT, "max_tokens": 30})
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"


async def test_chat_stream_chunks(client: Any, key: str) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = await post(client, key, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "t0 t1 t2 t3 t4 "
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "stop" and set(finish[:-1]) == {None}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 19, "completion_tokens": 5, "total_tokens": 24, "prompt_tokens_details": {"cached_tokens": 0}
    }  # fmt: skip
    plain = sse_events((await post(client, key, "/v1/chat/completions", {**CHAT, "stream": True})).text)
    assert all(c["usage"] is None for c in plain[:-1])


async def test_completions_prompt_forms(client: Any, key: str, fake: FakeEngineClient) -> None:
    for prompt, ids in [
        ("abc", [97, 98, 99]),
        ([5, 6, 7], [5, 6, 7]),
        (["ab"], [97, 98]),
        ([[9, 8]], [9, 8]),
    ]:
        response = await post(client, key, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert body["choices"][0]["text"] == "t0 t1 " and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] == len(ids)
        assert fake.requests[-1][1] == ids


async def test_completions_stream(client: Any, key: str) -> None:
    body = {"model": MODEL, "prompt": "abc", "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events((await post(client, key, "/v1/completions", body)).text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "t0 t1 t2 t3 t4 "
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] == 8


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [
        (["a", "b"], "batch of 2"),
        ([], "empty"),
        ("", "empty"),
        ([5, 1000], "vocabulary"),
        ([[1], [2]], "batch"),
    ],
)
async def test_completions_bad_prompts(client: Any, key: str, prompt: Any, needle: str) -> None:
    response = await post(client, key, "/v1/completions", {"model": MODEL, "prompt": prompt})
    assert needle in assert_openai_error(response, 400, param="prompt")["message"]


async def test_models(client: Any, key: str) -> None:
    listed = (await client.get("/v1/models", headers=bearer(key))).json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [MODEL]
    one = await client.get(f"/v1/models/{MODEL}", headers=bearer(key))
    assert one.json()["id"] == MODEL and one.json()["object"] == "model"
    assert_openai_error(await client.get("/v1/models/gpt-4", headers=bearer(key)), 404, "model_not_found")


async def test_unknown_model_is_404_and_recorded(client: Any, key: str, db: sqlite3.Connection) -> None:
    response = await post(client, key, "/v1/chat/completions", {**CHAT, "model": "gpt-4o"})
    assert_openai_error(response, 404, "model_not_found", "model")
    (row,) = rows(db, "SELECT status, model, error FROM requests")
    assert (row["status"], row["model"]) == ("rejected", "gpt-4o") and "does not exist" in row["error"]


@pytest.mark.parametrize(
    ("change", "status", "code", "param"),
    [
        ({"tools": [{"type": "function"}]}, 400, None, "tools[0]"),
        ({"temperature": 3}, 400, None, "temperature"),
        ({"top_p": 0}, 400, None, "top_p"),
        ({"max_tokens": 0}, 400, None, "max_tokens"),
        ({"max_tokens": "ten"}, 400, None, "max_tokens"),
        ({"stop": ["x"] * 17}, 400, None, "stop"),
        ({"stop": 5}, 400, None, "stop"),
        ({"top_logprobs": 3}, 400, None, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, 400, None, "top_logprobs"),
        ({"messages": []}, 400, None, "messages"),
        ({"messages": [{"role": "function", "content": "x"}]}, 400, "unsupported_parameter", "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, 400, None, "messages[0].tool_call_id"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, None, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, 400, None, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "unsupported_parameter",
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": "BREAK TEMPLATE"}]}, 400, None, "messages"),
        ({"messages": [{"content": "no role"}]}, 400, None, None),
        ({"model": 7}, 400, None, "model"),
    ],
)
async def test_bad_chat_requests(client: Any, key: str, change: dict, status: int, code: Any, param: Any) -> None:
    response = await post(client, key, "/v1/chat/completions", {**CHAT, **change})
    assert_openai_error(response, status, code, param)


async def test_prompt_longer_than_the_context(client: Any, key: str) -> None:
    long = {**CHAT, "messages": [{"role": "user", "content": "x" * 600}]}
    assert_openai_error(await post(client, key, "/v1/chat/completions", long), 400, "context_length_exceeded")


@pytest.mark.parametrize(
    "raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"model": "fake-model"}', b"null"]
)
async def test_bodies_that_are_not_a_request(client: Any, key: str, raw: bytes) -> None:
    headers = {**bearer(key), "Content-Type": "application/json"}
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert_openai_error(await client.post(path, content=raw, headers=headers), 400)


async def test_routing_errors_are_openai_shaped(client: Any, key: str) -> None:
    assert_openai_error(await client.get("/v2/nothing"), 404, "not_found")
    assert_openai_error(await client.get("/v1/chat/completions", headers=bearer(key)), 405, "method_not_allowed")
    assert_openai_error(await client.put("/health"), 405)


async def test_body_over_the_size_limit_is_413(fake: FakeEngineClient, db_path: Path) -> None:
    async with client_for(fake, db_path, max_body_bytes=2000) as small:
        key = await new_key(small)
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        assert_openai_error(await post(small, key, "/v1/chat/completions", big), 413, "request_too_large")
        assert (await post(small, key, "/v1/chat/completions", CHAT)).status_code == 200


async def test_sampling_parameters_reach_the_engine(client: Any, key: str, fake: FakeEngineClient) -> None:
    body = {**CHAT, "temperature": 0, "top_p": 0.5, "top_k": 7, "seed": 42, "stop": "END", "user": "u-1"}
    assert (await post(client, key, "/v1/chat/completions", {**body, "max_completion_tokens": 4})).status_code == 200
    params = fake.requests[-1][2]
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0, 0.5, 7, 42)
    assert params.stop == ("END",) and params.max_tokens == 4 and params.logprobs is None
    await post(client, key, "/v1/chat/completions", {**CHAT, "stop": ["a", "b"], "top_k": -1})
    assert fake.requests[-1][2].stop == ("a", "b") and fake.requests[-1][2].top_k == 0


async def test_text_content_parts_are_joined(client: Any, key: str, fake: FakeEngineClient) -> None:
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    body = {**CHAT, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": parts}]}
    assert (await post(client, key, "/v1/chat/completions", body)).status_code == 200
    assert fake.requests[-1][1] == fake.tokenizer.encode("<system>s<user>hi<assistant>")


async def test_logprobs(client: Any, key: str) -> None:
    chat = await post(client, key, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2})
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and content[0]["token"] == "t0 " and content[0]["logprob"] == -0.1
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["t0 ", "x"]
    assert content[0]["bytes"] == list(b"t0 ")
    text = await post(client, key, "/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 1})
    logprobs = text.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"][:2] == ["t0 ", "t1 "] and logprobs["text_offset"][:2] == [0, 3]
    assert logprobs["top_logprobs"][0] == {"t0 ": -0.1}


async def test_queue_full_is_503_with_retry_after(client: Any, key: str, fake: FakeEngineClient) -> None:
    fake.reject_next = "queue_full"
    response = await post(client, key, "/v1/chat/completions", CHAT)
    assert_openai_error(response, 503, "overloaded")
    assert int(response.headers["retry-after"]) >= 1


async def test_loading_engine_is_503_and_not_ready(db_path: Path) -> None:
    fake = FakeEngineClient(start_delay=30)
    async with client_for(fake, db_path, ready=False) as loading:
        assert (await loading.get("/health")).status_code == 200
        assert_openai_error(await loading.get("/ready"), 503, "not_ready")
        key = await new_key(loading)
        response = await post(loading, key, "/v1/chat/completions", CHAT)
        assert "loading" in assert_openai_error(response, 503, "not_ready")["message"]
        assert "retry-after" in response.headers
        fake.load_step = "loading weights: 40% (2/5, 00:03 elapsed)"  # the load's latest progress line
        ready = assert_openai_error(await loading.get("/ready"), 503, "not_ready")
        assert "loading: loading weights: 40% (2/5" in ready["message"]
