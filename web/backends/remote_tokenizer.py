"""A model's tokenizer kept by the backend that serves it, for the models the gateway has no tokenizer of its own
for (no #tokenizer=DIR, none the backend publishes). Two servers answer: vLLM's /tokenize renders a chat with the
model's own template (messages, tools, chat_template_kwargs) and returns its ids; llama.cpp's server renders it with
/apply-template and tokenizes the text with /tokenize as its chat completions do (BOS added where the model wants it,
special tokens parsed). Either way the ids are the very ids the backend's /v1/chat/completions would count, so the
gateway still sends ids, counts the prompt exactly for caps and quotas, and checks the context before admission. One
or two HTTP round trips per request, on the backend's key, with a timeout. (SGLang's /tokenize takes no messages:
such a backend needs #tokenizer=DIR.)

What it cannot do is read the template's source: whether the template renders tools, and which tool-call format it
teaches, are read once at probe time from a rendered conversation that offers a probe tool and calls it
(web/tools/formats.py reads `renders_tools` and `chat_template` from it)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from engine import InvalidRequestError
from web.backends.upstream import Upstream
from web.backends.upstream_errors import MESSAGE_CHARS, UpstreamError, error_message, json_body

TOKENIZE_TIMEOUT_S = 30.0  # a long prompt on a busy server
PROBE_TIMEOUT_S = 10.0  # a probe's render: the first one of a fresh server compiles its template
# An answer's size: a 1M-token context's ids as JSON are ~8 MB; text from /detokenize is bounded the same.
MAX_ANSWER_BYTES = 32 << 20
# The backend checks the ids itself (it refuses one outside its vocabulary with a 400, which reaches the client):
# the gateway's own check then passes every non-negative id.
VOCAB_UNKNOWN = 1 << 31
PROBE_TOOL = "appliance_probe_tool"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
_CALL = {"id": "call00001", "type": "function", "function": {"name": PROBE_TOOL, "arguments": "{}"}}
# The probe conversations, each with the probe tool offered: a turn that calls the tool and its result (its markers
# name the format); a template that refuses those turns is asked again with the user's turn alone, and a server that
# refuses tools at all (llama.cpp started with --no-jinja) without the tool.
_PROBES: tuple[tuple[list[dict[str, Any]], bool], ...] = (
    (
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [_CALL]},
            {"role": "tool", "tool_call_id": _CALL["id"], "content": "y"},
        ],
        True,
    ),
    ([{"role": "user", "content": "x"}], True),
    ([{"role": "user", "content": "x"}], False),
)


class TokenizerUnavailable(Exception):
    """The backend tokenizes nothing for this model; the message says why, in /ready's and the console's words."""


class RemoteTokenizer:
    """What the gateway asks of a tokenizer, answered by the backend (async: each answer is a request)."""

    def __init__(
        self,
        upstream: Upstream,
        model: str,
        max_model_len: int | None,
        rendered_tools: str | None,
        llama_cpp: bool = False,
    ) -> None:
        self._upstream = upstream
        self.model = model
        self.llama_cpp = llama_cpp  # llama.cpp's server: /apply-template, then /tokenize of its text
        self.model_max_length = max_model_len
        self.renders_tools = rendered_tools is not None
        # Not the template's source (the backend keeps that): a conversation it rendered, with the markers of the
        # tool-call format it teaches. Empty where it renders no tools.
        self.chat_template = rendered_tools or ""

    def __repr__(self) -> str:
        return f"RemoteTokenizer({self._upstream.base_url!r}, {self.model!r})"

    def __len__(self) -> int:
        return VOCAB_UNKNOWN

    async def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
    ) -> list[int]:
        """The chat's ids with the generation prompt, as the backend's chat completions would render it."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_openai_message(m) for m in messages],
            "add_generation_prompt": True,
        }
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if self.llama_cpp:
            return await self.encode(await self._template(body, TOKENIZE_TIMEOUT_S), TOKENIZE_TIMEOUT_S)
        return (await self._tokenize(body, TOKENIZE_TIMEOUT_S))[0]

    async def encode(self, text: str, timeout: float = TOKENIZE_TIMEOUT_S) -> list[int]:
        """A raw prompt's ids, with the special tokens the model adds (its BOS), as its completions would."""
        if self.llama_cpp:  # its completions tokenize a text prompt so: BOS where the model adds one, specials parsed
            body: dict[str, Any] = {"content": text, "add_special": True, "parse_special": True}
        else:
            body = {"model": self.model, "prompt": text, "add_special_tokens": True}
        return (await self._tokenize(body, timeout))[0]

    async def decode(self, ids: list[int], timeout: float = TOKENIZE_TIMEOUT_S) -> str:
        try:
            r = await self._upstream.post(
                "/detokenize", {"model": self.model, "tokens": ids}, timeout, MAX_ANSWER_BYTES
            )
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the backend's /detokenize failed: {type(exc).__name__}") from None
        _raise_for(r, "detokenize")
        text = json_body(r.content).get("content" if self.llama_cpp else "prompt")
        if not isinstance(text, str):
            raise UpstreamError("the backend's /detokenize answered without its text")
        return text

    async def _template(self, body: dict[str, Any], timeout: float) -> str:
        """llama.cpp's /apply-template: the chat as the text its template renders."""
        try:
            r = await self._upstream.post("/apply-template", body, timeout, MAX_ANSWER_BYTES)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the backend's /apply-template failed: {type(exc).__name__}") from None
        _raise_for(r, "apply-template")
        prompt = json_body(r.content).get("prompt")
        if not isinstance(prompt, str):
            raise UpstreamError("the backend's /apply-template answered without its prompt")
        return prompt

    async def _tokenize(self, body: dict[str, Any], timeout: float) -> tuple[list[int], int | None]:
        try:
            r = await self._upstream.post("/tokenize", body, timeout, MAX_ANSWER_BYTES)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the backend's /tokenize failed: {type(exc).__name__}") from None
        _raise_for(r, "tokenize")
        answer = json_body(r.content)
        ids = answer.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise UpstreamError("the backend's /tokenize answered without token ids")
        context = answer.get("max_model_len")
        return ids, context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None


