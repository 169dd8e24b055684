"""The request checks made once, in one place: a prompt's ids and logit_bias within the vocabulary
(check_prompt), and whether a prompt plus max_tokens can ever run on this model and KV pool (check_fits). The
engine applies them to every request it queues; servers call them (directly, or through ModelInfo) before they
commit anything to a request, so a refusal costs nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.errors import ContextLengthError, InvalidRequestError


def check_prompt(prompt_token_ids: Sequence[int], logit_bias_ids: Iterable[int], vocab_size: int) -> None:
    """Raise InvalidRequestError for an empty prompt, or a prompt or logit_bias id outside 0..vocab_size-1 (the
    sampler indexes the logits with them: refused before, no request can crash a step)."""
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty", "prompt")
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", "prompt")
    bad = next((t for t in logit_bias_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"logit_bias token id {bad} is outside the vocabulary (0..{vocab_size - 1})", "logit_bias"
        )


def room(num_prompt_tokens: int, max_model_len: int, kv_capacity_tokens: int) -> int:
    """The most completion tokens that can follow the prompt (check_fits passes for any max_tokens from 1 to
    this); below 1 where the prompt alone leaves no room."""
    return min(max_model_len - num_prompt_tokens, kv_capacity_tokens + 1 - num_prompt_tokens)


def check_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int, kv_capacity_tokens: int) -> None:
    """Raise ContextLengthError; its `prompt_too_long` says whether the prompt alone leaves no room."""
    if num_prompt_tokens >= max_model_len:
        raise ContextLengthError(
            f"the prompt has {num_prompt_tokens} tokens; this model's context is {max_model_len} tokens, "
            "which leaves no room for a completion",
            "max_tokens",
            prompt_too_long=True,
        )
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; the request has {num_prompt_tokens} "
            f"prompt tokens and asks for {max_tokens} completion tokens ({total} in total)",
            "max_tokens",
        )
    if total - 1 > kv_capacity_tokens:  # the last sampled token is never written to the cache
        raise ContextLengthError(
            f"prompt plus max_tokens is {total} tokens, more than the whole KV cache holds ({kv_capacity_tokens})",
            "max_tokens",
        )
