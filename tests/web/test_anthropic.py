"""The Anthropic Messages API on the fake engine: the message and its stream as Anthropic shapes them, the
conversation as the chat template gets it, count_tokens, and every refusal in Anthropic's error shape with
Anthropic's status, its history row kept."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine import EngineDeadError, RequestOutput, SamplingParams, Tenant
from tests.web.conftest import MODEL, bearer, client_for, new_key, rows
from tests.web.fakes import FakeEngineClient
from tests.web.test_tools_routes import CALL, ScriptedFake
from web.anthropic.formatting import stop_reason

USER = [{"role": "user", "content": "hi"}]
BODY = {"model": MODEL, "max_tokens": 3, "messages": USER}


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


def x_api_key(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01"}


async def send(client: Any, key: str, body: Any, path: str = "/v1/messages") -> Any:
    return await client.post(path, json=body, headers=x_api_key(key))


def assert_anthropic_error(response: Any, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def events(text: str) -> list[tuple[str, Any]]:
    """(event, data) of each Server-Sent Event, skipping comments; each event line names its data's type."""
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert data["type"] == name
        out.append((name, data))
    return out


def prompt_of(fake: FakeEngineClient) -> str:
    """The fake tokenizer's ids (one per character) back into the text the chat template gave."""
    return "".join(chr(t) for t in fake.requests[-1][1])


async def test_message_shape_headers_and_row(client: Any, key: str, db: sqlite3.Connection) -> None:
    response = await send(client, key, {**BODY, "metadata": {"user_id": "u-42"}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("msg_") and response.headers["request-id"] == body["id"]
    assert response.headers["x-request-id"] == body["id"]
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", MODEL)
    assert body["content"] == [{"type": "text", "text": "t0 t1 t2 "}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("max_tokens", None)
    usage = {"input_tokens": 19, "output_tokens": 3, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    assert body["usage"] == usage
    (row,) = rows(db, "SELECT id, endpoint, status, user, prompt_tokens, completion_tokens FROM requests")
    assert tuple(row) == (body["id"], "messages", "finished", "u-42", 19, 3)
    ended = await send(client, key, {**BODY, "max_tokens": 30})
    assert ended.json()["stop_reason"] == "end_turn"


def test_stop_reasons() -> None:
    matched = RequestOutput("r", [], "", finished=True, finish_reason="stop", stop_reason="END")
    assert stop_reason(matched, called=False) == ("stop_sequence", "END")
    eos = RequestOutput("r", [], "", finished=True, finish_reason="stop", stop_reason=0)
    assert stop_reason(eos, called=False) == ("end_turn", None)
    assert stop_reason(eos, called=True) == ("tool_use", None)


async def test_bearer_key_and_sampling_fields(client: Any, key: str, fake: FakeEngineClient) -> None:
    body = {**BODY, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "stop_sequences": ["END", "\n\n"]}
    assert (await client.post("/v1/messages", json=body, headers=bearer(key))).status_code == 200
    params: SamplingParams = fake.requests[-1][2]
    assert (params.temperature, params.top_p, params.top_k, params.stop) == (0.5, 0.9, 7, ("END", "\n\n"))
    assert params.max_tokens == 3


async def test_conversation_reaches_the_template(client: Any, key: str, fake: FakeEngineClient) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "c"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                {"type": "text", "text": "d"},
            ],
        },
    ]
    system = [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2", "cache_control": {"type": "ephemeral"}}]
    assert (await send(client, key, {**BODY, "system": system, "messages": messages})).status_code == 200
    # The fake's template knows no tools: the call and its result take the fallback prompt's blocks (web/tools).
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    result = "<tool_response>\n42\n</tool_response>"
    assert prompt_of(fake) == f"<system>S1\nS2<user>a\nb<assistant>c\n{call}<user>{result}<user>d<assistant>"
    assert (await send(client, key, {**BODY, "system": "plain"})).status_code == 200
    assert prompt_of(fake) == "<system>plain<user>hi<assistant>"


async def test_stream_event_sequence(client: Any, key: str, db: sqlite3.Connection) -> None:
    response = await send(client, key, {**BODY, "stream": True, "max_tokens": 30})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    seen = events(response.text)
    names = [name for name, _ in seen]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = seen[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["usage"]["input_tokens"] == 19
    assert response.headers["request-id"] == start["id"]
    assert seen[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert text == "t0 t1 t2 t3 t4 "
    delta = seen[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 5 and delta["usage"]["input_tokens"] == 19
    (row,) = rows(db, "SELECT endpoint, stream, status FROM requests")
    assert tuple(row) == ("messages", 1, "finished")


class DiesMidStream(FakeEngineClient):
    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> AsyncIterator[RequestOutput]:
        yield RequestOutput(request_id or "r", [100], "t0 ")
        raise EngineDeadError("the engine process exited (code -9)")


async def test_an_error_mid_stream_is_an_error_event(db_path: Path, db: sqlite3.Connection) -> None:
    async with client_for(DiesMidStream(), db_path) as client:
        key = await new_key(client)
        response = await send(client, key, {**BODY, "stream": True})
    seen = events(response.text)
    assert [n for n, _ in seen][:3] == ["message_start", "ping", "content_block_start"]
    name, error = seen[-1]
    assert name == "error" and error["error"]["type"] == "api_error" and "exited" in error["error"]["message"]
    assert [tuple(r) for r in rows(db, "SELECT endpoint, status FROM requests")] == [("messages", "failed")]


async def test_count_tokens_admits_nothing(client: Any, key: str, db: sqlite3.Connection) -> None:
    body = {"model": MODEL, "system": "s", "messages": USER}
    response = await send(client, key, body, "/v1/messages/count_tokens")
    assert response.status_code == 200 and response.json() == {"input_tokens": 28}
    created = await send(client, key, {**body, "max_tokens": 2})
    assert created.json()["usage"]["input_tokens"] == 28
    assert len(rows(db, "SELECT id FROM requests")) == 1  # the message only
    refused = await send(client, key, {**body, "model": "claude-x"}, "/v1/messages/count_tokens")
    assert_anthropic_error(refused, 404, "not_found_error")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "text": "x"}]}]}, "type"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text-only"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "text-only"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "assistant",
        ),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"output_config": {"format": {"type": "json_schema", "schema": 5}}}, "output_config.format.schema"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, "output_config.format"),
        ({"output_format": {"type": "json_schema", "schema": {"type": "nope"}}}, "output_format"),
        ({"output_format": {"type": "text"}}, "output_format.type"),
        ({"thinking": "on"}, "thinking"),
    ],
)
async def test_bad_bodies_are_invalid_request_errors(
    client: Any, key: str, db: sqlite3.Connection, change: dict[str, Any], needle: str
) -> None:
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    response = await send(client, key, body)
    assert needle in assert_anthropic_error(response, 400, "invalid_request_error")
    (row,) = rows(db, "SELECT id, endpoint, status FROM requests")
    assert (row["endpoint"], row["status"]) == ("messages", "rejected")
    assert response.headers["request-id"] == row["id"]


