"""A vLLM on the LAN with no #tokenizer= in its entry (issue 34): the gateway renders and counts through vLLM's own
/tokenize (web/backends/remote_tokenizer.py). Against the session's real vLLM: the ids equal what the model's own
tokenizer gives, a chat right after /ready is served with vLLM's exact usage in the answer and the history,
streamed too, and a wrong key or a model vLLM does not have says why in /ready."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from appliance.doctor.backends import backends_finding
from appliance.settings import load_settings
from tests.peers.vllm import VllmServer
from tests.web.conftest import ADMIN
from tests.web.server import Server, serving, start_server
from web.backends.remote_tokenizer import RemoteTokenizer, TokenizerUnavailable, remote_tokenizer
from web.backends.upstream import Upstream

pytestmark = pytest.mark.slow
MESSAGES = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Name three colours."},
]


def entry(vllm_server: VllmServer, key: str | None = None) -> str:
    return f"http://:{key or vllm_server.api_key}@{vllm_server.base_url.removeprefix('http://')}"


async def _probe(vllm_server: VllmServer, model: str) -> RemoteTokenizer:
    async with httpx.AsyncClient() as http:
        return await remote_tokenizer(Upstream(vllm_server.base_url, vllm_server.api_key, http), model)


def test_vllms_tokenize_gives_the_models_own_ids(vllm_server: VllmServer) -> None:
    from transformers import AutoTokenizer

    local = AutoTokenizer.from_pretrained(vllm_server.model_dir)

    with pytest.raises(TokenizerUnavailable, match="404"):  # a model vLLM does not serve
        asyncio.run(_probe(vllm_server, "no-such-model"))

    async def served() -> tuple[RemoteTokenizer, list[int], list[int]]:
        async with httpx.AsyncClient() as http:
            upstream = Upstream(vllm_server.base_url, vllm_server.api_key, http)
            tokenizer = await remote_tokenizer(upstream, vllm_server.model)
            return tokenizer, await tokenizer.render(MESSAGES, None, {}), await tokenizer.encode("Hello, world")

    tokenizer, chat, text = asyncio.run(served())
    assert chat == list(
        local.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert text == local.encode("Hello, world")
    # SmolLM2's template renders no tools: the gateway's fallback prompt (Hermes blocks) is used, as with a copy.
    assert tokenizer.renders_tools is False and tokenizer.model_max_length == 2048


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """vLLM alone behind the gateway, no embedded engine and no tokenizer: serving() returns at the first 200 of
    /ready, and the tests chat at once."""
    with serving(tmp_path_factory.mktemp("vllm-remote-tok"), backends=entry(vllm_server)) as server:
        yield server


@pytest.fixture(scope="module")
def direct(vllm_server: VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_server.base_url + "/v1", api_key=vllm_server.api_key, max_retries=0, timeout=120)


def test_a_chat_right_after_ready_has_vllms_exact_usage(
    gateway: Server, direct: openai.OpenAI, vllm_server: VllmServer
) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key("rt"), max_retries=0, timeout=120)
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
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        theirs.usage.prompt_tokens,
        ours.usage.completion_tokens,
    )


def test_a_stream_counts_the_prompt_as_vllm_does(
    gateway: Server, direct: openai.OpenAI, vllm_server: VllmServer
) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key("rt-s"), max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=vllm_server.model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    theirs = direct.chat.completions.create(
        model=vllm_server.model,
        messages=MESSAGES,
        max_tokens=12,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (theirs.usage.prompt_tokens, 12)
    row = gateway.request_row(chunks[0].id)
    assert (row["prompt_tokens"], row["completion_tokens"], row["status"]) == (usage.prompt_tokens, 12, "finished")


def test_forced_tool_calls_and_raw_prompts_go_through_vllms_tokenizer(gateway: Server, vllm_server: VllmServer) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key("rt-t"), max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    tool = {"type": "function", "function": {"name": "paint", "parameters": schema}}
    called = client.chat.completions.create(
        model=vllm_server.model, messages=MESSAGES, max_tokens=48, tools=[tool], tool_choice="required"
    )
    calls = called.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == "paint" and "colour" in json.loads(calls[0].function.arguments)
    # A raw prompt is tokenized by vLLM too: its count is vLLM's own for the same text.
    text = client.completions.create(model=vllm_server.model, prompt="Hello, world", max_tokens=2)
    assert text.usage is not None and text.usage.prompt_tokens == len(asyncio.run(_encode(vllm_server)))


async def _encode(vllm_server: VllmServer) -> list[int]:
    async with httpx.AsyncClient() as http:
        tokenizer = await remote_tokenizer(Upstream(vllm_server.base_url, vllm_server.api_key, http), vllm_server.model)
        return await tokenizer.encode("Hello, world")


def test_the_doctor_and_ready_say_how_or_why_not(vllm_server: VllmServer, tmp_path: Path) -> None:
    """The doctor names vLLM's /tokenize as the way its models are served; with a wrong key, /ready (nothing else can
    serve), the console's backends panel and the doctor each say 401."""
    settings = {"APPLIANCE_DATA_DIR": str(tmp_path)}
    found = backends_finding(load_settings({**settings, "APPLIANCE_BACKENDS": entry(vllm_server)}))
    assert found.level == "ok" and "its /tokenize renders their prompts" in found.message, found
    wrong = entry(vllm_server, key="sk-wrong")
    found = backends_finding(load_settings({**settings, "APPLIANCE_BACKENDS": wrong}))
    assert found.level == "fail" and "answered 401 (a wrong key in its entry?)" in found.message, found
    server = start_server(tmp_path / "wrong", backends=wrong)
    try:
        deadline = time.monotonic() + 120
        while "first probe" in (why := _ready(server)) or why == "":
            assert time.monotonic() < deadline, why
            time.sleep(0.3)
        assert "its model list answered 401 (a wrong key in its entry?)" in why, why
        [status] = httpx.get(server.url + "/admin/api/backends", headers=ADMIN).json()
        assert status["models"] == [] and status["reason"] == "its model list answered 401 (a wrong key in its entry?)"
    finally:
        server.kill()


def _ready(server: Server) -> str:
    """/ready's refusal ("" while the server does not answer yet); a 200 is a failure here."""
    try:
        r = httpx.get(server.url + "/ready", timeout=2)
    except httpx.HTTPError:
        return ""
    assert r.status_code == 503, r.text
    message: str = r.json()["error"]["message"]
    return message


def test_vllm_and_another_appliance_with_no_tokenizer_anywhere(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The issue's first configuration: a vLLM and another appliance, keys only. At the first 200 of /ready both
    models are listed and each serves a chat, with its own backend's usage in the history."""
    root = tmp_path_factory.mktemp("vllm-and-appliance")
    with serving(root / "box2") as box2:
        box2_entry = f"http://:{box2.new_key('gateway')}@{box2.url.removeprefix('http://')}"
        with serving(root / "gateway", backends=f"{entry(vllm_server)},{box2_entry}") as gateway:
            key = gateway.new_key("both")
            listed = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
            assert [m["id"] for m in listed["data"]] == [vllm_server.model, "random:tiny"]
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=120)
            for model, backend in [(vllm_server.model, vllm_server.base_url), ("random:tiny", box2.url)]:
                answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
                assert answer.usage is not None
                row = gateway.request_row(answer.id)
                assert row["backend"] == backend.removeprefix("http://") and row["status"] == "finished", row
                assert (row["prompt_tokens"], row["completion_tokens"]) == (
                    answer.usage.prompt_tokens,
                    answer.usage.completion_tokens,
                )
