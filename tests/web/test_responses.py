"""The Responses API on the fake engine: the response object and its stream's events as OpenAI shapes them, the
input items as the chat template gets them, a function call read out of the text, stored answers read, continued
and deleted by their own key only, and refusals in OpenAI's error shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import ADMIN, MODEL, assert_openai_error, bearer, client_for, new_key
from tests.web.test_anthropic import events
from tests.web.test_tools_routes import CALL, ScriptedFake, prompt_of

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}

BAD_SCHEMA = {"type": "json_schema", "name": "s", "schema": {"type": 1}}


@pytest.fixture
def fake() -> ScriptedFake:
    return ScriptedFake(max_model_len=4096)


@pytest.fixture
async def keeping(fake: ScriptedFake, db_path: Path) -> Any:
    """An app that stores text, hence responses."""
    async with client_for(fake, db_path, store_text=True) as client:
        yield client


async def create(client: Any, key: str, **body: Any) -> Any:
    return await client.post("/v1/responses", json={"model": MODEL, **body}, headers=bearer(key))


async def test_text_answer_with_usage_and_history(client: Any, fake: ScriptedFake) -> None:
    key = await new_key(client)
    fake.script = ["Hello", " there"]
    response = await create(client, key, input="hi", instructions="Be brief.", metadata={"a": "b"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "completed"
    assert message["content"] == [{"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}]
    usage = body["usage"]
    assert usage["output_tokens"] == 2 and usage["total_tokens"] == usage["input_tokens"] + 2
    assert body["metadata"] == {"a": "b"} and body["store"] is False  # this app keeps no text
    assert "Be brief." in prompt_of(fake)
    row = (await client.get(f"/admin/api/requests/{body['id']}", headers=ADMIN)).json()
    assert row["endpoint"] == "responses" and row["completion_tokens"] == 2


async def test_cut_by_max_output_tokens_is_incomplete(client: Any, fake: ScriptedFake) -> None:
    key = await new_key(client)
    fake.script = ["a", "b", "c", "d"]
    body = (await create(client, key, input="hi", max_output_tokens=2)).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["output"][0]["content"][0]["text"] == "ab"


async def test_items_reach_the_template_and_a_call_comes_back(client: Any, fake: ScriptedFake) -> None:
    key = await new_key(client)
    fake.script = CALL
    items = [
        {"role": "developer", "content": "You check weather."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]
    tools = [WEATHER, {"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": [{**WEATHER, "name": "f"}]}]
    response = await create(client, key, input=items, tools=tools)
    assert response.status_code == 200, response.text
    prompt = prompt_of(fake)
    assert "You check weather." in prompt and "Paris?" in prompt and "sunny" in prompt and '"f"' in prompt
    text, call = response.json()["output"]
    assert text["content"][0]["text"] == "Let me look."
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["id"].startswith("fc_")
    assert call["call_id"].startswith("call_") and json.loads(call["arguments"]) == {"city": "Paris"}


async def test_stream_events_in_order(client: Any, fake: ScriptedFake) -> None:
    key = await new_key(client)
    fake.script = CALL
    response = await create(client, key, input="Paris?", tools=[WEATHER], stream=True)
    assert response.status_code == 200, response.text
    seen = events(response.text)
    names = [name for name, _ in seen]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in seen] == list(range(len(seen)))
    assert names.index("response.output_text.delta") < names.index("response.output_text.done")
    assert names.count("response.output_item.added") == names.count("response.output_item.done") == 2
    delta = "".join(d["delta"] for n, d in seen if n == "response.function_call_arguments.delta")
    done = next(d for n, d in seen if n == "response.function_call_arguments.done")
    assert json.loads(delta) == {"city": "Paris"} and done["arguments"] == delta and done["name"] == "get_weather"
    final = seen[-1][1]["response"]
    assert final["usage"]["output_tokens"] == len(CALL) and [i["type"] for i in final["output"]] == [
        "message",
        "function_call",
    ]


async def test_stored_answer_is_read_continued_and_deleted_by_its_key_only(keeping: Any, fake: ScriptedFake) -> None:
    key, other = await new_key(keeping), await new_key(keeping, "other")
    fake.script = CALL
    first = (await create(keeping, key, input="Paris?", tools=[WEATHER])).json()
    assert first["store"] is True
    rid, call = first["id"], first["output"][1]
    fetched = await keeping.get(f"/v1/responses/{rid}", headers=bearer(key))
    assert fetched.status_code == 200 and fetched.json() == first
    for refused in (
        await keeping.get(f"/v1/responses/{rid}", headers=bearer(other)),
        await keeping.delete(f"/v1/responses/{rid}", headers=bearer(other)),
        await create(keeping, other, input="and?", previous_response_id=rid),
    ):
        assert refused.status_code in (400, 404) and rid in refused.json()["error"]["message"]
    fake.script = ["Sunny", "."]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "21 C"}
    second = await create(keeping, key, input=[result], previous_response_id=rid, tools=[WEATHER])
    assert second.status_code == 200, second.text
    prompt = prompt_of(fake)
    assert "Paris?" in prompt and "21 C" in prompt and '"city": "Paris"' in prompt
    assert second.json()["previous_response_id"] == rid
    deleted = await keeping.delete(f"/v1/responses/{rid}", headers=bearer(key))
    assert deleted.json() == {"id": rid, "object": "response.deleted", "deleted": True}
    assert_openai_error(await keeping.get(f"/v1/responses/{rid}", headers=bearer(key)), 404)


async def test_without_stored_text_previous_response_id_names_the_setting(client: Any) -> None:
    key = await new_key(client)
    response = await create(client, key, input="hi", previous_response_id="resp_x")
    error = assert_openai_error(response, 400, param="previous_response_id")
    assert "store_text" in error["message"]
    assert_openai_error(await client.get("/v1/responses/resp_x", headers=bearer(key)), 404)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0]"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"input": "x", "text": {"format": BAD_SCHEMA}}, "text.format.schema"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "temperature": 3}, "temperature"),
    ],
)  # fmt: skip
async def test_bad_input_is_a_400_naming_the_field(client: Any, body: dict[str, Any], param: str) -> None:
    key = await new_key(client)
    assert_openai_error(await create(client, key, **body), 400, param=param)
