"""A vLLM on the LAN with no #tokenizer= in its entry (issue 34): the gateway renders and counts through vLLM's own
/tokenize (web/backends/remote_tokenizer.py). Against the session's real vLLM: the ids equal what the model's own
tokenizer gives, a chat right after /ready is served with vLLM's exact usage in the answer and the history,
streamed too, a wrong key or a model vLLM does not have says why in /ready, and an appliance serving the same model
beside vLLM fails over to it when SIGKILLed under load."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from appliance.doctor.backends import backends_finding
from appliance.settings import load_settings
from tests.backends.wrong_key import a_wrong_key_is_named
from tests.peers.vllm import VllmServer
from tests.web.conftest import ADMIN, METRICS_TOKEN
from tests.web.server import Server, serving, start_server
from web.backends.remote_tokenizer import RemoteTokenizer, TokenizerUnavailable, remote_tokenizer
from web.backends.scrape import Load, read_load
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
    a_wrong_key_is_named(tmp_path, entry(vllm_server, key="sk-wrong"))


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


@dataclass
class Outcome:
    request_id: str
    stream: bool
    status: int
    messages: list[dict[str, str]]
    usage: dict[str, int] | None  # what the client was told (the stream's last chunk, or the answer's)
    tokens: int  # content deltas a stream received
    finished: bool  # a finish_reason arrived
    error: dict[str, object] | None


async def _chat(http: httpx.AsyncClient, key: str, model: str, i: int, stream: bool, max_tokens: int) -> Outcome:
    messages = [MESSAGES[0], {"role": "user", "content": f"Name {i + 2} colours."}]
    body: dict[str, object] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        request_id = response.headers.get("x-request-id", "")
        if response.status_code != 200 or not stream:
            answer = json.loads(await response.aread())
            if response.status_code != 200:
                return Outcome(request_id, stream, response.status_code, messages, None, 0, False, answer["error"])
            finished = answer["choices"][0]["finish_reason"] is not None
            return Outcome(request_id, stream, 200, messages, answer["usage"], 0, finished, None)
        usage, tokens, finished, error = None, 0, False, None
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            error = event.get("error", error)
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                tokens += 1 if choice["delta"].get("content") else 0
                finished = finished or choice.get("finish_reason") is not None
        return Outcome(request_id, stream, 200, messages, usage, tokens, finished, error)


async def _chats(
    gateway: Server, key: str, model: str, n: int, max_tokens: int, during: Callable[[], Awaitable[None]] | None = None
) -> list[Outcome]:
    """n chats at once, every other one streamed; `during` (a coroutine function) runs while they do."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=180) as http:
        tasks = [asyncio.ensure_future(_chat(http, key, model, i, i % 2 == 0, max_tokens)) for i in range(n)]
        if during is not None:
            await during()
        return list(await asyncio.gather(*tasks))


def _load(server: Server) -> Load | None:
    """What an appliance's own /metrics says of its engine (running, waiting), read as the gateway reads a vLLM's."""
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text
    return read_load(text)


async def _vllm_counts(vllm_server: VllmServer, conversations: list[list[dict[str, str]]]) -> list[int]:
    async with httpx.AsyncClient() as http:
        tokenizer = await remote_tokenizer(Upstream(vllm_server.base_url, vllm_server.api_key, http), vllm_server.model)
        return [len(await tokenizer.render(messages, None, {})) for messages in conversations]


