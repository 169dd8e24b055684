"""The Responses API through the official `openai` SDK against a real server on random:tiny that stores text:
responses.create streamed and not, responses.stream, a function tool round trip (the named choice is grammar-
constrained, so even a random model calls it with arguments that validate), text.format json_schema parsed, a
previous_response_id continuation, retrieve and delete, and another key refused."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from tests.web.server import Server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
UNITS = ["celsius", "fahrenheit"]
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Today's weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": UNITS}},
        "required": ["unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Rome", "Lyon"]
    capital: bool


@pytest.fixture(scope="module")
def keeping(keeping_server: Server) -> Server:
    """The shared server that stores text: the first one stores none, so it keeps no responses."""
    return keeping_server


def sdk(server: Server) -> openai.OpenAI:
    key = server.new_key(max_tokens_per_request=128)
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(keeping: Server) -> openai.OpenAI:
    return sdk(keeping)


def test_create_and_its_history_row(client: openai.OpenAI, keeping: Server) -> None:
    response = client.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=6)
    assert response.id.startswith("resp_") and response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text and response.usage is not None and response.usage.output_tokens == 6
    row = keeping.request_row(response.id)
    assert row["endpoint"] == "responses" and row["completion_tokens"] == 6 and row["status"] == "finished"


def test_streamed_events_assemble_to_the_final_response(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Count.", max_output_tokens=8, stream=True)
    kinds, text = [], ""
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        last = event
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done"} <= set(kinds)
    final = last.response  # type: ignore[union-attr]
    assert final.output_text == text and final.usage is not None and final.usage.output_tokens == 8


def test_responses_stream_helper_with_a_json_schema(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Which city?", text_format=Place, max_output_tokens=64) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and isinstance(final.output_parsed, Place)
    assert "".join(deltas) == final.output_text


def test_text_format_json_schema_by_hand(client: openai.OpenAI) -> None:
    text: Any = {
        "format": {"type": "json_schema", "name": "place", "schema": Place.model_json_schema(), "strict": True}
    }
    response = client.responses.create(model=MODEL, input="Which city?", text=text, max_output_tokens=64)
    assert response.status == "completed"
    Place.model_validate_json(response.output_text)


def test_function_call_round_trip_through_previous_response_id(client: openai.OpenAI) -> None:
    ask = "What is the weather in Paris?"
    named: Any = {"type": "function", "name": "get_weather"}
    first = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=64)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["unit"] in UNITS
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}
    after = client.responses.create(
        model=MODEL, input=[result], previous_response_id=first.id, tools=[WEATHER], max_output_tokens=8
    )
    assert after.status in ("completed", "incomplete") and after.previous_response_id == first.id
    assert after.usage is not None and first.usage is not None
    assert after.usage.input_tokens > first.usage.input_tokens  # the first turn and its call came along


def test_the_whole_conversation_as_items_without_storing(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "name": "get_weather"}
    ask: Any = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]}]
    first = client.responses.create(
        model=MODEL, input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=64, store=False
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    turn: Any = [*ask, call.model_dump(), {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    after = client.responses.create(model=MODEL, input=turn, tools=[WEATHER], max_output_tokens=8, store=False)
    assert after.status in ("completed", "incomplete") and after.output
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)  # store=False: nothing kept


def test_retrieve_and_delete_by_its_key_only(client: openai.OpenAI, keeping: Server) -> None:
    response = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4, metadata={"topic": "greeting"})
    again = client.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == response.output_text
    assert again.metadata == {"topic": "greeting"}
    stranger = sdk(keeping)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        stranger.responses.create(model=MODEL, input="and?", previous_response_id=response.id, max_output_tokens=4)
    assert refused.value.code == "previous_response_not_found"
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_a_server_without_stored_text_refuses_previous_response_id(server: Server) -> None:
    client = sdk(server)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="and?", previous_response_id="resp_1", max_output_tokens=4)
    assert refused.value.param == "previous_response_id" and "store_text" in refused.value.message
