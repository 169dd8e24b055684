"""Issue 13's OpenAI surface as the clients people point at a LAN server use it, against a real server on
random:tiny: the official `openai` SDK's structured output (parse with a pydantic model, json_schema by hand,
json_object), n=2 with penalties, x-request-id and cached_tokens, an empty quota not retried; and LangChain's
with_structured_output. A random model says nothing sensible, so the schemas bound every value (enums, booleans):
under the constraint the output must still parse and validate, whatever the model would have said."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict

from tests.web.server import Server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
ASK = [{"role": "user", "content": "Which city, and is it a capital?"}]


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Rome", "Lyon"]
    capital: bool


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    key = server.new_key(max_tokens_per_request=128)
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Place, max_tokens=64)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Place)


def test_json_schema_and_json_object_by_hand(client: openai.OpenAI) -> None:
    schema = Place.model_json_schema()
    spec = {"name": "place", "schema": schema, "strict": True}
    chat = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=64, response_format={"type": "json_schema", "json_schema": spec}
    )
    assert chat.choices[0].finish_reason == "stop"
    Place.model_validate_json(chat.choices[0].message.content or "")
    anything = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=128, temperature=0, response_format={"type": "json_object"}
    )
    if anything.choices[0].finish_reason == "stop":  # a random model may well fill 128 tokens with one object
        assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)
    else:
        assert (anything.choices[0].message.content or "").lstrip().startswith("{")


def test_bad_schema_is_a_400_naming_response_format(client: openai.OpenAI) -> None:
    spec = {"name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=ASK, response_format={"type": "json_schema", "json_schema": spec}
        )
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]


def test_two_choices_with_penalties(client: openai.OpenAI, server: Server) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, n=2, max_tokens=8, seed=5, presence_penalty=1.0, frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.2, "min_p": 0.05},  # vLLM's knobs, which the SDK does not name
    )  # fmt: skip
    chat = raw.parse()
    assert [c.index for c in chat.choices] == [0, 1] and all(c.message.content for c in chat.choices)
    assert chat.choices[0].message.content != chat.choices[1].message.content  # seeds 5 and 6
    assert chat.usage is not None and 2 <= chat.usage.completion_tokens <= 16
    assert chat.system_fingerprint and chat.system_fingerprint.startswith("fp_")
    row = server.request_row(raw.headers["x-request-id"])
    assert row["id"] == chat.id and row["completion_tokens"] == chat.usage.completion_tokens
    assert row["prompt_tokens"] == chat.usage.prompt_tokens


def test_cached_tokens_on_a_repeated_prompt(client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "Tell me about the old harbour and its boats. " * 12}]
    first = client.chat.completions.create(model=MODEL, messages=long, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=long, max_tokens=2, temperature=0)
    assert first.usage is not None and again.usage is not None
    assert first.usage.prompt_tokens_details is not None and again.usage.prompt_tokens_details is not None
    # The chat template's opening is in the cache from the earlier tests; the repeat finds the whole prompt but
    # its last block (the last token is always computed).
    cold, warm = first.usage.prompt_tokens_details.cached_tokens or 0, again.usage.prompt_tokens_details.cached_tokens
    assert cold < 32 and again.usage.prompt_tokens - 32 < (warm or 0) < again.usage.prompt_tokens
    fresh = client.completions.create(model=MODEL, prompt="Seven quiet otters count pebbles.", max_tokens=1)
    assert fresh.usage is not None and fresh.usage.prompt_tokens_details is not None
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0  # nothing cached: 0, not missing
    stream = client.chat.completions.create(
        model=MODEL, messages=long, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert usage and usage[-1].prompt_tokens_details is not None and usage[-1].prompt_tokens_details.cached_tokens


def test_an_empty_quota_is_not_retried(server: Server) -> None:
    key, key_id = server.new_key_and_id("poor", quota_tokens=5)
    poor = openai.OpenAI(base_url=server.url + "/v1", api_key=key, timeout=30)
    assert poor.max_retries == 2  # the SDK's default: it would retry a plain 429 twice
    with pytest.raises(openai.RateLimitError) as refused:
        poor.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
    assert refused.value.code == "insufficient_quota"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert len(server.history(key_id=key_id)) == 1  # one request reached the server


def test_langchain_with_structured_output(server: Server) -> None:
    llm = ChatOpenAI(
        model=MODEL, base_url=server.url + "/v1", api_key=server.new_key("langchain"), max_retries=0, max_tokens=64
    )
    place = llm.with_structured_output(Place).invoke("Which city, and is it a capital?")
    assert isinstance(place, Place)


def test_a_max_tokens_above_the_cap_runs_trimmed(server: Server) -> None:
    """Open WebUI's title request asks max_tokens 1000 of a key capped lower: it runs with the cap and says so."""
    key = server.new_key(max_tokens_per_request=8)
    capped = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)
    raw = capped.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=1000, extra_body={"ignore_eos": True}
    )
    completion = raw.parse()
    assert raw.headers["x-max-tokens-trimmed-to"] == "8"
    assert completion.choices[0].finish_reason == "length" and completion.usage is not None
    assert completion.usage.completion_tokens == 8
    assert server.request_row(completion.id)["max_tokens_requested"] == 1000
