"""OpenAI request bodies (decoded by web/openai/decoding.py) into engine terms for the model they name: apply its
chat template or read the prompt, collect the sampling fields and apply the key's policy, giving one Prepared
value. Every refusal is an InvalidRequest naming the offending parameter."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from engine import GuidedDecoding, SamplingParams, validate_guided
from web.backends.protocol import Served
from web.backends.router import Router
from web.errors import (
    AppError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    ServiceUnavailable,
    UnsupportedParameter,
)
from web.generation.policy import Prepared, effective_max_tokens
from web.keys.service import KeyInfo
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
from web.tools import NO_TOOLS, ToolPlan, template_inputs

T = TypeVar("T")
THREAD_CHARS = 16_384  # tokenizing more text than this moves off the event loop
# More characters than this per token of context cannot fit, so such a prompt is refused before it is tokenized
# (a 3.5 MB one took 7-12 s of CPU). Not tighter: the bundled model's longest token is 81 characters (a run of
# spaces, or of "#"), and a prompt of spaces tokenizes at 64 characters a token.
MAX_CHARS_PER_TOKEN = 128
SHOWN_CHARS = 64


def served_model(router: Router, model: str) -> Served:
    """The model a request names, as a backend up serves it."""
    served = router.served(model)
    if served is None:
        raise model_refusal(router, model)
    return served


def model_refusal(router: Router, model: str) -> AppError:
    """Why a model cannot be served: 404 for a name no backend serves, 503 while those that serve it are down."""
    if router.known(model):
        return ServiceUnavailable(f"no backend serving the model {shown(model)} is up now", code="engine_unavailable")
    names = router.model_names()
    serves = ", ".join(f"'{n}'" for n in names) if names else "no model right now"
    return ModelNotFound(f"the model {shown(model)} does not exist; this server serves {serves}", param="model")


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """A client's string quoted for an error message (which history keeps), cut to `limit` characters."""
    return f"'{value}'" if len(value) <= limit else f"'{value[:limit]}...' ({len(value)} characters)"


def whole(count: float | None) -> int | None:
    """A token count the schema let through as an integral float (5.0), as the int it is."""
    return None if count is None else int(count)


def sampling_fields(body: _SamplingFields) -> dict[str, Any]:
    """The fields both endpoints share, in the engine's terms (their limits are the schema's and the engine's)."""
    if body.stream_options is not None and not body.stream:
        # OpenAI and vLLM refuse it: the options only mean something for a stream, and a client sending them
        # most likely forgot stream: true.
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    top_k = body.top_k if body.top_k is not None else 0
    fields: dict[str, Any] = {
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": 0 if top_k == -1 else top_k,  # -1 is vLLM's spelling of "off"
        "seed": body.seed,
        "stop": stop,
        "ignore_eos": body.ignore_eos,
        "min_p": body.min_p or 0.0,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        # The schema let only decimal strings through; Prompts checks them against the vocabulary.
        "logit_bias": tuple((int(token), bias) for token, bias in (body.logit_bias or {}).items()),
        "guided": guided_decoding(body.response_format),
    }
    return fields


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


async def forced_tool_guided(plan: ToolPlan, guided: GuidedDecoding | None) -> GuidedDecoding | None:
    """The constraint of tool_choice required or named (its schemas checked off the event loop: the compiler
    judges them), which cannot share the output with response_format's."""
    if plan.mode not in ("named", "required"):
        return guided
    if guided is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tool_choice required or a named function: both constrain "
            "the whole output",
            param="tool_choice",
        )
    return await asyncio.to_thread(plan.guided)


async def check_guided(guided: GuidedDecoding | None) -> None:
    """The engine's check of a constraint, before admission, off the event loop: its first use imports
    xgrammar (and torch), and a large schema takes a while to parse."""
    if guided is None:
        return
    try:
        await asyncio.to_thread(validate_guided, guided)
    except RecursionError:  # msgspec took the nesting; a parser below it may not
        raise InvalidRequest("the JSON schema is nested too deeply", param="response_format") from None


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


