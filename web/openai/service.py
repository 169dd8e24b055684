"""OpenAI request bodies decoded and validated into the pipeline's Ask: the chat messages in the template's shape
(or the completion's prompt), the sampling fields, the tools. Every refusal names the offending parameter."""

from __future__ import annotations

from typing import Any

import msgspec

from engine import GuidedDecoding
from web.backends.protocol import Served
from web.errors import InvalidRequest, UnsupportedParameter
from web.generation.decoding import BodyDecoder
from web.generation.prompts import Ask, Chat, Text, shown
from web.generation.sampling import Sampling, check_guided, forced_tool_guided
from web.openai.schemas import (
    RESERVED_TEMPLATE_NAMES,
    ROLES,
    UNSUPPORTED_ROLES,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
    TextPart,
    _SamplingFields,
)
from web.openai.tools import check_tool_results, tool_plan, with_tool_turn

decode_chat = BodyDecoder(ChatCompletionRequest)
decode_completion = BodyDecoder(CompletionRequest)


async def chat_ask(body: ChatCompletionRequest, served: Served) -> Ask:
    sampling = sampling_of(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    messages = chat_messages(body.messages)
    extra = template_kwargs(body.chat_template_kwargs)
    plan = tool_plan(body, served.tokenizer)
    await check_guided(sampling.guided)
    guided = await forced_tool_guided(plan, sampling.guided)
    sampling = msgspec.structs.replace(sampling, logprobs=logprobs, guided=guided)
    requested = whole(body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens)
    return Ask(served, Chat(messages, plan, extra), sampling, requested, body.n or 1)


async def completion_ask(body: CompletionRequest, served: Served) -> Ask:
    sampling = msgspec.structs.replace(sampling_of(body), logprobs=body.logprobs)
    await check_guided(sampling.guided)
    return Ask(served, Text(_single_prompt(body.prompt)), sampling, whole(body.max_tokens), body.n or 1)


def whole(count: float | None) -> int | None:
    """A token count the schema let through as an integral float (5.0), as the int it is."""
    return None if count is None else int(count)


def sampling_of(body: _SamplingFields) -> Sampling:
    """The fields both endpoints share (logprobs is each one's own), in the engine's terms (their limits are the
    schema's and the engine's)."""
    if body.stream_options is not None and not body.stream:
        # OpenAI and vLLM refuse it: the options only mean something for a stream, and a client sending them
        # most likely forgot stream: true.
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    top_k = body.top_k if body.top_k is not None else 0
    return Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if top_k == -1 else top_k,  # -1 is vLLM's spelling of "off"
        seed=body.seed,
        stop=stop,
        ignore_eos=body.ignore_eos,
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        # The schema let only decimal strings through; Prompts checks them against the vocabulary.
        logit_bias=tuple((int(token), bias) for token, bias in (body.logit_bias or {}).items()),
        guided=guided_decoding(body.response_format),
    )


def guided_decoding(response_format: ResponseFormat | None) -> GuidedDecoding | None:
    """response_format as the engine's constraint (text: none)."""
    if isinstance(response_format, JsonObjectFormat):
        return GuidedDecoding(kind="json_object")
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.schema
        if schema is None:  # OpenAI requires one; vLLM and LangChain's json_mode fall back to any object
            return GuidedDecoding(kind="json_object")
        return GuidedDecoding(kind="json_schema", schema=msgspec.json.encode(schema).decode())
    return None


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """chat_template_kwargs as the template may take them: never one of the template call's own arguments or
    variables, nor a special token's name (a client could otherwise redefine eos_token inside the prompt)."""
    for name in kwargs or {}:
        if name in RESERVED_TEMPLATE_NAMES or name.endswith(("_token", "_tokens")):
            raise InvalidRequest(
                f"chat_template_kwargs may not set {shown(name)}: the server sets it", param="chat_template_kwargs"
            )
    return dict(kwargs or {})


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them: supported roles, text content, tool turns in the HF shape."""
    out = []
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            if m.role in UNSUPPORTED_ROLES:
                raise UnsupportedParameter(
                    f"role {shown(m.role)} is not supported: it belongs to the deprecated functions API; send tools "
                    "and tool messages",
                    param=f"messages[{i}].role",
                )
            raise InvalidRequest(
                f"role {shown(m.role)} is not one of system, user, assistant, tool", param=f"messages[{i}].role"
            )
        out.append(with_tool_turn({"role": role, "content": _text_content(m, i)}, m, i))
    check_tool_results(out)
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
        if not isinstance(part, TextPart):
            kind = type(part).__struct_config__.tag
            raise UnsupportedParameter(
                f"content parts of type '{kind}' are not supported: this model is text-only",
                param=f"messages[{i}].content[{j}].type",
            )
        texts.append(part.text)
    return "".join(texts)


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
