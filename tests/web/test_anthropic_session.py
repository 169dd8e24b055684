"""What Claude Code's default session sends, on the fake engine: system messages inside `messages` (folded into the
leading system prompt when they come first; system turns where they stand, or folded where the chat template
refuses them: the bundled SmolLM2 template and one that refuses), output_config.format and the beta's
output_format through the grammar path, thinking and context_management taken and ignored."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine import EngineConfig
from engine.model.loader import random_model_dir
from tests.web.conftest import MODEL, new_key
from tests.web.fakes import FakeEngineClient

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
# A template that takes one system message, first (as Llama 2's and Mistral's older ones do): it refuses later ones.
FIRST_SYSTEM_ONLY = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Early note."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "system", "content": [{"type": "text", "text": "Late note."}]},
    {"role": "user", "content": "go on"},
]


@cache
def smollm2() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(random_model_dir("tiny", EngineConfig().model_cache_dir))


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


async def send(client: Any, key: str, **body: Any) -> Any:
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}], **body}
    return await client.post("/v1/messages", json=body, headers={"x-api-key": key})


def rendered(fake: FakeEngineClient) -> str:
    return str(fake.tokenizer.decode(fake.requests[-1][1]))


async def test_system_messages_inside_messages_through_the_bundled_template(
    client: Any, key: str, fake: FakeEngineClient
) -> None:
    fake.tokenizer = smollm2()
    response = await send(client, key, system="Be brief.", messages=CONVERSATION)
    assert response.status_code == 200, response.text
    assert rendered(fake) == (
        "<|im_start|>system\nBe brief.\n\nEarly note.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>system\nLate note.<|im_end|>\n"
        "<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_a_template_that_refuses_late_system_turns_gets_them_folded(
    client: Any, key: str, fake: FakeEngineClient
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir("tiny", EngineConfig().model_cache_dir))
    tokenizer.chat_template = FIRST_SYSTEM_ONLY
    fake.tokenizer = tokenizer
    response = await send(client, key, system="Be brief.", messages=CONVERSATION)
    assert response.status_code == 200, response.text
    assert rendered(fake) == (
        "<|im_start|>system\nBe brief.\n\nEarly note.\n\nLate note.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )
    counted = await client.post(
        "/v1/messages/count_tokens",
        json={"model": MODEL, "system": "Be brief.", "messages": CONVERSATION},
        headers={"x-api-key": key},
    )
    assert counted.json()["input_tokens"] == len(fake.requests[-1][1])  # count_tokens renders it the same way


async def test_a_system_message_cleared_at_the_next_user_message(client: Any, key: str, fake: FakeEngineClient) -> None:
    fake.tokenizer = smollm2()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Gone.", "clear_at": "next_user_message"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
        {"role": "system", "content": "Kept.", "clear_at": "next_user_message"},
    ]
    assert (await send(client, key, messages=messages)).status_code == 200
    text = rendered(fake)
    assert "Gone." not in text and text.endswith("<|im_start|>system\nKept.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("spelling", ["output_config", "output_format"])
async def test_output_format_is_the_grammar_of_json_schema(
    client: Any, key: str, fake: FakeEngineClient, spelling: str
) -> None:
    spec = {"type": "json_schema", "schema": SCHEMA}
    body = {"output_config": {"format": spec, "effort": "low"}} if spelling == "output_config" else {spelling: spec}
    response = await send(client, key, **body)
    assert response.status_code == 200, response.text
    guided = fake.requests[-1][2].guided
    assert guided is not None and guided.kind == "json_schema" and json.loads(guided.schema) == SCHEMA


async def test_both_spellings_at_once_and_a_schema_the_compiler_refuses(client: Any, key: str) -> None:
    spec = {"type": "json_schema", "schema": SCHEMA}
    both = await send(client, key, output_config={"format": spec}, output_format=spec)
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    bad = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}
    refused = await send(client, key, output_config={"format": bad})
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("output_config.format: ")


async def test_thinking_context_management_and_other_claude_code_fields_are_ignored(
    client: Any, key: str, fake: FakeEngineClient
) -> None:
    response = await send(
        client,
        key,
        thinking={"type": "enabled", "budget_tokens": 1024},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        metadata={"user_id": "user_" + "a" * 64 + "_account__session_" + "b" * 36},
        service_tier="auto",
        speed="standard",
    )
    assert response.status_code == 200, response.text
    assert fake.requests[-1][2].guided is None