class Prompts:
    """Turns decoded bodies into Prepared values for this server's model and the caller's key."""

    def __init__(self, router: Router, default_max_tokens: int, store_text: bool) -> None:
        self.router = router
        self.default_max_tokens = default_max_tokens
        self.store_text = store_text

    def served(self, model: str) -> Served:
        return served_model(self.router, model)

    async def chat(self, body: ChatCompletionRequest, key: KeyInfo) -> Prepared:
        served = self.served(body.model)
        fields = sampling_fields(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        fields["logprobs"] = (body.top_logprobs or 0) if body.logprobs else None
        messages = chat_messages(body.messages)
        extra = template_kwargs(body.chat_template_kwargs)
        plan = tool_plan(body, served.tokenizer)
        await check_guided(fields["guided"])
        fields["guided"] = await forced_tool_guided(plan, fields["guided"])
        size = sum(len(m["content"]) for m in messages)
        _check_chars(served, size, "messages")
        ids = await _template_ids(served, messages, plan, extra)
        requested = whole(body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens)
        text = msgspec.json.encode(messages).decode() if self.store_text else None
        prepared = self._prepared(served, ids, requested, fields, key, text, "messages", body.n or 1)
        return dataclasses.replace(prepared, tools=plan)

    async def conversation(
        self,
        served: Served,
        messages: list[dict[str, Any]],
        requested: int | None,
        fields: dict[str, Any],
        key: KeyInfo,
        plan: ToolPlan = NO_TOOLS,
    ) -> Prepared:
        """Messages another API normalized to the chat template's shape (each with a text "content"; tool turns in
        the HF shape, web/tools/conversation.py), with their sampling fields in engine terms (a forced tool
        choice's guided decoding among them: see forced_tool_guided): the same checks, template and key policy
        as a chat completion's; `plan` renders the tools and travels to the response (Prepared.tools)."""
        size = sum(len(m["content"]) for m in messages)
        _check_chars(served, size, "messages")
        ids = await _template_ids(served, messages, plan)
        text = msgspec.json.encode(messages).decode() if self.store_text else None
        return dataclasses.replace(self._prepared(served, ids, requested, fields, key, text, "messages"), tools=plan)

    async def completion(self, body: CompletionRequest, key: KeyInfo) -> Prepared:
        served = self.served(body.model)
        fields = sampling_fields(body)
        fields["logprobs"] = body.logprobs
        await check_guided(fields["guided"])
        prompt = _single_prompt(body.prompt)
        tokenizer = served.tokenizer
        if isinstance(prompt, str):
            _check_chars(served, len(prompt), "prompt")
            ids = await _maybe_in_thread(len(prompt), _encode, tokenizer, prompt)
        else:
            ids = prompt
            vocab = len(tokenizer)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        text = (prompt if isinstance(prompt, str) else str(prompt)) if self.store_text else None
        return self._prepared(served, ids, whole(body.max_tokens), fields, key, text, "prompt", body.n or 1)

    def _prepared(
        self,
        served: Served,
        ids: list[int],
        requested: int | None,
        fields: dict[str, Any],
        key: KeyInfo,
        text: str | None,
        prompt_field: str,
        n: int = 1,
    ) -> Prepared:
        info = served.info
        max_tokens = effective_max_tokens(requested, key, self.default_max_tokens, len(ids), info, prompt_field)
        vocab = len(served.tokenizer)
        bad = next((t for t, _ in fields.get("logit_bias", ()) if t >= vocab), None)
        if bad is not None:
            raise InvalidRequest(
                f"logit_bias names token {bad}, outside the vocabulary (0..{vocab - 1})", param="logit_bias"
            )
        # The engine's own limits on the sampling fields raise InvalidRequestError here, before admission, and
        # so do the seeds of the later choices (seed + i).
        prepared = Prepared(
            ids, SamplingParams(max_tokens=max_tokens, **fields), requested, text, n=n, model=served.name
        )
        prepared.choices()
        return prepared


def _check_chars(served: Served, chars: int, param: str) -> None:
    limit = served.info.max_model_len * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise ContextLengthExceeded(
            f"the prompt is {chars} characters: more than this model's context of {served.info.max_model_len} "
            f"tokens can hold (at most {MAX_CHARS_PER_TOKEN} characters a token, {limit} in all)",
            param=param,
        )


async def _template_ids(
    served: Served, messages: list[dict[str, Any]], plan: ToolPlan, extra: dict[str, Any] | None = None
) -> list[int]:
    """The prompt's ids: messages and tools through the model's template (web/tools/render.py)."""
    tokenizer = served.tokenizer
    inputs = template_inputs(messages, plan, tokenizer)
    size = sum(len(m["content"]) for m in inputs["conversation"])
    return await _maybe_in_thread(
        size, _apply_template, tokenizer, inputs["conversation"], {**(extra or {}), "tools": inputs["tools"]}
    )


def _apply_template(tokenizer: Any, messages: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> list[int]:
    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **(extra or {})
        )
    except Exception as exc:  # the template is model data: any failure there is a refusal of the messages
        raise InvalidRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
    return list(ids)


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
