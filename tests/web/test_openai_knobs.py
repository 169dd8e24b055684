"""Issue 13's OpenAI surface on the fake engine: the sampling knobs, response_format, chat_template_kwargs and
content parts reach the engine in its terms (or are refused in OpenAI's error shape, the refusal kept in the
history); n choices (indexed, billed once for the prompt, reserved n times, aborted together); and the wire details
clients read: cached_tokens, x-request-id, x-should-retry, system_fingerprint."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine import GuidedDecoding, ModelInfo
from tests.web.conftest import MODEL, InLoop, assert_openai_error, bearer, client_for, new_key, rows, sse_events
from tests.web.fakes import FakeEngineClient
from tests.web.test_lifecycle import call_then_disconnect
from web.openai.formatting import system_fingerprint

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}  # 19 prompt tokens on the fake
TEXT = {"model": MODEL, "prompt": "abc"}


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


async def post(client: Any, key: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> Any:
    return await client.post(path, json=body, headers=bearer(key))


async def test_sampling_knobs_reach_the_engine(client: Any, key: str, fake: FakeEngineClient) -> None:
    knobs = {
        "min_p": 0.1, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": -1.5,
        "logit_bias": {"5": 10, "999": -100},
    }  # fmt: skip
    for body, path in ((CHAT, "/v1/chat/completions"), (TEXT, "/v1/completions")):
        assert (await post(client, key, {**body, **knobs}, path)).status_code == 200
        params = fake.requests[-1][2]
        assert (params.min_p, params.repetition_penalty) == (0.1, 1.3)
        assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.5)
        assert params.logit_bias == ((5, 10.0), (999, -100.0))
    assert (await post(client, key, CHAT)).status_code == 200
    plain = fake.requests[-1][2]  # without the fields: the engine's neutral values
    assert (plain.min_p, plain.repetition_penalty, plain.presence_penalty, plain.logit_bias) == (0, 1, 0, ())


@pytest.mark.parametrize(
    ("change", "code", "param"),
    [
        ({"presence_penalty": 2.5}, None, "presence_penalty"),
        ({"frequency_penalty": -3}, None, "frequency_penalty"),
        ({"min_p": 1.5}, None, "min_p"),
        ({"repetition_penalty": 0}, None, "repetition_penalty"),
        ({"repetition_penalty": 11}, None, "repetition_penalty"),  # the engine's bound
        ({"logit_bias": {"1000": 1}}, None, "logit_bias"),  # the fake's vocabulary is 1000 tokens
        ({"logit_bias": {"-1": 1}}, None, None),
        ({"logit_bias": {"five": 1}}, None, None),
        ({"logit_bias": {"5": 101}}, None, None),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, None, "logit_bias"),
        ({"n": 0}, None, "n"),
        ({"n": 9}, None, "n"),
        ({"seed": 2**64 - 1, "n": 2}, None, "seed"),  # the second choice's seed is past the engine's range
        ({"chat_template_kwargs": {"messages": []}}, None, None),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, None, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"eos_token": "</s>"}}, None, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"not a name": True}}, None, None),
        ({"chat_template_kwargs": {"deep": {"a": 1}}}, None, None),
        ({"chat_template_kwargs": {f"k{i}": 1 for i in range(17)}}, None, "chat_template_kwargs"),
        ({"response_format": {"type": "yaml"}}, None, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, None, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            None,
            "response_format",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
            "unsupported_parameter",
            "messages[0].content[1].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "unsupported_parameter",
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
            "unsupported_parameter",
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, None, "messages[0].content[0].type"),
    ],
)
async def test_refusals_are_openai_errors_and_kept(
    client: Any, key: str, db: sqlite3.Connection, fake: FakeEngineClient, change: dict, code: Any, param: Any
) -> None:
    response = await post(client, key, {**CHAT, **change})
    error = assert_openai_error(response, 400, code, param)
    if code is None:
        assert error["type"] == "invalid_request_error" and error["code"] is None
    if param is not None and param.startswith("messages"):
        assert "text-only" in error["message"] or "video" in error["message"]
    (row,) = rows(db, "SELECT id, status, error FROM requests")
    assert (row["status"], row["error"]) == ("rejected", error["message"])
    assert response.headers["x-request-id"] == row["id"]
    assert not fake.requests  # nothing reached the engine


async def test_chat_template_kwargs_reach_the_template(client: Any, key: str, fake: FakeEngineClient) -> None:
    body = {**CHAT, "chat_template_kwargs": {"enable_thinking": False, "style": "terse"}}
    assert (await post(client, key, body)).status_code == 200
    sent = fake.tokenizer.template_kwargs
    assert sent["enable_thinking"] is False and sent["style"] == "terse" and sent["add_generation_prompt"] is True


async def test_response_format_becomes_the_engine_constraint(client: Any, key: str, fake: FakeEngineClient) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    spec = {"name": "place", "schema": schema, "strict": True}
    cases = [
        ({"type": "text"}, None),
        ({"type": "json_object"}, GuidedDecoding(kind="json_object")),
        ({"type": "json_schema", "json_schema": {"name": "any"}}, GuidedDecoding(kind="json_object")),
    ]
    for response_format, guided in cases:
        assert (await post(client, key, {**CHAT, "response_format": response_format})).status_code == 200
        assert fake.requests[-1][2].guided == guided
    for body, path in ((CHAT, "/v1/chat/completions"), (TEXT, "/v1/completions")):
        with_schema = {**body, "response_format": {"type": "json_schema", "json_schema": spec}}
        assert (await post(client, key, with_schema, path)).status_code == 200
        guided = fake.requests[-1][2].guided
        assert guided is not None and guided.kind == "json_schema" and json.loads(guided.schema) == schema


async def test_n_choices_in_one_body(client: Any, db: sqlite3.Connection, fake: FakeEngineClient) -> None:
    key = await new_key(client, quota_tokens=1000)
    response = await post(client, key, {**CHAT, "n": 3, "seed": 7, "logprobs": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "t0 t1 t2 t3 t4 " and c["finish_reason"] == "stop" for c in body["choices"])
    assert all(len(c["logprobs"]["content"]) == 5 for c in body["choices"])
    assert body["usage"]["prompt_tokens"] == 19 and body["usage"]["completion_tokens"] == 15
    ids = [rid for rid, _, _ in fake.requests]
    assert ids == [body["id"], body["id"] + ".1", body["id"] + ".2"]
    assert [p.seed for _, _, p in fake.requests] == [7, 8, 9]
    assert all(prompt == fake.requests[0][1] for _, prompt, _ in fake.requests)
    (row,) = rows(db, "SELECT id, status, prompt_tokens, completion_tokens FROM requests")
    assert (row["id"], row["status"], row["prompt_tokens"], row["completion_tokens"]) == (
        body["id"],
        "finished",
        19,
        15,
    )
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert (quota["used_tokens"], quota["reserved_tokens"]) == (19 + 15, 0)


async def test_n_choices_share_what_the_quota_leaves(
    client: Any, db: sqlite3.Connection, fake: FakeEngineClient
) -> None:
    key = await new_key(client, quota_tokens=19 + 3 * 4 + 2)  # room for 3 choices of 4 tokens, not of 10
    body = (await post(client, key, {**CHAT, "n": 3, "max_tokens": 10})).json()
    assert [p.max_tokens for _, _, p in fake.requests] == [4, 4, 4]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    (row,) = rows(db, "SELECT max_tokens_applied, completion_tokens FROM requests")
    assert (row["max_tokens_applied"], row["completion_tokens"]) == (4, 12)
    refused = await post(client, key, {**CHAT, "n": 3})  # 2 tokens left: not one for each choice
    assert_openai_error(refused, 429, "insufficient_quota")


async def test_n_choices_streamed(client: Any, key: str) -> None:
    body = {**CHAT, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events((await post(client, key, body)).text)
    assert events[-1] == "[DONE]"
    chunks = [c for c in events[:-1] if c["choices"]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant" and all("role" not in c["delta"] for c in mine[1:])
        assert "".join(c["delta"].get("content", "") for c in mine) == "t0 t1 t2 t3 t4 "
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["stop"]
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 10
    assert events[-2]["usage"]["prompt_tokens"] == 19
    text = {**TEXT, "n": 2, "stream": True, "logprobs": 1}
    pieces = [c["choices"][0] for c in sse_events((await post(client, key, text, "/v1/completions")).text)[:-1]]
    for index in (0, 1):
        offsets = [o for c in pieces if c["index"] == index for o in c["logprobs"]["text_offset"]]
        assert offsets == [0, 3, 6, 9, 12]  # each choice counts its own text


async def test_a_disconnect_aborts_every_choice(in_loop: InLoop, db: sqlite3.Connection) -> None:
    in_loop.fake.token_delay = 0.02
    key = await new_key(in_loop.http, quota_tokens=10_000)
    body = {**CHAT, "n": 3, "stream": True, "max_tokens": 200, "ignore_eos": True}
    await call_then_disconnect(in_loop.app, key, body, after_chunks=4)
    await in_loop.gateway.writer.flush()
    (row,) = rows(db, "SELECT * FROM requests")
    assert row["status"] == "cancelled"
    choices = [row["id"], row["id"] + ".1", row["id"] + ".2"]
    assert set(choices) <= set(in_loop.fake.closed_early)
    generated = sum(in_loop.fake.generated[c] for c in choices)
    assert 0 < row["completion_tokens"] <= generated < 600
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert quota["used_tokens"] == 19 + row["completion_tokens"] and quota["reserved_tokens"] == 0
    assert not in_loop.gateway.inflight and in_loop.gateway.limiter.in_flight(1) == 0


async def test_cached_tokens_in_bodies_and_the_usage_chunk(client: Any, key: str, fake: FakeEngineClient) -> None:
    fake.cached_prompt_tokens = 16
    body = (await post(client, key, CHAT)).json()
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    stream = {**TEXT, "stream": True, "stream_options": {"include_usage": True}}
    usage = sse_events((await post(client, key, stream, "/v1/completions")).text)[-2]["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}  # all of a 3-token prompt


async def test_request_id_and_fingerprint(client: Any, key: str, db: sqlite3.Connection) -> None:
    plain = await post(client, key, CHAT)
    streamed = await post(client, key, {**CHAT, "stream": True})
    unknown = await post(client, key, {**CHAT, "model": "gpt-4o"})
    assert_openai_error(unknown, 404, "model_not_found")
    ids = [r["id"] for r in rows(db, "SELECT id FROM requests ORDER BY arrival_at")]
    assert [plain.headers["x-request-id"], streamed.headers["x-request-id"], unknown.headers["x-request-id"]] == ids
    fingerprint = plain.json()["system_fingerprint"]
    assert fingerprint.startswith("fp_") and (await post(client, key, CHAT)).json()["system_fingerprint"] == fingerprint
    assert {c["system_fingerprint"] for c in sse_events(streamed.text)[:-1]} == {fingerprint}
    text = await post(client, key, TEXT, "/v1/completions")
    assert text.json()["system_fingerprint"] == fingerprint


def test_the_fingerprint_follows_the_model_and_the_engine_settings() -> None:
    info = ModelInfo("m", 512, "/d", [0], "cpu", "float32", "none", 64, 16, 1024)
    assert system_fingerprint(info) == system_fingerprint(
        ModelInfo("m", 512, "/d", [0], "cpu", "float32", "none", 64, 16, 1024)
    )
    for other in (
        ModelInfo("m2", 512, "/d", [0], "cpu", "float32", "none", 64, 16, 1024),
        ModelInfo("m", 512, "/d", [0], "cpu", "bfloat16", "none", 64, 16, 1024),
        ModelInfo("m", 512, "/d", [0], "cpu", "float32", "none", 128, 16, 1024),
    ):
        assert system_fingerprint(other) != system_fingerprint(info)


async def test_an_empty_quota_says_do_not_retry(client: Any) -> None:
    key = await new_key(client, quota_tokens=10)  # less than the prompt
    response = await post(client, key, CHAT)
    assert_openai_error(response, 429, "insufficient_quota")
    assert response.headers["x-should-retry"] == "false" and response.headers["x-request-id"].startswith("chatcmpl-")


async def test_the_history_keeps_every_choice(fake: FakeEngineClient, db_path: Path, db: sqlite3.Connection) -> None:
    async with client_for(fake, db_path, store_text=True) as keeping:
        key = await new_key(keeping)
        assert (await post(keeping, key, {**CHAT, "n": 2, "max_tokens": 2})).status_code == 200
    (row,) = rows(db, "SELECT response_text FROM requests")
    assert row["response_text"] == "[choice 0]\nt0 t1 \n\n[choice 1]\nt0 t1 "
