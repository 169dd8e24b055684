"""Tokenizers without a copy: what an appliance publishes of its model directory, and what a gateway accepts of
what a backend sends (untrusted: names, sizes, shapes), without starting servers (test_routing.py does)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.web.server import SHARED_MODEL_CACHE
from web.backends.fetched import MAX_PUBLISHED_BYTES, PUBLISHED, FetchedTokenizers
from web.backends.publish import read_published
from web.backends.upstream import MAX_TOKENIZER_BYTES, Upstream
from web.errors import NotFound


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}')
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    return tmp_path


def test_only_the_tokenizer_and_template_are_published(tmp_path: Path) -> None:
    files = read_published(model_dir(tmp_path))
    assert set(files) == {"tokenizer.json", "chat_template.jinja"} and set(files) <= set(PUBLISHED)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(NotFound, match=r"no tokenizer\.json"):
        read_published(tmp_path)


def test_published_files_load_into_the_same_tokenizer() -> None:
    from transformers import AutoTokenizer

    directory = SHARED_MODEL_CACHE / "random-tiny"
    if not (directory / "tokenizer.json").is_file():
        pytest.skip("random:tiny has not been written to the shared model cache in this run")
    fetched = FetchedTokenizers().load("box2:8000", "random:tiny", read_published(directory))
    local = AutoTokenizer.from_pretrained(directory)
    chat = [{"role": "user", "content": "Name three rivers."}]
    assert fetched.apply_chat_template(chat, tokenize=False) == local.apply_chat_template(chat, tokenize=False)
    assert fetched.encode("Hello, world") == local.encode("Hello, world")


@pytest.mark.parametrize(
    "files",
    [
        {"tokenizer.json": "{}", "../../etc/passwd": "x"},  # a name it may not send
        {"tokenizer_config.json": "{}"},  # no tokenizer.json
        {"tokenizer.json": "x" * (MAX_PUBLISHED_BYTES + 1)},
        {"tokenizer.json": "not json at all"},  # does not load
    ],
)
def test_a_backend_sending_something_else_gets_no_tokenizer(files: dict[str, str]) -> None:
    assert FetchedTokenizers().load("box2:8000", "m", files) is None


def serving(body: bytes, status: int = 200) -> Upstream:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/tokenizer" and request.url.params["model"] == "m"
        assert request.headers["authorization"] == "Bearer sk-up"
        return httpx.Response(status, content=body)

    return Upstream("http://box2:8000", "sk-up", httpx.AsyncClient(transport=httpx.MockTransport(answer)))


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"error": {"message": "not found"}}', 404),  # vLLM, SGLang, llama.cpp: no such route
        (b'{"files": ["tokenizer.json"]}', 200),
        (b'{"files": {"tokenizer.json": 3}}', 200),
        (b"[1, 2", 200),
        (b" " * (MAX_TOKENIZER_BYTES + 1), 200),
    ],
)
def test_the_gateway_reads_only_a_well_formed_bounded_answer(body: bytes, status: int) -> None:
    assert asyncio.run(serving(body, status).tokenizer_files("m")) is None


def test_a_well_formed_answer_is_read() -> None:
    body = json.dumps({"model": "m", "files": {"tokenizer.json": "{}"}}).encode()
    assert asyncio.run(serving(body).tokenizer_files("m")) == {"tokenizer.json": "{}"}
