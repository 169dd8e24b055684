"""Tool calls through /v1/chat/completions on the fake engine: tools reach the prompt, calls come back as
message.tool_calls and as OpenAI's tool-call deltas, forced choices constrain the output, tool turns are accepted,
and every bad tools input is a 400 in OpenAI's error shape with its history row kept."""

import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from engine import RequestOutput, SamplingParams, Tenant
from tests.web.conftest import MODEL, assert_openai_error, bearer, new_key, rows, sse_events
from tests.web.fakes import FakeEngineClient

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
CALL = ["Let me look.", " <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>"]


class ScriptedFake(FakeEngineClient):
    """The fake engine answering with `script`, one piece per token."""

    script: Sequence[str] = ()

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> AsyncIterator[RequestOutput]:
        self.completion_tokens = len(self.script)
        pieces = iter(self.script)
        async for out in super().generate(prompt, params, request_id, arrival_time, tenant):
            out.text = next(pieces)
            yield out


@pytest.fixture
def fake() -> ScriptedFake:
    return ScriptedFake(max_model_len=4096)


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


async def chat(client: Any, key: str, **changes: Any) -> Any:
    return await client.post("/v1/chat/completions", json={**CHAT, **changes}, headers=bearer(key))


def prompt_of(fake: FakeEngineClient) -> str:
    return "".join(chr(t) for t in fake.requests[-1][1])  # the fake tokenizer: one id per ASCII character


async def test_auto_call_in_the_body(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = CALL
    response = await chat(client, key)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look."
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    # The fake's template knows no tools: the fallback prompt lists them and asks for <tool_call> blocks.
    prompt = prompt_of(fake)
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    assert fake.requests[-1][2].guided is None


async def test_auto_call_streamed_as_deltas(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = CALL
    response = await chat(client, key, stream=True)
    chunks = [c for c in sse_events(response.text)[:-1] if c["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Let me look."  # no piece of the marker leaks
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(tc["function"].get("arguments", "") for tc in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_hostile_output_stays_content(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = ['<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', " and ", '<tool_call>{"name": ']
    response = await chat(client, key)
    (choice,) = response.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": "".join(fake.script).rstrip()}
    assert choice["finish_reason"] == "stop"


async def test_named_choice_is_constrained_to_the_parameters(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = ['{"city"', ': "Paris"}']
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = (await chat(client, key, tool_choice=named)).json()
    guided = fake.requests[-1][2].guided
    assert guided is not None and json.loads(guided.schema) == WEATHER["function"]["parameters"]  # type: ignore[index]
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert body["choices"][0]["message"]["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    chunks = sse_events((await chat(client, key, tool_choice=named, stream=True)).text)[:-1]
    pieces = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [p["function"]["arguments"] for p in pieces] == fake.script  # the arguments stream as they come
    assert "id" in pieces[0] and all("id" not in p and "name" not in p["function"] for p in pieces[1:])


async def test_required_choice_is_an_array_of_calls(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = [
        '[{"name": "get_weather", "arguments": {"city": "Oslo"}},',
        ' {"name": "get_weather", ',
        '"arguments": {"city": "Rome"}}]',
    ]
    body = (await chat(client, key, tool_choice="required")).json()
    schema = json.loads(fake.requests[-1][2].guided.schema)  # type: ignore[union-attr]
    assert schema["type"] == "array" and schema["items"]["properties"]["name"] == {"const": "get_weather"}
    calls = body["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Oslo", "Rome"]
    await chat(client, key, tool_choice="required", parallel_tool_calls=False)
    assert json.loads(fake.requests[-1][2].guided.schema)["type"] == "object"  # type: ignore[union-attr]


async def test_tool_choice_none_reads_no_calls(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = ['<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>']
    body = (await chat(client, key, tool_choice="none")).json()
    assert "tool_calls" not in body["choices"][0]["message"] and "get_weather" not in prompt_of(fake)


async def test_tool_result_turn_is_accepted(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = ["It is sunny."]
    messages = [
        CHAT["messages"][0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    response = await chat(client, key, messages=messages)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "It is sunny."
    prompt = prompt_of(fake)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


CALLED = {
    "role": "assistant",
    "tool_calls": [{"id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}}],
}


@pytest.mark.parametrize(
    ("changes", "code", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, None, "tool_choice"),
        ({"tools": [], "tool_choice": "required"}, None, "tool_choice"),
        ({"tools": [{**WEATHER, "function": {"name": "f", "parameters": {"type": "array"}}}]}, None,
         "tools[0].function.parameters"),
        ({"tools": [{**WEATHER, "function": {"name": "bad name!"}}]}, None, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, None, "tools[1].function.name"),
        ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"a": {"type": "no-such-type"}}}}}], "tool_choice": "required"}, None,
         "tools[1].function.parameters"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, None, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "unsupported_parameter", "functions"),
        ({"messages": [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, None,
         "messages[0].tool_call_id"),
        ({"messages": [CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "x"}]}, None,
         "messages[1].tool_call_id"),
        ({"messages": [{**CALLED, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}]},
         None, "messages[0].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": CALLED["tool_calls"]}]}, None,
         "messages[0].tool_calls"),
    ],
)  # fmt: skip
async def test_bad_tools_input_is_refused_and_recorded(
    client: Any, key: str, db: sqlite3.Connection, changes: dict[str, Any], code: str | None, param: str
) -> None:
    error = assert_openai_error(await chat(client, key, **changes), 400, code, param)
    assert error["type"] == "invalid_request_error"
    (row,) = rows(db, "SELECT status, error FROM requests")
    assert row["status"] == "rejected" and row["error"] == error["message"]


async def test_each_of_n_choices_reads_its_own_calls(client: Any, key: str, fake: ScriptedFake) -> None:
    fake.script = CALL
    body = (await chat(client, key, n=2)).json()
    assert [c["finish_reason"] for c in body["choices"]] == ["tool_calls", "tool_calls"]
    chunks = sse_events((await chat(client, key, n=2, stream=True)).text)[:-1]
    for index in (0, 1):
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
        assert json.loads("".join(tc["function"]["arguments"] for tc in calls)) == {"city": "Paris"}
        assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
