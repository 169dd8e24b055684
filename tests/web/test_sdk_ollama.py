"""Ollama's official Python client, replays of Home Assistant's and GitHub Copilot's request sequences, and the
openai SDK's embeddings, against a real server on random:tiny with the bundled embedding model
(APPLIANCE_EMBEDDING_MODEL=default: a process of its own, so this module starts its own server)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.web.conftest import ADMIN
from tests.web.server import Server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
EMBEDDER = "all-MiniLM-L6-v2"
TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors."]
LIGHTS = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "description": "Turns on a device or entity",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


@pytest.fixture(scope="module")
def server(keeping_server: Server) -> Server:
    """The shared server with the embedding model, once the model has loaded beside the chat model."""
    deadline = time.monotonic() + 120
    while not any(m["id"] == EMBEDDER for m in _models(keeping_server)):
        assert time.monotonic() < deadline, "the embedding model did not load"
        time.sleep(1)
    return keeping_server


def _models(srv: Server) -> list[dict[str, Any]]:
    key = srv.new_key("models")
    return list(httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def key(server: Server) -> str:
    return server.new_key("ollama", max_tokens_per_request=64)


@pytest.fixture(scope="module")
def client(server: Server, key: str) -> ollama.Client:
    return ollama.Client(host=server.url, headers=bearer(key), timeout=120)


def test_models_the_client_lists_shows_and_sees_running(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert names == [MODEL, EMBEDDER]
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion", "tools"]
    info = shown.modelinfo or {}
    assert info[f"{info['general.architecture']}.context_length"] > 0
    assert client.show(EMBEDDER).capabilities == ["embedding"]
    running = client.ps().models
    assert [m.model for m in running] == [MODEL, EMBEDDER] and all(m.context_length for m in running)


def test_chat_generate_and_embed(server: Server, client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 8}
    whole = client.chat(MODEL, messages=[{"role": "user", "content": "hi"}], options=options)
    assert whole.done and whole.message.role == "assistant" and whole.eval_count and whole.eval_count <= 8
    parts = list(client.chat(MODEL, messages=[{"role": "user", "content": "hi"}], options=options, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content  # greedy: the same answer
    generated = client.generate(MODEL, "Once upon a time", options=options)
    assert generated.done and generated.response and generated.prompt_eval_count
    embedded = client.embed(EMBEDDER, TEXTS)
    assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) == 384
    assert embedded.prompt_eval_count and embedded.prompt_eval_count > 0
    legacy = client.embeddings(EMBEDDER + ":latest", TEXTS[0])
    assert np.allclose(legacy.embedding, embedded.embeddings[0], atol=1e-6)
    endpoints = {row["endpoint"] for row in server.history(limit=20)}
    assert {"ollama.chat", "ollama.generate", "ollama.embed"} <= endpoints


def test_chat_with_tools_and_refusals_the_client_raises(server: Server, client: ollama.Client) -> None:
    answer = client.chat(MODEL, messages=[{"role": "user", "content": "lights on"}], tools=[LIGHTS])
    assert answer.done and answer.message.role == "assistant"
    for call in answer.message.tool_calls or ():  # a random model may call: then as Ollama's clients read it
        assert call.function.name == "HassTurnOn" and isinstance(call.function.arguments, dict)
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server.url).list()
    assert refused.value.status_code == 401 and "API key" in refused.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat("no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "no-such-model" in missing.value.error
    with pytest.raises(ollama.ResponseError) as pulled:
        client.pull(MODEL)
    assert pulled.value.status_code == 403 and "operator" in pulled.value.error


def test_home_assistant_sequence(server: Server, key: str) -> None:
    """Home Assistant's Ollama integration (home-assistant/core, homeassistant/components/ollama/):
    config_flow.py lists the models (client.list) and takes one that is there; coordinator.py polls list() and
    ps() every 30 s (a 401 is its reauth); entity.py's _async_handle_chat_log streams client.chat with tools,
    keep_alive (-1, or "<n>s"), options={"num_ctx": ...}, think and format None, then sends the tool results back
    as role "tool" messages without ids."""

    async def run() -> None:
        client = ollama.AsyncClient(host=server.url, headers=bearer(key))
        listed = await client.list()
        assert MODEL in {m["model"] for m in listed.get("models", [])}  # config_flow.py's downloaded_models
        installed, loaded = await asyncio.gather(client.list(), client.ps())
        assert installed.models and loaded.models
        history: list[Any] = [
            {"role": "system", "content": "You are a voice assistant for Home Assistant."},
            {"role": "user", "content": "Turn on the kitchen light"},
        ]
        for keep_alive in (-1, "300s"):
            stream = await client.chat(
                model=MODEL,
                messages=list(history),
                tools=[LIGHTS],
                stream=True,
                keep_alive=keep_alive,
                options={"num_ctx": 8192, "num_predict": 16},
                think=None,
                format=None,
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1]["done"] and chunks[-1]["message"]["role"] == "assistant"
        call = ollama.Message.ToolCall(
            function=ollama.Message.ToolCall.Function(name="HassTurnOn", arguments={"name": "kitchen light"})
        )
        history += [
            ollama.Message(role="assistant", content="", tool_calls=[call]),
            ollama.Message(role="tool", content='{"data": {"success": true}, "error": null}'),
        ]
        stream = await client.chat(model=MODEL, messages=history, tools=[LIGHTS], stream=True, keep_alive=-1)
        assert [chunk async for chunk in stream][-1]["done"]

    asyncio.run(run())


def test_copilot_byok_probe(server: Server, key: str) -> None:
    """GitHub Copilot's BYOK Ollama provider (microsoft/vscode-copilot-chat,
    src/extension/byok/vscode-node/ollamaProvider.ts): GET /api/version (at least 0.6.4), GET /api/tags, then
    POST /api/show per model, reading capabilities ("tools", "vision") and model_info's
    "<general.architecture>.context_length". It sends no key of its own: the probe runs with one here;
    tests/web/test_keyless.py replays it keyless, as the README sets Copilot up."""
    with httpx.Client(base_url=server.url, headers=bearer(key), timeout=30) as http:
        version = http.get("/api/version").json()["version"]
        assert [int(n) for n in version.split(".")] >= [0, 6, 4]
        for model in http.get("/api/tags").json()["models"]:
            shown = http.post("/api/show", json={"model": model["model"]}).json()
            info = shown["model_info"]
            context = info[f"{info['general.architecture']}.context_length"]
            assert info["general.basename"] == model["model"] and context > 0
            assert ("tools" in shown["capabilities"]) == (model["model"] == MODEL)
            assert "vision" not in shown["capabilities"]


def test_openai_embeddings(server: Server) -> None:
    from sentence_transformers import SentenceTransformer

    from engine.embed.layout import default_embedding_model_path

    key, key_id = server.new_key_and_id("embeddings")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
    one = client.embeddings.create(model=EMBEDDER, input=TEXTS[0])  # the SDK asks for base64, and decodes it
    batch = client.embeddings.create(model=EMBEDDER, input=[*TEXTS, TEXTS[0]], encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2] and len(one.data[0].embedding) == 384
    assert batch.data[0].embedding == batch.data[2].embedding  # identical inputs, identical vectors
    assert np.allclose(one.data[0].embedding, batch.data[0].embedding, atol=1e-6)
    reference = SentenceTransformer(str(default_embedding_model_path()), device="cpu").encode(TEXTS)
    assert np.abs(np.array([d.embedding for d in batch.data[:2]]) - reference).max() < 1e-5
    ids = client.embeddings.create(model=EMBEDDER, input=[[1996, 4937, 2938]], encoding_format="float")
    assert ids.usage.prompt_tokens == 3 and len(ids.data) == 1
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > one.usage.prompt_tokens > 0
    for bad, word in (({"input": [""]}, "input"), ({"dimensions": 64}, "dimensions"), ({"model": MODEL}, MODEL)):
        arguments: Any = {"model": EMBEDDER, "input": "hi", **bad}
        error = openai.NotFoundError if "model" in bad else openai.BadRequestError
        with pytest.raises(error, match=word):
            client.embeddings.create(**arguments)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model=EMBEDDER, input="word " * 1000)  # longer than the model takes
    rows = server.history(key_id=key_id)
    assert {r["endpoint"] for r in rows} == {"embeddings"}
    finished = [r for r in rows if r["status"] == "finished"]
    usage = httpx.get(f"{server.url}/admin/api/keys/{key_id}", headers=ADMIN).json()["usage"]
    assert usage["used_tokens"] == sum(r["prompt_tokens"] for r in finished) > 0 and usage["reserved_tokens"] == 0
