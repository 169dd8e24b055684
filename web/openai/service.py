"""OpenAI request bodies into engine terms: decode and validate, apply the chat template or read the prompt,
and collect the sampling fields. Every refusal is an InvalidRequest naming the offending parameter."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from web.errors import InvalidRequest, ModelNotFound, UnsupportedParameter, undecodable_body
from web.generation.admission import Prepared
from web.openai.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, _SamplingFields
from web.state import Services

T = TypeVar("T")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_LOGPROBS = 20
THREAD_CHARS = 16_384  # tokenizing more text than this moves off the event loop
SHOWN_CHARS = 64
_PATH = re.compile(r"at `\$\.?(.*)`$")

_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    if not body.strip():
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH.search(text)
        param = match.group(1) if match and match.group(1) else None
        raise InvalidRequest(f"invalid request body: {text}", param=param) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except (RecursionError, UnicodeDecodeError) as exc:
        raise undecodable_body(exc) from None


def decode_chat(body: bytes) -> ChatCompletionRequest:
    return decode_body(body, _chat_decoder)


def decode_completion(body: bytes) -> CompletionRequest:
    return decode_body(body, _completion_decoder)


def check_model(services: Services, model: str) -> None:
    if model != services.model_name:
        raise ModelNotFound(
            f"the model {shown(model)} does not exist; this server serves '{services.model_name}'", param="model"
        )


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """A client's string quoted for an error message (which history keeps), cut to `limit` characters."""
    return f"'{value}'" if len(value) <= limit else f"'{value[:limit]}...' ({len(value)} characters)"


def sampling_fields(body: _SamplingFields) -> dict[str, Any]:
    """The fields both endpoints share, checked for what this server supports."""
    if body.n is not None and body.n != 1:
        raise InvalidRequest(f"n must be 1: this server returns one choice per request, not {body.n}", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value not in (None, 0, 0.0):
            raise UnsupportedParameter(f"{name} is not supported (only 0 is accepted)", param=name)
    if body.logit_bias:
        raise UnsupportedParameter("logit_bias is not supported", param="logit_bias")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    top_k = body.top_k if body.top_k is not None else 0
    fields: dict[str, Any] = {
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": 0 if top_k == -1 else top_k,  # -1 is vLLM's spelling of "off"
        "seed": body.seed,
        "stop": stop,
        "ignore_eos": body.ignore_eos,
    }
    return fields


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template takes them: supported roles, text content only."""
    if not messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            if m.role in ("tool", "function"):
                raise UnsupportedParameter(
                    f"role {shown(m.role)} is not supported: this server has no tool calling",
                    param=f"messages[{i}].role",
                )
            raise InvalidRequest(
                f"role {shown(m.role)} is not one of system, user, assistant", param=f"messages[{i}].role"
            )
        if m.tool_calls:
            raise UnsupportedParameter("tool_calls are not supported", param=f"messages[{i}].tool_calls")
        out.append({"role": role, "content": _text_content(m, i)})
    return out


def _text_content(m: ChatMessage, i: int) -> str:
    if isinstance(m.content, str):
        return m.content
    if m.content is None:
        if m.role == "assistant":
            return ""
        raise InvalidRequest(f"a {m.role} message needs content", param=f"messages[{i}].content")
    texts = []
    for j, part in enumerate(m.content):
        if part.type != "text" or part.text is None:
            raise UnsupportedParameter(
                f"content part type {shown(part.type)} is not supported; only text parts are",
                param=f"messages[{i}].content[{j}]",
            )
        texts.append(part.text)
    return "".join(texts)


def prepare_chat(services: Services) -> Callable[[ChatCompletionRequest], Awaitable[Prepared]]:
    async def prepare(body: ChatCompletionRequest) -> Prepared:
        check_model(services, body.model)
        if body.tools or body.functions:
            raise UnsupportedParameter("tools are not supported by this server", param="tools")
        if body.tool_choice not in (None, "none"):
            raise UnsupportedParameter("tool_choice is not supported by this server", param="tool_choice")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise UnsupportedParameter("only the text response_format is supported", param="response_format")
        fields = sampling_fields(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", param="top_logprobs")
        fields["logprobs"] = (body.top_logprobs or 0) if body.logprobs else None
        messages = chat_messages(body.messages)
        size = sum(len(m["content"]) for m in messages)
        ids = await _maybe_in_thread(size, _apply_template, services.client.tokenizer, messages)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        text = msgspec.json.encode(messages).decode() if services.config.store_text else None
        return Prepared(ids, max_tokens, fields, text)

    return prepare


def _apply_template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception as exc:  # the template is model data: any failure there is a refusal of the messages
        raise InvalidRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
    return list(ids)


def prepare_completion(services: Services) -> Callable[[CompletionRequest], Awaitable[Prepared]]:
    async def prepare(body: CompletionRequest) -> Prepared:
        check_model(services, body.model)
        if body.echo:
            raise UnsupportedParameter("echo is not supported", param="echo")
        if body.suffix:
            raise UnsupportedParameter("suffix is not supported", param="suffix")
        if body.best_of not in (None, 1):
            raise InvalidRequest("best_of must be 1", param="best_of")
        fields = sampling_fields(body)
        if body.logprobs is not None and not 0 <= body.logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(f"logprobs must be between 0 and {MAX_LOGPROBS}", param="logprobs")
        fields["logprobs"] = body.logprobs
        prompt = _single_prompt(body.prompt)
        tokenizer = services.client.tokenizer
        if isinstance(prompt, str):
            ids = await _maybe_in_thread(len(prompt), _encode, tokenizer, prompt)
        else:
            ids = prompt
            vocab = len(tokenizer)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        text = (prompt if isinstance(prompt, str) else str(prompt)) if services.config.store_text else None
        return Prepared(ids, body.max_tokens, fields, text)

    return prepare


def _encode(tokenizer: Any, prompt: str) -> list[int]:
    try:
        return list(tokenizer.encode(prompt))
    except Exception as exc:  # the tokenizer is model data too: a refusal there is a refusal of the prompt
        raise InvalidRequest(f"the prompt could not be tokenized: {exc}", param="prompt") from None


def _single_prompt(prompt: str | list[Any]) -> str | list[int]:
    """A string or one token-id list; batches (a list of prompts) are accepted only with one element."""
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise InvalidRequest("the prompt is empty", param="prompt")
    if all(_is_token(t) for t in prompt):
        return list(prompt)
    if len(prompt) != 1:
        raise InvalidRequest(
            f"a batch of {len(prompt)} prompts is not supported: send one prompt per request", param="prompt"
        )
    only = prompt[0]
    if isinstance(only, str):
        return only
    if isinstance(only, list) and only and all(_is_token(t) for t in only):
        return list(only)
    raise InvalidRequest("prompt must be a string, a list of token ids, or a list of one of those", param="prompt")


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _maybe_in_thread(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size > THREAD_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
