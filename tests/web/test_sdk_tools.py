"""Tool calls through the official `openai` SDK and langchain-openai against a real server on random:tiny: a
random model still calls the named or required function with arguments that validate, because the choice is
grammar-constrained; a tool-result turn is accepted. The bundled tokenizer's template has no tool support, so
these run through the fallback prompt and the Hermes parser."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel

from tests.web.server import Server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
UNITS = ["celsius", "fahrenheit"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Today's weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": UNITS}, "windy": {"type": "boolean"}},
            "required": ["unit", "windy"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    key = server.new_key(max_tokens_per_request=128)
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def assert_weather_arguments(arguments: str) -> None:
    value = json.loads(arguments)
    assert set(value) == {"unit", "windy"}, value
    assert value["unit"] in UNITS and isinstance(value["windy"], bool)


def test_named_choice_calls_it_with_valid_arguments(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice=NAMED, max_tokens=96, seed=1
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert_weather_arguments(call.function.arguments)


def test_named_choice_streamed_deltas_assemble_to_valid_json(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice=NAMED, max_tokens=96, seed=2, stream=True
    )
    pieces, reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            pieces.extend(choice.delta.tool_calls or [])
            reasons.append(choice.finish_reason)
    first, rest = pieces[0], pieces[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function is not None and first.function.name == "get_weather"
    assert all(p.index == 0 and p.id is None for p in rest)
    assert_weather_arguments("".join((p.function.arguments or "") for p in pieces if p.function))
    assert reasons[-1] == "tool_calls"


def test_required_choice_calls_one_of_the_tools(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        seed=3,
    )
    (call,) = done.choices[0].message.tool_calls or []
    assert done.choices[0].finish_reason == "tool_calls"
    if call.function.name == "get_weather":
        assert_weather_arguments(call.function.arguments)
    else:
        assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("utc", "local")


def test_tool_result_turn_is_accepted(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice=NAMED, max_tokens=96, seed=4
    )
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    turn = [
        *MESSAGES,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    after = client.chat.completions.create(model=MODEL, messages=turn, tools=[WEATHER], max_tokens=8)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert after.usage is not None and after.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


class GetWeather(BaseModel):
    """Today's weather in a city."""

    unit: Literal["celsius", "fahrenheit"]


def test_langchain_bind_tools_with_a_named_choice(server: Server) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key=server.new_key(),  # type: ignore[arg-type]
        max_retries=0,
        max_completion_tokens=64,
        seed=5,
    )
    reply = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What is the weather in Paris?")
    (call,) = reply.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "GetWeather" and call["args"]["unit"] in UNITS