def test_an_appliance_beside_vllm_killed_under_load_fails_over_to_vllm(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vLLM and another appliance serve the same model (SmolLM2, under vLLM's served name), no #tokenizer= anywhere.
    The appliance is listed first, so the gateway renders every prompt with the tokenizer it publishes. It takes two
    requests at a time (the rest wait in its own queue, with no output yet) and is SIGKILLed under load: the
    requests waiting there are retried on vLLM, whose usage counts the very prompt its /tokenize gives; those
    streaming there end with the in-band error (a non-streamed one with a 503), charged what they streamed; nothing
    is left unsettled, and what follows goes to vLLM."""
    root = tmp_path_factory.mktemp("vllm-failover")
    same_model = {
        "model": str(vllm_server.model_dir),
        "served_model_name": vllm_server.model,
        "max_model_len": "2048",  # vLLM's: the gateway checks prompts against the first backend's context
        "max_num_seqs": "2",
        "kv_cache_bytes": str(128 << 20),
        "compact_weights": "false",  # its start packs no weights (20 s on two cores): speed is not what is tested
    }
    box2 = start_server(root / "box2", **same_model)
    try:
        # Its keys are made while its engine loads, and the gateway starts meanwhile.
        _wait_answering(box2)
        box2_name, vllm_name = box2.url.removeprefix("http://"), vllm_server.base_url.removeprefix("http://")
        box2_entry = f"http://:{box2.new_key('gateway')}@{box2_name}"
        with serving(root / "gateway", backends=f"{box2_entry},{entry(vllm_server)}") as gateway:
            box2.wait_ready()
            key = gateway.new_key("failover")
            deadline = time.monotonic() + 60
            while not all(s["models"] == [vllm_server.model] for s in _statuses(gateway)):
                assert time.monotonic() < deadline, _statuses(gateway)
                time.sleep(0.3)

            async def kill_while_it_streams_and_queues() -> None:
                deadline = time.monotonic() + 60
                while (load := await asyncio.to_thread(_load, box2)) is None or load.waiting < 2:
                    assert time.monotonic() < deadline, load
                    await asyncio.sleep(0.1)
                box2.process.send_signal(signal.SIGKILL)

            tokenized = _tokenize_calls(vllm_server)
            outcomes = asyncio.run(_chats(gateway, key, vllm_server.model, 14, 32, kill_while_it_streams_and_queues))
            box2.process.wait(10)
            # While the appliance was up, the prompts were its tokenizer's, vLLM's served ones and retried ones too.
            assert _tokenize_calls(vllm_server) == tokenized
            after = asyncio.run(_chats(gateway, key, vllm_server.model, 4, 4))
            assert _tokenize_calls(vllm_server) == tokenized + len(after)  # then vLLM's, the appliance being down
            rows = {r["id"]: r for r in gateway.history(limit=100)}
            retried = set(
                re.findall(rf"request (\S+): {re.escape(box2_name)} failed before any output, retried", gateway.log())
            )
    finally:
        box2.kill()

    counts = asyncio.run(_vllm_counts(vllm_server, [o.messages for o in outcomes]))
    for o, vllm_count in zip(outcomes, counts, strict=True):
        row = rows[o.request_id]
        if row["status"] == "finished":  # a complete answer, with the usage the history keeps
            assert o.status == 200 and o.finished and o.error is None and o.usage is not None, (o, row)
            usage = (o.usage["prompt_tokens"], o.usage["completion_tokens"])
            assert (row["prompt_tokens"], row["completion_tokens"]) == usage == (vllm_count, 32), (o, row)
            assert row["backend"] in (box2_name, vllm_name), row
        else:  # cut on the killed appliance after its first token (a retry comes only before one)
            assert row["status"] == "failed" and row["backend"] == box2_name and o.request_id not in retried, row
            assert o.error is not None and o.error["code"] == "engine_unavailable" and not o.finished, o
            # A stream ends with the in-band error, charged what it streamed; a non-streamed answer is a 503.
            assert o.status == (200 if o.stream else 503) and row["completion_tokens"] >= o.tokens, (o, row)
    # The requests waiting in the appliance's queue when it died: rendered with its tokenizer, served by vLLM,
    # whose usage (the prompt it counted) is its own /tokenize's count for those messages.
    assert retried and retried <= set(rows), (retried, gateway.log()[-3000:])
    assert all(rows[r]["backend"] == vllm_name and rows[r]["status"] == "finished" for r in retried)
    assert len(rows) == len(outcomes) + len(after)  # one row per request, each terminal (above)
    assert all(o.status == 200 and o.finished for o in after), after
    assert {rows[o.request_id]["backend"] for o in after} == {vllm_name}


def _wait_answering(server: Server, timeout: float = 60) -> None:
    """Until its web server answers (its engine may still be loading)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and server.process.poll() is None, server.log()[-3000:]
        time.sleep(0.2)


def _tokenize_calls(vllm_server: VllmServer) -> int:
    """The chats vLLM's /tokenize has rendered so far (its access log's lines)."""
    return vllm_server.log_path.read_text(errors="replace").count('"POST /tokenize HTTP/1.1" 200')


def _statuses(gateway: Server) -> list[dict[str, object]]:
    response = httpx.get(gateway.url + "/admin/api/backends", headers=ADMIN, timeout=30)
    response.raise_for_status()
    return list(response.json())
