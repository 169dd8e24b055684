"""Ollama's API on the fake engine: NDJSON lines and whole answers in Ollama's shapes, options as the engine's
sampling, the history row's endpoint, the model routes, and every refusal as {"error": ...} with its status."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import MODEL, bearer, client_for, new_key, rows
from tests.web.fakes import FakeEngineClient
from tests.web.test_tools_routes import CALL, WEATHER, ScriptedFake

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def key(client: Any) -> str:
    return await new_key(client)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def assert_ollama_error(response: Any, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert response.headers.get("x-should-retry") == "false" or status >= 500 or status == 429
    for word in words:
        assert word in body["error"], body
    return str(body["error"])


async def test_chat_streams_ndjson_by_default(client: Any, key: str, db: sqlite3.Connection) -> None:
    response = await client.post("/api/chat", json={"model": MODEL, "messages": USER}, headers=bearer(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    parts = lines(response.text)
    assert all(not p["done"] for p in parts[:-1]) and parts[-1]["done"] is True
    text = "".join(p["message"]["content"] for p in parts)
    assert text and parts[-1]["done_reason"] in ("stop", "length")
    assert parts[-1]["prompt_eval_count"] > 0 and parts[-1]["eval_count"] == 5
    row = rows(db, "SELECT * FROM requests WHERE id = ?", response.headers["x-request-id"])[0]
    assert (row["endpoint"], row["status"], row["stream"]) == ("ollama.chat", "finished", 1)


async def test_chat_whole_and_generate_whole(client: Any, key: str) -> None:
    body = {"model": MODEL, "messages": USER, "stream": False}
    chat = (await client.post("/api/chat", json=body, headers=bearer(key))).json()
    assert chat["done"] is True and chat["message"]["role"] == "assistant" and chat["message"]["content"]
    body = {"model": MODEL + ":latest", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    generated = (await client.post("/api/generate", json=body, headers=bearer(key))).json()
    assert generated["done"] is True and generated["model"] == MODEL and generated["response"]


async def test_options_become_the_engine_sampling(client: Any, key: str, fake: FakeEngineClient) -> None:
    options = {"temperature": 0.2, "top_p": 0.5, "top_k": 7, "num_predict": 4, "stop": ["x"], "seed": 3}
    options |= {"repeat_penalty": 1.2, "num_ctx": 8192, "mirostat": 0}  # Ollama's runtime knobs are ignored
    body = {"model": MODEL, "messages": USER, "stream": False, "options": options, "keep_alive": -1}
    assert (await client.post("/api/chat", json=body, headers=bearer(key))).status_code == 200
    params = fake.requests[-1][2]
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.2, 0.5, 7, 4)
    assert (params.stop, params.seed, params.repetition_penalty) == (("x",), 3, 1.2)
    body = {"model": MODEL, "messages": USER, "stream": False, "keep_alive": "5m"}
    assert (await client.post("/api/chat", json=body, headers=bearer(key))).status_code == 200
    defaults = fake.requests[-1][2]
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.8, 0.9, 40)  # Ollama's own


async def test_format_is_the_grammar(client: Any, key: str, fake: FakeEngineClient) -> None:
    body = {"model": MODEL, "messages": USER, "stream": False, "format": "json"}
    assert (await client.post("/api/chat", json=body, headers=bearer(key))).status_code == 200
    assert fake.requests[-1][2].guided is not None and fake.requests[-1][2].guided.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body["format"] = schema
    assert (await client.post("/api/chat", json=body, headers=bearer(key))).status_code == 200
    guided = fake.requests[-1][2].guided
    assert guided is not None and json.loads(guided.schema) == schema


async def test_empty_requests_load_the_model(client: Any, key: str) -> None:
    chat = (await client.post("/api/chat", json={"model": MODEL, "messages": []}, headers=bearer(key))).json()
    assert (chat["done"], chat["done_reason"]) == (True, "load")
    generated = (await client.post("/api/generate", json={"model": MODEL}, headers=bearer(key))).json()
    assert (generated["done"], generated["done_reason"]) == (True, "load")


async def test_model_routes(client: Any, key: str) -> None:
    version = (await client.get("/api/version")).json()["version"]  # open, as Ollama's
    assert tuple(int(n) for n in version.split(".")) >= (0, 6, 4)  # GitHub Copilot's minimum
    tags = (await client.get("/api/tags", headers=bearer(key))).json()
    assert [m["name"] for m in tags["models"]] == [MODEL]
    shown = (await client.post("/api/show", json={"model": MODEL}, headers=bearer(key))).json()
    assert shown["capabilities"] == ["completion", "tools"]
    architecture = shown["model_info"]["general.architecture"]
    assert shown["model_info"][f"{architecture}.context_length"] == 512
    running = (await client.get("/api/ps", headers=bearer(key))).json()
    assert running["models"][0]["context_length"] == 512


async def test_refusals_in_ollama_shape(client: Any, key: str) -> None:
    assert_ollama_error(await client.get("/api/tags"), 401, "API key")
    assert_ollama_error(await client.post("/api/chat", json={"messages": USER}, headers=bearer(key)), 400, "model")
    body = {"model": "nope", "messages": USER}
    assert_ollama_error(await client.post("/api/chat", json=body, headers=bearer(key)), 404, "nope")
    body = {"model": MODEL, "messages": USER, "options": {"temperature": -1}}
    assert_ollama_error(await client.post("/api/chat", json=body, headers=bearer(key)), 400, "temperature")
    body = {"model": MODEL, "messages": USER, "think": True}
    assert_ollama_error(await client.post("/api/chat", json=body, headers=bearer(key)), 400, "think")
    body = {"model": MODEL, "messages": [{"role": "tool", "content": "42"}]}
    assert_ollama_error(await client.post("/api/chat", json=body, headers=bearer(key)), 400, "tool call")
    body = {"model": MODEL, "prompt": "hi", "images": ["aGk="]}
    assert_ollama_error(await client.post("/api/generate", json=body, headers=bearer(key)), 400, "images")
    assert_ollama_error(await client.post("/api/chat", content=b"{", headers=bearer(key)), 400, "JSON")
    assert_ollama_error(await client.post("/api/show", json={"model": "nope"}, headers=bearer(key)), 404, "nope")
    assert_ollama_error(await client.get("/api/nothing", headers=bearer(key)), 404)
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy"):
        assert_ollama_error(await client.post(path, json={"model": "x"}, headers=bearer(key)), 403, "operator")
    assert_ollama_error(await client.delete("/api/delete", headers=bearer(key)), 403, "operator")


async def test_embeddings_without_a_model_name_the_setting(client: Any, key: str) -> None:
    body = {"model": "all-MiniLM-L6-v2", "input": "hi"}
    assert_ollama_error(await client.post("/api/embed", json=body, headers=bearer(key)), 404, "APPLIANCE_EMBEDDING")
    response = await client.post("/v1/embeddings", json=body, headers=bearer(key))
    assert response.status_code == 404 and "APPLIANCE_EMBEDDING_MODEL" in response.json()["error"]["message"]


async def test_a_tool_call_in_ollama_shape(db_path: Path) -> None:
    """A call comes whole with its arguments as an object, streamed (in one line before the last) or not; the
    answer's turn and a tool result go back in as Ollama's clients send them (no ids)."""
    fake = ScriptedFake(max_model_len=4096)
    fake.script = CALL
    async with client_for(fake, db_path) as client:
        key = await new_key(client)
        body = {"model": MODEL, "messages": USER, "tools": [WEATHER], "stream": False}
        whole = (await client.post("/api/chat", json=body, headers=bearer(key))).json()
        streamed = lines((await client.post("/api/chat", json={**body, "stream": True}, headers=bearer(key))).text)
        call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}, "index": 0}}
        assert whole["message"] == {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
        assert "".join(p["message"]["content"] for p in streamed) == "Let me look."
        assert [p["message"]["tool_calls"] for p in streamed if "tool_calls" in p["message"]] == [[call]]
        assert streamed[-1]["done"] is True
        turn = [*USER, whole["message"], {"role": "tool", "content": '{"temp": 20}', "tool_name": "get_weather"}]
        again = {"model": MODEL, "messages": turn, "tools": [WEATHER], "stream": False}
        assert (await client.post("/api/chat", json=again, headers=bearer(key))).status_code == 200
        prompt = "".join(chr(t) for t in fake.requests[-1][1])  # the fake tokenizer: one token per character
        assert '{"temp": 20}' in prompt and "get_weather" in prompt
