"""A decoded request (Ask, whichever dialect decoded it) into the one Prepared value for the model it names: the
chat template rendered or the prompt tokenized, its size checked, the key's policy applied."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from engine import EngineDeadError, InvalidRequestError, check_prompt
from web.backends.protocol import Served
from web.backends.remote_tokenizer import RemoteTokenizer
from web.backends.router import Router
from web.db import SQLITE_INT_MAX
from web.errors import AppError, ContextLengthExceeded, InvalidRequest, ModelNotFound, ServiceUnavailable
from web.generation.policy import Prepared, effective_max_tokens
from web.generation.sampling import Sampling
from web.keys.info import KeyInfo
from web.tools import NO_TOOLS, ToolPlan, template_inputs

T = TypeVar("T")
THREAD_CHARS = 16_384  # tokenizing more text than this moves off the event loop
# More characters than this per token of context cannot fit, so such a prompt is refused before it is tokenized
# (a 3.5 MB one took 7-12 s of CPU). Not tighter: the bundled model's longest token is 81 characters (a run of
# spaces, or of "#"), and a prompt of spaces tokenizes at 64 characters a token.
MAX_CHARS_PER_TOKEN = 128
SHOWN_CHARS = 64


@dataclass(frozen=True, slots=True)
class Chat:
    """A conversation in the chat template's shape (each message with a text "content"; tool turns in the HF
    shape, web/tools), the tools it offers (rendered by the template, and read back from the answer). `folded`: the
    same conversation for a template that refuses its system turns after the first (they folded into that one)."""

    messages: list[dict[str, Any]]
    tools: ToolPlan = NO_TOOLS
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    folded: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Text:
    """A raw prompt: text to tokenize, or token ids as they are."""

    prompt: str | list[int]


@dataclass(frozen=True, slots=True)
class Ask:
    """One request as its dialect decoded and validated it, in the pipeline's terms."""

    served: Served
    prompt: Chat | Text
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None  # as asked; None when the body had none
    n: int = 1  # choices


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """A client's string quoted for an error message (which history keeps), cut to `limit` characters."""
    return f"'{value}'" if len(value) <= limit else f"'{value[:limit]}...' ({len(value)} characters)"


def model_refusal(router: Router, model: str) -> AppError:
    """Why a model cannot be served: 404 for a name no backend serves, 503 while those that serve it are down."""
    if router.known(model):
        return ServiceUnavailable(f"no backend serving the model {shown(model)} is up now", code="engine_unavailable")
    names = router.model_names()
    serves = ", ".join(f"'{n}'" for n in names) if names else "no model right now"
    return ModelNotFound(f"the model {shown(model)} does not exist; this server serves {serves}", param="model")


class Prompts:
    """Turns Asks into Prepared values for the model they name and the caller's key."""

    def __init__(self, router: Router, default_max_tokens: int, store_text: bool, trim_max_tokens: bool = True) -> None:
        self.router = router
        self.default_max_tokens = default_max_tokens
        self.store_text = store_text
        self.trim_max_tokens = trim_max_tokens  # a max_tokens that does not fit runs with what fits, else a 400

    def served(self, model: str) -> Served:
        """The model a request names, as a backend up serves it."""
        served = self.router.served(model)
        if served is None:
            raise model_refusal(self.router, model)
        return served

    async def prepare(self, ask: Ask, key: KeyInfo) -> Prepared:
        """The prompt's ids, max_tokens within the key's policy and the context, the sampling checked."""
        served, prompt = ask.served, ask.prompt
        if key.models and served.name not in key.models:
            allowed = ", ".join(f"'{m}'" for m in key.models)
            raise ModelNotFound(
                f"your plan does not include the model {shown(served.name)}; it includes {allowed}", param="model"
            )
        try:
            ids, field_name = await self._ids(served, prompt)
        except EngineDeadError:  # a backend's tokenizer (its /tokenize) gone with the backend: another's, if any
            other = self.router.served(served.name, besides=served)
            if other is None:
                raise
            served = other
            ids, field_name = await self._ids(served, prompt)
        # The engine's own check, made here before admission (a remote backend's refusal would come after it).
        check_prompt(ids, (t for t, _ in ask.sampling.logit_bias), len(served.tokenizer))
        info = served.info
        max_tokens = effective_max_tokens(
            ask.max_tokens, key, self.default_max_tokens, len(ids), info, field_name, self.trim_max_tokens
        )
        tools = prompt.tools if isinstance(prompt, Chat) else NO_TOOLS
        # The engine's own limits on the sampling fields raise InvalidRequestError here, before admission, and
        # so do the seeds of the later choices (seed + i).
        text = _stored(prompt) if self.store_text else None
        # The history keeps the ask, which a trimmed request may carry far past what a database integer holds.
        asked = None if ask.max_tokens is None else min(ask.max_tokens, SQLITE_INT_MAX)
        prepared = Prepared(ids, ask.sampling.params(max_tokens), asked, text, n=ask.n, tools=tools, model=served.name)
        prepared.choices()
        return prepared

    async def _ids(self, served: Served, prompt: Chat | Text) -> tuple[list[int], str]:
        """The prompt's ids and the field they come from."""
        if isinstance(prompt, Chat):
            return await self._chat_ids(served, prompt), "messages"
        return await _text_ids(served, prompt.prompt), "prompt"

    async def _chat_ids(self, served: Served, chat: Chat) -> list[int]:
        """The prompt's ids: messages and tools through the model's template (web/tools/render.py); the folded
        conversation where the template refuses the messages as they are."""
        _check_chars(served, sum(len(m["content"]) for m in chat.messages), "messages")
        try:
            return await _render(served, chat, chat.messages)
        except InvalidRequest:
            if chat.folded is None:
                raise
            return await _render(served, chat, chat.folded)


