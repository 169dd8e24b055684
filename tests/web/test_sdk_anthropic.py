"""The official `anthropic` SDK against a real server on random:tiny: messages.create, messages.stream (its text
stream and final message), count_tokens, a forced tool whose tool_use input validates against the tool's schema
(grammar-constrained, so even a random model complies), the SDK's own exceptions for a bad key and a bad
body, and Claude Code's default session: system messages inside messages, thinking, output_config.format (JSON that
parses and validates, by hand and through the SDK's parse)."""

from __future__ import annotations

from typing import Any, Literal

import anthropic
import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from tests.web.conftest import ADMIN
from tests.web.server import Server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
MESSAGES: Any = [{"role": "user", "content": "Say hello."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "Today's weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "windy": {"type": "boolean"}},
        "required": ["unit", "windy"],
        "additionalProperties": False,
    },
}

IMAGE: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    key = server.new_key(max_tokens_per_request=64)
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def test_create_and_its_history_row(server: Server, client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=8, messages=MESSAGES, system="Be brief.")
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content
    assert message.content[0].type == "text"
    assert message.usage.output_tokens <= 8 and message.usage.input_tokens > 0
    assert message._request_id == message.id  # the SDK reads request-id: the history id
    response = httpx.get(f"{server.url}/admin/api/requests/{message.id}", headers=ADMIN)
    assert response.status_code == 200 and response.json()["endpoint"] == "messages"


def test_stream_and_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=8, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and 0 < final.usage.output_tokens <= 8
    assert final.usage.input_tokens > 0


def test_count_tokens_matches_the_usage(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=MESSAGES, system="Be brief.")
    message = client.messages.create(model=MODEL, max_tokens=1, messages=MESSAGES, system="Be brief.")
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_a_forced_tool_gives_a_valid_tool_use(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "tool_use"
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and set(call.input) == {"unit", "windy"}
    assert call.input["unit"] in ("celsius", "fahrenheit") and isinstance(call.input["windy"], bool)
    answered = client.messages.create(
        model=MODEL,
        max_tokens=4,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12 C, calm"}]},
        ],
    )
    assert answered.usage.input_tokens > 0


def test_a_streamed_forced_tool_assembles_valid_input(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        final = stream.get_final_message()  # the SDK joins the input_json_delta fragments
    assert final.stop_reason == "tool_use"
    (call,) = [b for b in final.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and set(call.input) == {"unit", "windy"}


def test_bad_key_and_bad_body_are_the_sdk_errors(server: Server, client: anthropic.Anthropic) -> None:
    stranger = anthropic.Anthropic(base_url=server.url, api_key="sk-not-a-key", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model=MODEL, max_tokens=4, messages=MESSAGES)
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [IMAGE]}])
    assert "text-only" in str(bad.value)


class Title(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["question", "greeting", "task"]
    urgent: bool


def test_claude_codes_session_system_messages_inside_messages_and_thinking(client: anthropic.Anthropic) -> None:
    """Claude Code's default session: system messages in the conversation, thinking and context_management."""
    message = client.messages.create(
        model=MODEL,
        max_tokens=32000,  # above the key's cap of 64: trimmed to it, not refused
        system="You are a coding assistant.",
        messages=[
            {"role": "system", "content": "The user prefers short answers."},  # type: ignore[list-item]
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Hello."},
            {"role": "system", "content": [{"type": "text", "text": "<system-reminder>be kind</system-reminder>"}]},  # type: ignore[list-item]
            {"role": "user", "content": "Again."},
        ],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
    )
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    assert 0 < message.usage.output_tokens <= 64
    alone = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Again."}])
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > alone.input_tokens + 20


def test_output_config_format_gives_json_that_matches_the_schema(client: anthropic.Anthropic) -> None:
    schema = Title.model_json_schema()
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Title this: how do I sort a list?"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    Title.model_validate_json(message.content[0].text)
    parsed = client.messages.parse(  # the SDK's own structured-output call: it sends output_config.format
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi there!"}], output_format=Title
    )
    assert isinstance(parsed.parsed_output, Title)
