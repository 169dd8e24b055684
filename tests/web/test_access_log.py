"""What the operator sees of every request without a proxy: one access-log line each (never the key), every
refusal counted in /metrics by its code (unknown routes and auth failures included), HEAD on GET routes, and
`x-should-retry: false` on the 4xx a retry cannot fix."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.web.conftest import ADMIN, METRICS_TOKEN, MODEL, bearer, new_key, sse_events

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "web.access"]


async def test_each_request_is_one_line_with_the_key_name_and_never_the_key(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    key = await new_key(client, name="alice")
    with caplog.at_level(logging.INFO, logger="web.access"):
        ok = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        lost = await client.get("/v1/no-such-route", headers=bearer(key))
        wrong = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-wrong"))
    assert ok.status_code == 200 and lost.status_code == 404 and wrong.status_code == 401
    lines = access_lines(caplog)
    assert len(lines) == 3, lines
    assert '"POST /v1/chat/completions" 200 alice tokens=23 ' in lines[0]  # 19 prompt + 4 completion tokens
    assert '"GET /v1/no-such-route" 404 - tokens=- ' in lines[1] and lines[1].endswith(" not_found")
    assert '"POST /v1/chat/completions" 401 -' in lines[2] and lines[2].endswith(" invalid_api_key")
    assert not any(key in line or "sk-wrong" in line for line in lines)


async def test_a_generation_logs_the_tokens_it_was_charged(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Prompt + completion, as the usage and the quota count them, streamed or not, on both APIs; none where
    nothing was generated."""
    key = await new_key(client, name="bob")
    message = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with caplog.at_level(logging.INFO, logger="web.access"):
        chat = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        streamed = await client.post(
            "/v1/chat/completions",
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
            headers=bearer(key),
        )
        anthropic = await client.post("/v1/messages", json=message, headers={"x-api-key": key})
        refused = await client.post("/v1/chat/completions", json={**CHAT, "n": 99}, headers=bearer(key))
    usage = chat.json()["usage"]
    streamed_usage = [e for e in sse_events(streamed.text) if e != "[DONE]" and e.get("usage")][-1]["usage"]
    counts = anthropic.json()["usage"]
    lines = access_lines(caplog)
    assert f" bob tokens={usage['prompt_tokens'] + usage['completion_tokens']} " in lines[0]
    assert f" bob tokens={streamed_usage['total_tokens']} " in lines[1]
    assert f" bob tokens={counts['input_tokens'] + counts['output_tokens']} " in lines[2]
    assert refused.status_code == 400 and " bob tokens=- " in lines[3]


async def test_refusals_are_counted_by_code(client: Any) -> None:
    await client.get("/v1/no-such-route")
    await client.post("/v1/chat/completions", json=CHAT)
    await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-wrong"))
    await client.post("/v1/messages", json={}, headers={"x-api-key": "sk-wrong"})
    metrics = (await client.get("/metrics", headers=bearer(METRICS_TOKEN))).text
    for status, code in [
        ("404", "not_found"),
        ("401", "missing_api_key"),
        ("401", "invalid_api_key"),
        ("401", "authentication_error"),
    ]:
        line = f'appliance_http_refusals_total{{code="{code}",status="{status}"}}'
        assert any(x.startswith(line) and float(x.rsplit(" ", 1)[1]) >= 1 for x in metrics.splitlines()), code


async def test_head_answers_every_get_route_without_a_body(client: Any) -> None:
    key = await new_key(client)
    for path, headers in [("/health", {}), ("/", {}), ("/v1/models", bearer(key))]:
        get = await client.get(path, headers=headers)
        head = await client.head(path, headers=headers)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b"" and head.headers.get("content-type") == get.headers.get("content-type")


MESSAGE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
GOOD = "good"  # replaced by a key the test makes
HUGE = "x" * (4 << 20)  # past the body limit


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [
        # auth failures: none, a wrong one; each API in its own shape
        ("POST", "/v1/chat/completions", CHAT, {}, 401),
        ("POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer sk-wrong"}, 401),
        ("POST", "/v1/messages", MESSAGE, {}, 401),
        ("POST", "/v1/messages", {"max_tokens": 1}, {"x-api-key": "sk-wrong"}, 401),
        ("POST", "/v1/messages/count_tokens", MESSAGE, {"x-api-key": "sk-wrong"}, 401),
        # bad bodies
        ("POST", "/v1/chat/completions", {"model": MODEL}, {"Authorization": GOOD}, 400),
        ("POST", "/v1/messages", {"model": MODEL, "messages": []}, {"x-api-key": GOOD}, 400),
        # unknown routes and models
        ("GET", "/v1/nothing-here", None, {}, 404),
        ("POST", "/v1/messages/nope", MESSAGE, {"x-api-key": GOOD}, 404),
        ("POST", "/v1/chat/completions", {**CHAT, "model": "gpt-4o"}, {"Authorization": GOOD}, 404),
        ("POST", "/v1/messages", {**MESSAGE, "model": "claude-x"}, {"x-api-key": GOOD}, 404),
        ("DELETE", "/v1/models", None, {}, 405),
        ("GET", "/v1/messages", None, {"x-api-key": GOOD}, 405),
        # too large
        ("POST", "/v1/chat/completions", {**CHAT, "user": HUGE}, {"Authorization": GOOD}, 413),
        ("POST", "/v1/messages", {**MESSAGE, "system": HUGE}, {"x-api-key": GOOD}, 413),
        # a cross-site write to the admin API (no API route answers 403 or 422)
        ("POST", "/admin/api/keys", {"name": "x"}, {"Authorization": "admin", "Origin": "https://evil.example"}, 403),
    ],
)
async def test_final_refusals_say_do_not_retry(
    client: Any, method: str, path: str, body: Any, headers: dict[str, str], status: int
) -> None:
    if GOOD in headers.values():
        key = await new_key(client)
        headers = {
            k: (f"Bearer {key}" if k == "Authorization" else key) if v == GOOD else v for k, v in headers.items()
        }
    if headers.get("Authorization") == "admin":
        headers = {**headers, **ADMIN}
    response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["x-should-retry"] == "false"
    error = response.json()
    if path.startswith("/v1/messages"):  # Anthropic's shape on its paths, OpenAI's elsewhere
        assert error["type"] == "error" and error["error"]["type"], error
    else:
        assert error["error"]["message"], error


async def test_a_bad_body_says_do_not_retry_but_an_overload_does_not(client: Any) -> None:
    key = await new_key(client)
    bad = await client.post("/v1/chat/completions", json={"model": MODEL}, headers=bearer(key))
    assert bad.status_code == 400 and bad.headers["x-should-retry"] == "false"
    ready = await client.get("/ready")
    assert "x-should-retry" not in ready.headers