async def test_not_json_and_unknown_model(client: Any, key: str) -> None:
    headers = {**x_api_key(key), "content-type": "application/json"}
    response = await client.post("/v1/messages", content=b"{not json", headers=headers)
    assert "not valid JSON" in assert_anthropic_error(response, 400, "invalid_request_error")
    assert_anthropic_error(await send(client, key, {**BODY, "model": "claude-x"}), 404, "not_found_error")


async def test_auth_failures(client: Any, key: str) -> None:
    missing = await client.post("/v1/messages", json=BODY)
    assert "x-api-key" in assert_anthropic_error(missing, 401, "authentication_error")
    wrong = await client.post("/v1/messages", json=BODY, headers=x_api_key("sk-wrong"))
    assert_anthropic_error(wrong, 401, "authentication_error")
    counted = await client.post("/v1/messages/count_tokens", json=BODY, headers={"x-api-key": ""})
    assert_anthropic_error(counted, 401, "authentication_error")


async def test_litestar_refusals_on_these_paths(client: Any, key: str) -> None:
    assert_anthropic_error(await client.get("/v1/messages", headers=x_api_key(key)), 405, "invalid_request_error")
    assert_anthropic_error(await send(client, key, BODY, "/v1/messages/nope"), 404, "not_found_error")
    openai = await client.post("/v1/nope", json=BODY, headers=x_api_key(key))
    assert openai.status_code == 404 and "error" in openai.json() and "type" not in openai.json()


async def test_quota_and_key_cap(client: Any, db: sqlite3.Connection) -> None:
    poor = await new_key(client, name="poor", quota_tokens=10, quota_period="none")
    assert "quota" in assert_anthropic_error(await send(client, poor, BODY), 429, "rate_limit_error")
    capped = await new_key(client, name="capped", max_tokens_per_request=2)
    trimmed = await send(client, capped, BODY)  # asks for 3: runs with the cap's 2 (the default policy)
    assert trimmed.json()["stop_reason"] == "max_tokens" and trimmed.json()["usage"]["output_tokens"] == 2
    assert trimmed.headers["x-max-tokens-trimmed-to"] == "2"
    assert sorted(r["status"] for r in rows(db, "SELECT status FROM requests")) == ["finished", "rejected"]


async def test_overloaded_is_529(client: Any, key: str, fake: FakeEngineClient, db: sqlite3.Connection) -> None:
    fake.reject_next = "queue_full"
    response = await send(client, key, BODY)
    assert_anthropic_error(response, 529, "overloaded_error")
    assert int(response.headers["retry-after"]) >= 1
    fake.reject_next = "queue_full"
    streamed = await send(client, key, {**BODY, "stream": True})  # refused before its first event: a status
    assert_anthropic_error(streamed, 529, "overloaded_error")
    first, second = rows(db, "SELECT id, status FROM requests ORDER BY arrival_at")
    assert (first["status"], second["status"]) == ("rejected", "rejected")
    assert (response.headers["request-id"], streamed.headers["request-id"]) == (first["id"], second["id"])


