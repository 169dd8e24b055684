"""Engine outputs in OpenAI's response shapes: chat.completion(.chunk), text_completion, logprobs, SSE frames."""

from __future__ import annotations

from engine import Logprob
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
    TokenLogprobBody,
    TopLogprobBody,
    UsageBody,
    encoder,
)

DONE = b"data: [DONE]\n\n"


def sse(payload: object) -> bytes:
    return b"data: " + encoder.encode(payload) + b"\n\n"


def sse_error(error: AppError) -> bytes:
    """A failure after the stream started: OpenAI's clients raise on an event carrying "error"."""
    return sse(error_body(error.message, error.type, error.param, error.code))


def usage_body(prompt: int, completion: int) -> UsageBody:
    return UsageBody(prompt, completion, prompt + completion)


def finish_reason(reason: str | None) -> str | None:
    """OpenAI knows stop and length; an engine-side abort ends like a stop for the client."""
    return None if reason is None else ("length" if reason == "length" else "stop")


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


def chat_completion(
    rid: str, created: int, model: str, text: str, logprobs: list[Logprob] | None, reason: str | None,
    usage: UsageBody,
) -> ChatCompletion:  # fmt: skip
    choice = ChatChoice(0, AssistantMessage("assistant", text), chat_logprobs(logprobs), finish_reason(reason))
    return ChatCompletion(rid, created, model, [choice], usage)


def chat_chunk(
    rid: str, created: int, model: str, delta: Delta, logprobs: list[Logprob] | None, reason: str | None
) -> ChatCompletionChunk:
    choice = ChatChunkChoice(0, delta, chat_logprobs(logprobs), finish_reason(reason))
    return ChatCompletionChunk(rid, created, model, [choice])


def chat_usage_chunk(rid: str, created: int, model: str, usage: UsageBody) -> ChatCompletionChunk:
    return ChatCompletionChunk(rid, created, model, [], usage=usage)


def completion(
    rid: str, created: int, model: str, text: str, logprobs: CompletionLogprobsBody | None, reason: str | None,
    usage: UsageBody | None,
) -> Completion:  # fmt: skip
    return Completion(rid, created, model, [CompletionChoice(0, text, logprobs, finish_reason(reason))], usage=usage)
