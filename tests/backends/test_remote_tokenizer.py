"""What the gateway makes of a backend's /tokenize when it is not vLLM's (test_vllm_remote_tokenizer.py has the real
one): a server without it (llama.cpp's and SGLang's shapes differ; neither is installed here), one that refuses or
answers nonsense, and the tool-call format read from a template's rendering. The answers come from an httpx
transport, the way test_upstream.py plays a server's worst case."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from engine import InvalidRequestError
from web.backends.fetched import FetchedTokenizers
from web.backends.remote import RemoteBackend
from web.backends.remote_tokenizer import PROBE_TOOL, RemoteTokenizer, TokenizerUnavailable, remote_tokenizer
from web.backends.router import Router
from web.backends.spec import parse_remote
from web.backends.status import BackendState
from web.backends.upstream import Upstream
from web.backends.upstream_errors import UpstreamError
from web.generation.prompts import Ask, Chat, Prompts
from web.keys.info import KeyInfo
from web.tools.formats import detect_format, supports_tools

Answer = Callable[[dict[str, Any]], httpx.Response]


def server(tokenize: Answer, detokenize: Callable[[list[int]], str] = lambda ids: "") -> httpx.AsyncClient:
    """An OpenAI-compatible server that is up, lists `m`, publishes no tokenizer, and answers /tokenize so."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/health", "/ready"):
            return httpx.Response(200, json={"status": "ok"})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        if path == "/tokenize":
            return tokenize(json.loads(request.content))
        if path == "/detokenize":
            return httpx.Response(200, json={"prompt": detokenize(json.loads(request.content)["tokens"])})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def probed(http: httpx.AsyncClient) -> RemoteBackend:
    backend = RemoteBackend(parse_remote("http://:sk-k@box2:8000"), http, lambda name, d: None, FetchedTokenizers())
    asyncio.run(backend.probe())
    return backend


def test_a_server_without_tokenize_serves_nothing_and_says_why() -> None:
    backend = probed(server(lambda body: httpx.Response(404, json={"detail": "Not Found"})))
    assert backend.state() == BackendState.UP and backend.models() == {} and backend.unservable == ("m",)
    assert backend.reason() == (
        "no tokenizer for m: it publishes none, and the backend's /tokenize answered 404 (it has no such endpoint: "
        "vLLM and llama.cpp have, SGLang differs): Not Found (add #tokenizer=DIR)"
    )


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (httpx.Response(200, json={"tokens": [1, -2, 3]}), "without token ids"),  # not ids a vocabulary has
        (httpx.Response(200, json={"tokens": "1 2 3"}), "without token ids"),
        # llama.cpp's answer to vLLM's shape, from a server that then has no /apply-template
        (httpx.Response(200, json={"tokens": []}), "apply-template answered 404"),
        (httpx.Response(500, json={"error": {"message": "boom"}}), "answered 500: boom"),
        (httpx.Response(400, json={"error": {"message": "no template"}}), "refuses even a one-message chat"),
    ],
)
def test_nonsense_or_a_refusal_at_probe_time_leaves_the_model_unservable(answer: httpx.Response, why: str) -> None:
    async def go() -> RemoteTokenizer:
        async with server(lambda body: answer) as http:
            return await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")

    with pytest.raises(TokenizerUnavailable, match=why):
        asyncio.run(go())


def ids_of(text: str) -> httpx.Response:
    return httpx.Response(200, json={"count": len(text), "max_model_len": 4096, "tokens": list(text.encode())})


def rendering(template: Callable[[dict[str, Any]], str]) -> RemoteTokenizer:
    """A server whose template renders a request's body as `template` says; ids are the text's bytes."""

    async def go() -> RemoteTokenizer:
        async with server(lambda body: ids_of(template(body)), lambda ids: bytes(ids).decode()) as http:
            return await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")

    return asyncio.run(go())


def test_the_tool_format_is_read_from_a_rendering_that_calls_the_probe_tool() -> None:
    def hermes(body: dict[str, Any]) -> str:
        tools = "".join(f"<tools>{json.dumps(t)}</tools>" for t in body.get("tools") or ())
        calls = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        return tools + "".join(f"<tool_call>{c['function']['name']}</tool_call>" for c in calls)

    def mistral_refusing_tool_turns(body: dict[str, Any]) -> str:
        if len(body["messages"]) > 1:
            raise AssertionError("unreachable")
        return f"[AVAILABLE_TOOLS]{json.dumps(body['tools'])}[/AVAILABLE_TOOLS][TOOL_CALLS]"

    tokenizer = rendering(hermes)
    assert supports_tools(tokenizer) and detect_format(tokenizer) == "hermes" and tokenizer.model_max_length == 4096
    plain = rendering(lambda body: "".join(m["content"] or "" for m in body["messages"]))
    assert not supports_tools(plain) and detect_format(plain) == "hermes"  # the fallback prompt's format

    def refusing(body: dict[str, Any]) -> httpx.Response:
        if len(body["messages"]) > 1:  # a template that refuses tool turns: asked again with the user's alone
            return httpx.Response(400, json={"error": {"message": "roles must alternate"}})
        return ids_of(mistral_refusing_tool_turns(body))

    async def go() -> RemoteTokenizer:
        async with server(refusing, lambda ids: bytes(ids).decode()) as http:
            return await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")

    mistral = asyncio.run(go())
    assert PROBE_TOOL in mistral.chat_template and detect_format(mistral) == "mistral"