async def remote_tokenizer(upstream: Upstream, model: str, timeout: float = PROBE_TIMEOUT_S) -> RemoteTokenizer:
    """The backend's tokenizer for `model`, tried once (a probe): vLLM's shape first, then llama.cpp's (whose
    /tokenize answers vLLM's body with no ids); TokenizerUnavailable says why there is none."""
    try:
        return await _probe(RemoteTokenizer(upstream, model, None, None), timeout)
    except _NotVllm:
        return await _probe(RemoteTokenizer(upstream, model, None, None, llama_cpp=True), timeout)


class _NotVllm(Exception):
    """The /tokenize answered a chat with no ids: llama.cpp's, which takes text."""


async def _probe(probe: RemoteTokenizer, timeout: float) -> RemoteTokenizer:
    for messages, offer_tool in _PROBES:
        body = {"model": probe.model, "messages": messages, "add_generation_prompt": True}
        if offer_tool:
            body["tools"] = _PROBE_TOOLS
        try:
            if probe.llama_cpp:
                ids, context = await probe.encode(await probe._template(body, timeout), timeout), None
            else:
                ids, context = await probe._tokenize(body, timeout)
        except InvalidRequestError:
            continue  # its template refuses a tool turn, or the server tools: asked again without
        except UpstreamError as exc:
            raise TokenizerUnavailable(str(exc)) from None
        if not ids and not probe.llama_cpp:
            raise _NotVllm
        if not ids:
            raise TokenizerUnavailable("the backend's /tokenize answered no ids for a chat")
        text = await _decoded(probe, ids, timeout)
        rendered = text if PROBE_TOOL in text else None
        return RemoteTokenizer(probe._upstream, probe.model, context, rendered, probe.llama_cpp)
    raise TokenizerUnavailable("the backend's /tokenize refuses even a one-message chat")


async def _decoded(probe: RemoteTokenizer, ids: list[int], timeout: float) -> str:
    try:
        return await probe.decode(ids, timeout)
    except (UpstreamError, InvalidRequestError) as exc:
        raise TokenizerUnavailable(str(exc)) from None


def _raise_for(r: httpx.Response, what: str) -> None:
    if r.status_code == 200:
        return
    message = error_message(json_body(r.content[:65536])) or f"HTTP {r.status_code}"
    if r.status_code in (400, 422):
        raise InvalidRequestError(message, "messages")
    hint = " (a wrong key in its entry?)" if r.status_code in (401, 403) else ""
    if r.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed", f"HTTP {r.status_code}"):
        hint = " (it has no such endpoint: vLLM and llama.cpp have, SGLang differs)"
    raise UpstreamError(f"the backend's /{what} answered {r.status_code}{hint}: {message}"[:MESSAGE_CHARS])


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message in the HF shape (tool-call arguments as a dict) in OpenAI's (arguments as JSON text), which the
    backend validates and turns back into a dict for its template."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        function = call["function"]
        arguments = function["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({**call, "function": {**function, "arguments": arguments}})
    return {**message, "tool_calls": out}