async def test_not_ready_is_503(db_path: Path) -> None:
    async with client_for(FakeEngineClient(start_delay=30), db_path, ready=False) as loading:
        key = await new_key(loading)
        response = await send(loading, key, BODY)
        assert "loading" in assert_anthropic_error(response, 503, "api_error")


# -- tools ---------------------------------------------------------------------------------------------------

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOLS = {**BODY, "max_tokens": 64, "tools": [WEATHER]}


async def scripted(db_path: Path, script: Sequence[str]) -> Any:
    fake = ScriptedFake(max_model_len=4096)
    fake.script = script
    return client_for(fake, db_path)


async def test_a_tool_call_is_a_tool_use_block(db_path: Path) -> None:
    async with await scripted(db_path, CALL) as client:
        key = await new_key(client)
        body = (await send(client, key, TOOLS)).json()
        streamed = events((await send(client, key, {**TOOLS, "stream": True})).text)
    assert body["stop_reason"] == "tool_use"
    text, call = body["content"]
    assert text == {"type": "text", "text": "Let me look."}
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_")
    assert (call["name"], call["input"]) == ("get_weather", {"city": "Paris"})
    starts = [d["content_block"] for n, d in streamed if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {} and starts[1]["id"].startswith("toolu_")
    fragments = [d["delta"]["partial_json"] for n, d in streamed if n == "content_block_delta" and d["index"] == 1]
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert [d["index"] for n, d in streamed if n == "content_block_stop"] == [0, 1]
    assert streamed[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_forced_tool_choices_constrain_the_output(db_path: Path) -> None:
    async with await scripted(db_path, ['{"city"', ': "Oslo"}']) as client:
        key = await new_key(client)
        named = await send(client, key, {**TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}})
    body = named.json()
    assert body["stop_reason"] == "tool_use"
    (call,) = body["content"]
    assert (call["name"], call["input"]) == ("get_weather", {"city": "Oslo"})


async def test_tool_choices_reach_the_engine(db_path: Path) -> None:
    fake = ScriptedFake(max_model_len=4096)
    fake.script = ["ok"]
    async with client_for(fake, db_path) as client:
        key = await new_key(client)
        cases: list[tuple[dict[str, Any], Any]] = [
            ({"type": "tool", "name": "get_weather"}, WEATHER["input_schema"]),
            ({"type": "any", "disable_parallel_tool_use": True}, None),
            ({"type": "auto"}, None),
            ({"type": "none"}, None),
        ]
        for choice, guided in cases:
            assert (await send(client, key, {**TOOLS, "tool_choice": choice})).status_code == 200
            params: SamplingParams = fake.requests[-1][2]
            if choice["type"] == "any":
                assert params.guided is not None and json.loads(params.guided.schema)["type"] == "object"
            elif guided is not None:
                assert params.guided is not None and json.loads(params.guided.schema) == guided
            else:
                assert params.guided is None
            rendered = "get_weather" in prompt_of(fake)
            assert rendered == (choice["type"] != "none"), choice


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tools": None, "tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [{**WEATHER, "input_schema": {"type": "string"}}]}, "tools[0].input_schema"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
        ({"tools": [{**WEATHER, "type": "web_search_20250305"}]}, "tools[0].type"),
    ],
)
async def test_bad_tools_are_invalid_request_errors(
    client: Any, key: str, db: sqlite3.Connection, change: dict[str, Any], param: str
) -> None:
    body = {k: v for k, v in {**TOOLS, **change}.items() if v is not None}
    message = assert_anthropic_error(await send(client, key, body), 400, "invalid_request_error")
    assert message.startswith(param), message
    assert [r["status"] for r in rows(db, "SELECT status FROM requests")] == ["rejected"]


async def test_count_tokens_counts_the_tools(db_path: Path) -> None:
    plain = {"model": MODEL, "messages": USER}
    async with await scripted(db_path, ["ok"]) as client:  # a context the fallback tool prompt fits in
        key = await new_key(client)
        without = (await send(client, key, plain, "/v1/messages/count_tokens")).json()["input_tokens"]
        counted = await send(client, key, {**plain, "tools": [WEATHER]}, "/v1/messages/count_tokens")
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > without + len("get_weather")


async def test_a_body_too_large_is_413(db_path: Path, db: sqlite3.Connection) -> None:
    async with client_for(FakeEngineClient(), db_path, max_body_bytes=2000) as small:
        key = await new_key(small)
        response = await send(small, key, {**BODY, "system": "x" * 5000})
    assert_anthropic_error(response, 413, "request_too_large")
    (row,) = rows(db, "SELECT endpoint, status FROM requests")
    assert tuple(row) == ("messages", "rejected")