def test_at_request_time_a_refusal_is_the_clients_and_a_failure_the_servers() -> None:
    """A 400 is the messages' fault (prompts.py makes it the client's 400); a 5xx or a connection that fails is the
    server's (a 503 the client may retry)."""
    answers: list[httpx.Response | Exception] = [
        httpx.Response(400, json={"error": {"message": "bad role"}}),
        httpx.Response(503, json={"error": {"message": "overloaded"}}),
        httpx.ConnectError("refused"),
    ]

    def tokenize(body: dict[str, Any]) -> httpx.Response:
        if body["messages"][0]["content"] == "x":  # the probe
            return ids_of("x")
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def go() -> None:
        async with server(tokenize, lambda ids: "x") as http:
            tokenizer = await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")
            hi = [{"role": "user", "content": "hi"}]
            with pytest.raises(InvalidRequestError, match="bad role"):
                await tokenizer.render(hi, None, {})
            with pytest.raises(UpstreamError, match="answered 503: overloaded"):
                await tokenizer.render(hi, None, {})
            with pytest.raises(UpstreamError, match="/tokenize failed: ConnectError"):
                await tokenizer.render(hi, None, {})

    asyncio.run(go())


def test_tool_call_arguments_go_as_json_text() -> None:
    """vLLM validates a call's arguments as a string (a dict is a 400) and parses them for the template."""
    seen: list[dict[str, Any]] = []

    def tokenize(body: dict[str, Any]) -> httpx.Response:
        seen.append(body)
        return ids_of("ok")

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}

    async def go() -> list[int]:
        async with server(tokenize, lambda ids: "ok") as http:
            tokenizer = await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")
            return await tokenizer.render([{"role": "assistant", "content": "", "tool_calls": [call]}], None, {"k": 1})

    assert asyncio.run(go()) == list(b"ok")
    assert seen[-1]["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert seen[-1]["chat_template_kwargs"] == {"k": 1} and "tools" not in seen[-1]


def test_an_answer_past_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("web.backends.remote_tokenizer.MAX_ANSWER_BYTES", 1000)

    async def go() -> RemoteTokenizer:
        async with server(lambda body: ids_of("x" * 400)) as http:  # 400 ids as JSON: over 1000 bytes
            return await remote_tokenizer(Upstream("http://box2:8000", None, http), "m")

    with pytest.raises(TokenizerUnavailable, match="answered more than 1000 bytes"):
        asyncio.run(go())


def test_a_prompt_whose_backend_died_before_its_probe_noticed_is_rendered_by_the_next_one() -> None:
    """Two backends serve `m`, each with its own /tokenize. The first goes away between its probes: a request
    rendered in that second gets its ids from the second backend, not a 503; with no other backend it is a 503."""
    dead = {"first": False}

    def first(body: dict[str, Any]) -> httpx.Response:
        if dead["first"]:
            raise httpx.ConnectError("refused")
        return ids_of("first")

    async def go() -> None:
        async with (
            server(first, lambda ids: "x") as one,
            server(lambda body: ids_of("second!"), lambda ids: "x") as two,
        ):
            backends = [
                RemoteBackend(parse_remote(url), http, lambda name, d: None, FetchedTokenizers())
                for url, http in (("http://:sk-a@box1:8000", one), ("http://:sk-b@box2:8000", two))
            ]
            await asyncio.gather(*(b.probe() for b in backends))
            prompts = Prompts(Router(backends), default_max_tokens=16, store_text=False)
            key = KeyInfo(1, "k", "sk-", None, None, "day", None, datetime.now(UTC), None, 1.0, "interactive")
            ask = Ask(prompts.served("m"), Chat([{"role": "user", "content": "hi"}]))
            assert (await prompts.prepare(ask, key)).prompt_ids == list(b"first")
            dead["first"] = True
            assert (await prompts.prepare(ask, key)).prompt_ids == list(b"second!")
            alone = Prompts(Router(backends[:1]), default_max_tokens=16, store_text=False)
            with pytest.raises(UpstreamError, match="ConnectError"):
                await alone.prepare(ask, key)

    asyncio.run(go())
