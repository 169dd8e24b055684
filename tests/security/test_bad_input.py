"""Bad input by hand, on the app in-process (fake engine, 512-token context): every case gets a clear 4xx in
OpenAI's error shape, never a 5xx, and every refused /v1 request still gets exactly one history row saying why.
Odd but valid inputs (NUL characters, the limits themselves) are served."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pytest

from tests.security.conftest import SERVER_ERRORS, TRIED, Appliance, figures, headers_for
from tests.web.conftest import MODEL, assert_openai_error
from tests.web.fakes import VOCAB
from web.config import WebConfig

CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH = "/v1/chat/completions", "/v1/completions", "/v1/responses"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, Any] = {"model": MODEL, "prompt": "hi"}
BODY_LIMIT = WebConfig(database_url="").max_body_bytes  # the default the module's app runs with
DEEP = 5_000  # nesting levels: a 10 kB body
DEEP_TOOL = (
    f', "tools": [{{"type": "function", "name": "f", "parameters": {{"x": {"[" * DEEP + "]" * DEEP}}}}}]}}'.encode()
)


@dataclass(frozen=True)
class Bad:
    path: str
    body: bytes | None
    status: int
    code: str | None = None
    param: str | None = None
    method: str = "POST"


def chat(**change: Any) -> bytes:
    return json.dumps({**CHAT, **change}).encode()


def response(**change: Any) -> bytes:
    return json.dumps({"model": MODEL, "input": "hi", **change}).encode()


def completion(**change: Any) -> bytes:
    return json.dumps({**COMPLETION, **change}).encode()


def message(**fields: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi", **fields}]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def xfail(bug: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"{bug} in tests/security/BUGS.md")


CASES: dict[str, Any] = {
    # the body as a whole
    "invalid JSON": Bad(CHAT_PATH, b'{"model": "fake-model", "messages": [', 400),
    "empty body": Bad(CHAT_PATH, b"", 400),
    "whitespace body": Bad(COMPLETIONS_PATH, b" \n\t ", 400),
    "JSON null": Bad(CHAT_PATH, b"null", 400),
    "JSON array": Bad(COMPLETIONS_PATH, b"[1, 2]", 400),
    "byte order mark": Bad(CHAT_PATH, b"\xef\xbb\xbf" + chat(), 400),
    "invalid UTF-8 in a string": Bad(CHAT_PATH, chat().replace(b'"hi"', b'"h\xff\xfei"'), 400),
    "invalid UTF-8 in a completion prompt": Bad(COMPLETIONS_PATH, completion().replace(b'"hi"', b'"\xc3\x28"'), 400),
    "lone surrogate escape": Bad(CHAT_PATH, chat().replace(b'"hi"', b'"\\ud800"'), 400),
    "NaN literal": Bad(CHAT_PATH, chat()[:-1] + b', "temperature": NaN}', 400),
    "number beyond float": Bad(CHAT_PATH, chat()[:-1] + b', "temperature": 1e400}', 400, param="temperature"),
    "body over the size limit": Bad(CHAT_PATH, chat(user="x" * BODY_LIMIT), 413, "request_too_large"),
    "deeply nested unknown field": Bad(CHAT_PATH, chat()[:-1] + f', "extra": {nested(DEEP)}}}'.encode(), 400),
    "deeply nested tool_choice": Bad(CHAT_PATH, chat()[:-1] + f', "tool_choice": {nested(DEEP)}}}'.encode(), 400),
    "deeply nested prompt": Bad(COMPLETIONS_PATH, f'{{"model": "{MODEL}", "prompt": {nested(DEEP)}}}'.encode(), 400),
    # the Responses API
    "responses: no input": Bad(RESPONSES_PATH, json.dumps({"model": MODEL}).encode(), 400),
    "responses: input a number": Bad(RESPONSES_PATH, response(input=5), 400, param="input"),
    "responses: unknown item type": Bad(RESPONSES_PATH, response(input=[{"type": "computer_call"}]), 400),
    "responses: item not an object": Bad(RESPONSES_PATH, response(input=["hi"]), 400),
    "responses: tool role": Bad(RESPONSES_PATH, response(input=[{"role": "tool", "content": "x"}]), 400),
    "responses: image part": Bad(
        RESPONSES_PATH,
        response(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]),
        400,
        "unsupported_parameter",
        "input[0].content[0].type",
    ),
    "responses: call output answering nothing": Bad(
        RESPONSES_PATH,
        response(input=[{"type": "function_call_output", "call_id": "c1", "output": "x"}]),
        400,
        param="input[0].call_id",
    ),
    "responses: call arguments not an object": Bad(
        RESPONSES_PATH,
        response(input=[{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "nope"}]),
        400,
        param="input[0].arguments",
    ),
    "responses: function tool without a name": Bad(
        RESPONSES_PATH, response(tools=[{"type": "function"}]), 400, param="tools[0]"
    ),
    "responses: deeply nested tool": Bad(RESPONSES_PATH, response()[:-1] + DEEP_TOOL, 400),
    "responses: named choice not offered": Bad(
        RESPONSES_PATH, response(tool_choice={"type": "function", "name": "f"}), 400, param="tool_choice.name"
    ),
    "responses: unknown text format": Bad(RESPONSES_PATH, response(text={"format": {"type": "yaml"}}), 400),
    "responses: json_schema without a schema": Bad(
        RESPONSES_PATH, response(text={"format": {"type": "json_schema", "name": "s"}}), 400
    ),
    "responses: max_output_tokens 0": Bad(
        RESPONSES_PATH, response(max_output_tokens=0), 400, param="max_output_tokens"
    ),
    "responses: background": Bad(RESPONSES_PATH, response(background=True), 400, "unsupported_parameter", "background"),
    "responses: 17 metadata keys": Bad(RESPONSES_PATH, response(metadata={str(i): "v" for i in range(17)}), 400),
    "responses: unknown previous response": Bad(
        RESPONSES_PATH, response(previous_response_id="resp_nope"), 400, "previous_response_not_found"
    ),
    "responses: id over 64 characters": Bad(
        RESPONSES_PATH, response(previous_response_id="r" * 65), 400, param="previous_response_id"
    ),
    "responses: read an unknown id": Bad(RESPONSES_PATH + "/resp_nope", None, 404, method="GET"),
    "responses: delete an unknown id": Bad(RESPONSES_PATH + "/resp_nope", None, 404, method="DELETE"),
    # wrong types
    "model is a number": Bad(CHAT_PATH, chat(model=7), 400, param="model"),
    "messages is a string": Bad(CHAT_PATH, chat(messages="hi"), 400, param="messages"),
    "message is a string": Bad(CHAT_PATH, chat(messages=["hi"]), 400, param="messages[0]"),
    "content is a number": Bad(CHAT_PATH, chat(messages=message(content=5)), 400),
    "max_tokens is text": Bad(CHAT_PATH, chat(max_tokens="ten"), 400, param="max_tokens"),
    "max_tokens is 5.5": Bad(CHAT_PATH, chat(max_tokens=5.5), 400, param="max_tokens"),
    "temperature is text": Bad(CHAT_PATH, chat(temperature="hot"), 400, param="temperature"),
    "stream is text": Bad(CHAT_PATH, chat(stream="yes"), 400, param="stream"),
    "stop is a number": Bad(CHAT_PATH, chat(stop=5), 400, param="stop"),
    "stream_options is a number": Bad(CHAT_PATH, chat(stream_options=5), 400, param="stream_options"),
    "stream_options without stream": Bad(CHAT_PATH, chat(stream_options={}), 400, param="stream_options"),
    "seed is text": Bad(COMPLETIONS_PATH, completion(seed="x"), 400, param="seed"),
    "prompt is an object": Bad(COMPLETIONS_PATH, completion(prompt={"a": 1}), 400, param="prompt"),
    "model missing": Bad(CHAT_PATH, json.dumps({"messages": CHAT["messages"]}).encode(), 400),
    "messages missing": Bad(CHAT_PATH, json.dumps({"model": MODEL}).encode(), 400),
    "chat body sent to completions": Bad(COMPLETIONS_PATH, chat(), 400),
    # messages
    "empty messages": Bad(CHAT_PATH, chat(messages=[]), 400, param="messages"),
    "unknown role": Bad(CHAT_PATH, chat(messages=[{"role": "wizard", "content": "x"}]), 400, param="messages[0].role"),
    "role missing": Bad(CHAT_PATH, chat(messages=[{"content": "x"}]), 400),
    "function role": Bad(
        CHAT_PATH,
        chat(messages=[{"role": "function", "content": "x"}]),
        400,
        "unsupported_parameter",
        "messages[0].role",
    ),
    "tool result answering no call": Bad(
        CHAT_PATH,
        chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "call_1"}]),
        400,
        param="messages[0].tool_call_id",
    ),
    "user message without content": Bad(CHAT_PATH, chat(messages=[{"role": "user"}]), 400, param="messages[0].content"),
    "image content part": Bad(
        CHAT_PATH, chat(messages=message(content=[{"type": "image_url"}])), 400, "unsupported_parameter"
    ),
    "tool_calls in a message": Bad(CHAT_PATH, chat(messages=message(tool_calls=[{}])), 400),
    "10,000 messages": Bad(
        CHAT_PATH, chat(messages=[{"role": "user", "content": "x"}] * 10_000), 400, "context_length_exceeded"
    ),
    "prompt beyond the context": Bad(
        CHAT_PATH, chat(messages=message(content="x" * 600)), 400, "context_length_exceeded", "messages"
    ),
    "completion prompt beyond the context": Bad(
        COMPLETIONS_PATH, completion(prompt="x" * 600), 400, "context_length_exceeded"
    ),
    # sampling parameters
    "max_tokens 0": Bad(CHAT_PATH, chat(max_tokens=0), 400, param="max_tokens"),
    "max_tokens negative": Bad(CHAT_PATH, chat(max_tokens=-5), 400, param="max_tokens"),
    "max_completion_tokens 0": Bad(CHAT_PATH, chat(max_completion_tokens=0), 400, param="max_tokens"),
    "temperature negative": Bad(CHAT_PATH, chat(temperature=-0.1), 400, param="temperature"),
    "temperature above 2": Bad(CHAT_PATH, chat(temperature=2.01), 400, param="temperature"),
    "top_p 0": Bad(CHAT_PATH, chat(top_p=0), 400, param="top_p"),
    "top_p above 1": Bad(CHAT_PATH, chat(top_p=1.5), 400, param="top_p"),
    "top_p negative": Bad(COMPLETIONS_PATH, completion(top_p=-1), 400, param="top_p"),
    "top_k below -1": Bad(CHAT_PATH, chat(top_k=-2), 400, param="top_k"),
    "17 stop strings": Bad(CHAT_PATH, chat(stop=["x"] * 17), 400, param="stop"),
    "100,000 stop strings": Bad(CHAT_PATH, chat(stop=["x"] * 100_000), 400, param="stop"),
    "empty stop string": Bad(CHAT_PATH, chat(stop=[""]), 400, param="stop"),
    "stop string of 257 characters": Bad(CHAT_PATH, chat(stop="x" * 257), 400, param="stop"),
    "n 9": Bad(CHAT_PATH, chat(n=9), 400, param="n"),
    "n 0": Bad(COMPLETIONS_PATH, completion(n=0), 400, param="n"),
    "presence_penalty 2.5": Bad(CHAT_PATH, chat(presence_penalty=2.5), 400, param="presence_penalty"),
    "repetition_penalty 0": Bad(COMPLETIONS_PATH, completion(repetition_penalty=0), 400, param="repetition_penalty"),
    "logit_bias beyond the vocabulary": Bad(CHAT_PATH, chat(logit_bias={"1000": 1}), 400, param="logit_bias"),
    "logit_bias of a word": Bad(CHAT_PATH, chat(logit_bias={"hello": 1}), 400),
    "logit_bias 101": Bad(CHAT_PATH, chat(logit_bias={"5": 101}), 400),
    "chat_template_kwargs naming messages": Bad(
        CHAT_PATH, chat(chat_template_kwargs={"messages": "x"}), 400, param="chat_template_kwargs"
    ),
    "tools": Bad(CHAT_PATH, chat(tools=[{"type": "function"}]), 400, param="tools[0]"),
    "tool_choice required": Bad(CHAT_PATH, chat(tool_choice="required"), 400, param="tool_choice"),
    "yaml response_format": Bad(CHAT_PATH, chat(response_format={"type": "yaml"}), 400, param="response_format.type"),
    "response_format schema that is not one": Bad(
        CHAT_PATH,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}),
        400,
        param="response_format",
    ),
    "top_logprobs without logprobs": Bad(CHAT_PATH, chat(top_logprobs=3), 400, param="top_logprobs"),
    "top_logprobs 21": Bad(CHAT_PATH, chat(logprobs=True, top_logprobs=21), 400, param="top_logprobs"),
    "top_logprobs negative": Bad(CHAT_PATH, chat(logprobs=True, top_logprobs=-1), 400, param="top_logprobs"),
    "completion logprobs 21": Bad(COMPLETIONS_PATH, completion(logprobs=21), 400, param="logprobs"),
    "completion logprobs negative": Bad(COMPLETIONS_PATH, completion(logprobs=-1), 400, param="logprobs"),
    "completion logprobs 10**30": Bad(COMPLETIONS_PATH, completion(logprobs=10**30), 400, param="logprobs"),
    "echo": Bad(COMPLETIONS_PATH, completion(echo=True), 400, "unsupported_parameter", "echo"),
    "suffix": Bad(COMPLETIONS_PATH, completion(suffix="end"), 400, "unsupported_parameter", "suffix"),
    "best_of 2": Bad(COMPLETIONS_PATH, completion(best_of=2), 400, param="best_of"),
    # the model
    "unknown model": Bad(CHAT_PATH, chat(model="gpt-4o"), 404, "model_not_found", "model"),
    "empty model": Bad(COMPLETIONS_PATH, completion(model=""), 404, "model_not_found", "model"),
    "model with a NUL": Bad(CHAT_PATH, chat(model=MODEL + "\x00"), 404, "model_not_found", "model"),
    "unknown model by path": Bad("/v1/models/gpt-4", None, 404, "model_not_found", method="GET"),
    # prompts of the completions endpoint
    "empty prompt": Bad(COMPLETIONS_PATH, completion(prompt=""), 400, param="prompt"),
    "empty prompt list": Bad(COMPLETIONS_PATH, completion(prompt=[]), 400, param="prompt"),
    "nested arrays in prompt": Bad(COMPLETIONS_PATH, completion(prompt=[[[1]]]), 400, param="prompt"),
    "batch of two prompts": Bad(COMPLETIONS_PATH, completion(prompt=["a", "b"]), 400, param="prompt"),
    "booleans as token ids": Bad(COMPLETIONS_PATH, completion(prompt=[True, False]), 400, param="prompt"),
    "floats as token ids": Bad(COMPLETIONS_PATH, completion(prompt=[1.5]), 400, param="prompt"),
    "token id = vocabulary size": Bad(COMPLETIONS_PATH, completion(prompt=[1, VOCAB]), 400, param="prompt"),
    "negative token id": Bad(COMPLETIONS_PATH, completion(prompt=[-1]), 400, param="prompt"),
    "token id 2**70": Bad(COMPLETIONS_PATH, completion(prompt=[2**70]), 400, param="prompt"),
    "token ids beyond the context": Bad(COMPLETIONS_PATH, completion(prompt=[5] * 600), 400, "context_length_exceeded"),
    # the admin API
    "admin: body not JSON": Bad("/admin/api/keys", b"name=x", 400),
    "admin: empty body": Bad("/admin/api/keys", b"", 400),
    "admin: invalid UTF-8 in the name": Bad("/admin/api/keys", b'{"name": "\xff"}', 400),
    "admin: unknown field": Bad("/admin/api/keys", b'{"name": "x", "colour": "red"}', 400),
    "admin: blank name": Bad("/admin/api/keys", b'{"name": " \\t "}', 400, param="name"),
    "admin: name is a list": Bad("/admin/api/keys", b'{"name": ["x"]}', 400, param="name"),
    "admin: negative quota": Bad("/admin/api/keys", b'{"name": "x", "quota_tokens": -1}', 400, param="quota_tokens"),
    "admin: unknown period": Bad("/admin/api/keys", b'{"name": "x", "quota_period": "year"}', 400),
    "admin: body over the size limit": Bad("/admin/api/keys", b" " * (BODY_LIMIT + 1), 413, "request_too_large"),
    "admin: key id not a number": Bad("/admin/api/keys/abc", None, 404, method="GET"),
    "admin: key id 2**63": Bad(f"/admin/api/keys/{2**63}", None, 404, method="GET"),
    "admin: quota 2**63": Bad("/admin/api/keys", json.dumps({"name": "x", "quota_tokens": 2**63}).encode(), 400),
    "admin: deeply nested name": Bad("/admin/api/keys", f'{{"name": {nested(DEEP)}}}'.encode(), 400),
    "admin: history limit 0": Bad("/admin/api/requests?limit=0", None, 400, method="GET"),
    "admin: history limit 501": Bad("/admin/api/requests?limit=501", None, 400, method="GET"),
    "admin: history offset -1": Bad("/admin/api/requests?offset=-1", None, 400, method="GET"),
    "admin: history unknown status": Bad("/admin/api/requests?status=lost", None, 400, param="status", method="GET"),
    "admin: history since not a time": Bad("/admin/api/requests?since=yesterday", None, 400, method="GET"),
    "admin: history since without zone": Bad(
        "/admin/api/requests?since=2026-01-01T00:00:00", None, 400, param="since", method="GET"
    ),
    "admin: history key_id 2**63": Bad(f"/admin/api/requests?key_id={2**63}", None, 400, method="GET"),
    "admin: history since year 1 east of UTC": Bad(
        "/admin/api/requests?since=0001-01-01T00:00:00%2B01:00", None, 400, method="GET"
    ),
    "admin: samples minutes 0": Bad("/admin/api/samples?minutes=0", None, 400, method="GET"),
}


def _rows(appliance: Appliance) -> list[sqlite3.Row]:
    appliance.flush_history()
    with closing(sqlite3.connect(appliance.db_path, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute("SELECT id, status, error FROM requests"))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_gets_a_clear_4xx(request: pytest.FixtureRequest, appliance: Appliance, case: Bad) -> None:
    before = {r["id"] for r in _rows(appliance)}
    headers = {**headers_for(case.path, appliance.keys["user"]), "Content-Type": "application/json"}
    response = appliance.http.request(case.method, case.path, content=case.body, headers=headers)
    figures(request, {TRIED: 1, SERVER_ERRORS: int(response.status_code >= 500)})
    error = assert_openai_error(response, case.status, case.code, case.param)
    assert response.headers["content-type"].startswith("application/json")
    if case.path.startswith("/v1/") and case.method == "POST":
        new = [r for r in _rows(appliance) if r["id"] not in before]
        assert [(r["status"], r["error"]) for r in new] == [("rejected", error["message"])]


EDGES = {
    "NUL characters in content": (CHAT_PATH, chat(messages=message(content="a\x00b\x00"))),
    "NUL characters in the user field": (CHAT_PATH, chat(user="u\x00ser")),
    "right-to-left override and emoji": (CHAT_PATH, chat(messages=message(content="\u202egnp.exe 🙂"))),
    "16 stop strings of 256 characters": (CHAT_PATH, chat(stop=["x" * 256] * 16)),
    "temperature 0 and top_p 1": (CHAT_PATH, chat(temperature=0, top_p=1)),
    "temperature 2 and top_k -1": (COMPLETIONS_PATH, completion(temperature=2, top_k=-1)),
    "max_tokens filling the context": (COMPLETIONS_PATH, completion(prompt=[5] * 500, max_tokens=12)),
    "max_tokens 5.0 (vLLM takes an integral float)": (CHAT_PATH, chat(max_tokens=5.0)),
    # Trimmed to what the context leaves (APPLIANCE_MAX_TOKENS_POLICY=trim, the default).
    "max_tokens beyond the context": (CHAT_PATH, chat(max_tokens=600)),
    "max_tokens 2**63-1": (CHAT_PATH, chat(max_tokens=2**63 - 1)),
    "max_tokens 10**30": (CHAT_PATH, chat(max_tokens=10**30)),
    "top_logprobs 20": (CHAT_PATH, chat(logprobs=True, top_logprobs=20)),
    "token id 0 and the last": (COMPLETIONS_PATH, completion(prompt=[0, VOCAB - 1])),
    "unknown fields are ignored": (CHAT_PATH, chat(frobnicate={"a": [1, 2]}, metadata={"x": "y"})),
    "null for every optional field": (CHAT_PATH, chat(max_tokens=None, temperature=None, stop=None, n=None, seed=None)),
}


@pytest.mark.parametrize(("path", "body"), EDGES.values(), ids=EDGES.keys())
def test_odd_but_valid_input_is_served(
    request: pytest.FixtureRequest, appliance: Appliance, path: str, body: bytes
) -> None:
    headers = {**headers_for(path, appliance.keys["user"]), "Content-Type": "application/json"}
    response = appliance.http.post(path, content=body, headers=headers)
    figures(request, {TRIED: 1, SERVER_ERRORS: int(response.status_code >= 500)})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_history_rows_stay_small_whatever_the_request_says(
    request: pytest.FixtureRequest, appliance: Appliance
) -> None:
    """Any key holder can send a megabyte of model name or user field; the row kept for 30 days should not be
    that megabyte (twice over: the refusal message repeats the model name)."""
    big = "m" * 1_000_000
    headers = headers_for(CHAT_PATH, appliance.keys["user"])
    long_model = appliance.http.post(CHAT_PATH, json={**CHAT, "model": big}, headers=headers)
    long_user = appliance.http.post(CHAT_PATH, json={**CHAT, "user": big}, headers=headers)
    answers = (long_model, long_user)
    figures(request, {TRIED: 2, SERVER_ERRORS: sum(int(r.status_code >= 500) for r in answers)})
    # Both are refused (B11's fix): a user field cut short would mis-attribute the request, and a model name longer
    # than any served one is bad input before it is an unknown model.
    assert_openai_error(long_model, 400, param="model")
    assert_openai_error(long_user, 400, param="user")
    assert all(len(r.content) < 1 << 10 for r in answers)  # the refusals do not repeat what they refuse
    appliance.flush_history()
    with closing(sqlite3.connect(appliance.db_path, timeout=10)) as conn:
        sizes = conn.execute(
            "SELECT length(model) + coalesce(length(user), 0) + coalesce(length(error), 0) FROM requests"
        ).fetchall()
    assert max(size for (size,) in sizes) < 64 << 10