async def _render(served: Served, chat: Chat, messages: list[dict[str, Any]]) -> list[int]:
    tokenizer = served.tokenizer
    inputs = template_inputs(messages, chat.tools, tokenizer)
    size = sum(len(m["content"]) for m in inputs["conversation"])
    if isinstance(tokenizer, RemoteTokenizer):  # the backend renders it with the model's template (vLLM)
        try:
            return await tokenizer.render(inputs["conversation"], inputs["tools"], chat.template_kwargs)
        except InvalidRequestError as exc:
            raise InvalidRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
    extra = {**chat.template_kwargs, "tools": inputs["tools"]}
    return await _maybe_in_thread(size, _apply_template, tokenizer, inputs["conversation"], extra)


async def _text_ids(served: Served, prompt: str | list[int]) -> list[int]:
    """A raw prompt's ids: the text tokenized, or the ids as given (prepare checks them)."""
    if isinstance(prompt, str):
        _check_chars(served, len(prompt), "prompt")
        if isinstance(served.tokenizer, RemoteTokenizer):
            try:
                return await served.tokenizer.encode(prompt)
            except InvalidRequestError as exc:
                raise InvalidRequest(f"the prompt could not be tokenized: {exc}", param="prompt") from None
        return await _maybe_in_thread(len(prompt), _encode, served.tokenizer, prompt)
    return prompt


def _stored(prompt: Chat | Text) -> str:
    """The prompt as the history keeps it (when it keeps text): the messages as JSON, the text, or the ids."""
    if isinstance(prompt, Chat):
        return msgspec.json.encode(prompt.messages).decode()
    return prompt.prompt if isinstance(prompt.prompt, str) else str(prompt.prompt)


def _check_chars(served: Served, chars: int, param: str) -> None:
    limit = served.info.max_model_len * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise ContextLengthExceeded(
            f"the prompt is {chars} characters: more than this model's context of {served.info.max_model_len} "
            f"tokens can hold (at most {MAX_CHARS_PER_TOKEN} characters a token, {limit} in all)",
            param=param,
        )


def _apply_template(tokenizer: Any, messages: list[dict[str, Any]], extra: dict[str, Any]) -> list[int]:
    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
        )
    except Exception as exc:  # the template is model data: any failure there is a refusal of the messages
        raise InvalidRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
    return list(ids)


def _encode(tokenizer: Any, prompt: str) -> list[int]:
    try:
        return list(tokenizer.encode(prompt))
    except Exception as exc:  # the tokenizer is model data too: a refusal there is a refusal of the prompt
        raise InvalidRequest(f"the prompt could not be tokenized: {exc}", param="prompt") from None


async def _maybe_in_thread(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size > THREAD_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
