"""Engine outputs in OpenAI's response shapes: chat.completion(.chunk), text_completion, logprobs, SSE frames."""

from __future__ import annotations

import hashlib

import msgspec

from engine import Logprob, ModelInfo
from web.errors import AppError, error_body
from web.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobsBody,
    Completion,
    CompletionChoice,
    CompletionLogprobsBody,
    Delta,
    PromptTokensDetails,
    TokenLogprobBody,
    TopLogprobBody,
    UsageBody,
    encoder,
)
from web.openai.tool_schemas import ToolCallBody

DONE = b"data: [DONE]\n\n"


def sse(payload: object) -> bytes:
    return b"data: " + encoder.encode(payload) + b"\n\n"


def sse_error(error: AppError) -> bytes:
    """A failure after the stream started: OpenAI's clients raise on an event carrying "error"."""
    return sse(error_body(error.message, error.type, error.param, error.code))


def usage_body(prompt: int, completion: int, cached: int = 0) -> UsageBody:
    return UsageBody(prompt, completion, prompt + completion, PromptTokensDetails(cached))


def system_fingerprint(info: ModelInfo | None) -> str | None:
    """OpenAI's name for "the backend configuration that served this": a short hash of the loaded model and the
    engine settings it runs with (dtype, quantization, KV pool, context), so a client sees when either changes."""
    if info is None:
        return None
    return "fp_" + hashlib.sha256(msgspec.json.encode(info)).hexdigest()[:12]


def finish_reason(reason: str | None) -> str | None:
    """OpenAI knows stop, length and tool_calls (web/openai/tools.py); an engine-side abort ends like a stop."""
    return None if reason is None else (reason if reason in ("length", "tool_calls") else "stop")


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "replace"))


def chat_logprobs(logprobs: list[Logprob] | None) -> ChatLogprobsBody | None:
    if logprobs is None:
        return None
    return ChatLogprobsBody(
        [
            TokenLogprobBody(
                lp.token,
                lp.logprob,
                _token_bytes(lp.token),
                [TopLogprobBody(text, value, _token_bytes(text)) for _, text, value in lp.top],
            )
            for lp in logprobs
        ]
    )


def completion_logprobs(logprobs: list[Logprob] | None, offset: int) -> CompletionLogprobsBody | None:
    if logprobs is None:
        return None
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobsBody(
        tokens=[lp.token for lp in logprobs],
        token_logprobs=[lp.logprob for lp in logprobs],
        top_logprobs=[{text: value for _, text, value in lp.top} for lp in logprobs],
        text_offset=offsets,
    )


def chat_choice(
    index: int, text: str | None, logprobs: list[Logprob] | None, reason: str | None,
    tool_calls: list[ToolCallBody] | None = None,
) -> ChatChoice:  # fmt: skip
    message = AssistantMessage("assistant", text, tool_calls)
    return ChatChoice(index, message, chat_logprobs(logprobs), finish_reason(reason))


def chat_completion(
    rid: str, created: int, model: str, choices: list[ChatChoice], usage: UsageBody, fingerprint: str | None
) -> ChatCompletion:
    return ChatCompletion(rid, created, model, choices, usage, system_fingerprint=fingerprint)


def chat_chunk(
    rid: str, created: int, model: str, delta: Delta, logprobs: list[Logprob] | None, reason: str | None,
    index: int = 0, fingerprint: str | None = None,
) -> ChatCompletionChunk:  # fmt: skip
    choice = ChatChunkChoice(index, delta, chat_logprobs(logprobs), finish_reason(reason))
    return ChatCompletionChunk(rid, created, model, [choice], system_fingerprint=fingerprint)


def chat_usage_chunk(
    rid: str, created: int, model: str, usage: UsageBody, fingerprint: str | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(rid, created, model, [], usage=usage, system_fingerprint=fingerprint)


def completion_choice(
    index: int, text: str, logprobs: CompletionLogprobsBody | None, reason: str | None
) -> CompletionChoice:
    return CompletionChoice(index, text, logprobs, finish_reason(reason))


def completion(
    rid: str, created: int, model: str, choices: list[CompletionChoice], usage: UsageBody | None,
    fingerprint: str | None = None,
) -> Completion:  # fmt: skip
    return Completion(rid, created, model, choices, usage=usage, system_fingerprint=fingerprint)
