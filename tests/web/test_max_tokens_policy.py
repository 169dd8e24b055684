"""A max_tokens that does not fit (above the key's cap, or above what the context leaves after the prompt) runs
with what fits by default, says so in x-max-tokens-trimmed-to and ends with length / max_tokens; the strict
policy (APPLIANCE_MAX_TOKENS_POLICY=refuse) keeps the 400 on both APIs, here through the official openai SDK too.
A prompt that alone leaves no room is a 400 under either."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.web.conftest import (
    ADMIN,
    MODEL,
    assert_openai_error,
    bearer,
    client_for,
    lifespan,
    new_key,
    wait_ready,
    web_config,
)
from tests.web.fakes import FakeEngineClient
from web.app import create_app

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
TRIMMED = "x-max-tokens-trimmed-to"
ROOM = 512 - 19  # the fake's context less the prompt "<user>hi<assistant>" (a token a character)


async def test_above_the_keys_cap_runs_with_the_cap(client: Any, fake: FakeEngineClient) -> None:
    key = await new_key(client, max_tokens_per_request=4)
    chat = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000}, headers=bearer(key))
    assert chat.status_code == 200, chat.text
    assert chat.headers[TRIMMED] == "4" and fake.requests[-1][2].max_tokens == 4
    assert chat.json()["choices"][0]["finish_reason"] == "length" and chat.json()["usage"]["completion_tokens"] == 4
    message = await client.post("/v1/messages", json={**MESSAGES, "max_tokens": 32000}, headers={"x-api-key": key})
    assert message.status_code == 200, message.text
    assert message.headers[TRIMMED] == "4" and message.json()["stop_reason"] == "max_tokens"
    huge = await client.post("/v1/messages", json={**MESSAGES, "max_tokens": 2**64 - 1}, headers={"x-api-key": key})
    assert huge.status_code == 200 and huge.headers[TRIMMED] == "4"  # its history row keeps what a row can hold


async def test_above_what_the_context_leaves_runs_with_the_room(client: Any, fake: FakeEngineClient) -> None:
    key = await new_key(client)
    streamed = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 32000, "stream": True}, headers=bearer(key)
    )
    assert streamed.status_code == 200 and streamed.headers[TRIMMED] == str(ROOM)
    assert fake.requests[-1][2].max_tokens == ROOM
    fits = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": ROOM}, headers=bearer(key))
    assert fits.status_code == 200 and TRIMMED not in fits.headers
    default = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert TRIMMED not in default.headers  # nothing asked, nothing trimmed: the server default applies


async def test_a_prompt_that_leaves_no_room_is_still_refused(client: Any) -> None:
    key = await new_key(client)
    long = {**CHAT, "messages": [{"role": "user", "content": "x" * 600}], "max_tokens": 5}
    assert_openai_error(
        await client.post("/v1/chat/completions", json=long, headers=bearer(key)),
        400,
        "context_length_exceeded",
        "messages",
    )


async def test_the_strict_policy_refuses_on_both_apis(fake: FakeEngineClient, db_path: Path) -> None:
    async with client_for(fake, db_path, trim_max_tokens=False) as client:
        key = await new_key(client, max_tokens_per_request=8)
        capped = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9}, headers=bearer(key))
        assert "limit of 8" in assert_openai_error(capped, 400, param="max_tokens")["message"]
        free = await new_key(client, name="free")
        beyond = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 600}, headers=bearer(free))
        assert_openai_error(beyond, 400, "context_length_exceeded", "max_tokens")
        message = await client.post("/v1/messages", json={**MESSAGES, "max_tokens": 600}, headers={"x-api-key": free})
        assert message.status_code == 400 and message.json()["error"]["type"] == "invalid_request_error"
        assert message.headers["x-should-retry"] == "false"
        document = (await client.get("/admin/api/openapi.json", headers=ADMIN)).json()
        schema = document["components"]["schemas"]["AnthropicMessagesRequest"]["properties"]["max_tokens"]
        assert schema["maximum"] == 511  # the strict document bounds it by the context; the trimming one does not


@pytest.fixture
async def strict_sdk(fake: FakeEngineClient, db_path: Path) -> AsyncIterator[tuple[openai.AsyncOpenAI, str]]:
    """The official openai SDK on the app in-process (the strict policy), through httpx's ASGI transport."""
    app = create_app(web_config(db_path, trim_max_tokens=False), fake)
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance", timeout=30) as http:
            await wait_ready(http)
            key = await new_key(http, max_tokens_per_request=8)
            yield openai.AsyncOpenAI(base_url="http://appliance/v1", api_key=key, http_client=http, max_retries=0), key


async def test_the_strict_policy_is_a_bad_request_to_the_openai_sdk(
    strict_sdk: tuple[openai.AsyncOpenAI, str],
) -> None:
    sdk, _ = strict_sdk
    with pytest.raises(openai.BadRequestError, match="limit of 8") as refused:
        await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=9)
    assert refused.value.param == "max_tokens"
    assert refused.value.response.headers["x-should-retry"] == "false"
