"""How one request samples and when it stops; a msgspec struct so it crosses the process boundary as is."""

from __future__ import annotations

from typing import Literal

import msgspec

from engine.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LOGPROBS = 20
# Integers cross to the engine process as msgpack (int64/uint64). A seed is what torch's manual_seed takes;
# top_k above the vocabulary means "no cut" (the sampler clamps it), so int64 is its only bound.
INT64_MAX = 2**63 - 1
SEED_RANGE = (-(2**63), 2**64 - 1)
MAX_LOGIT_BIAS = 300  # entries, as OpenAI's API allows
MAX_REPETITION_PENALTY = 10.0  # vLLM takes any positive value; past this every seen token is all but banned


class GuidedDecoding(msgspec.Struct, frozen=True, kw_only=True):
    """A constraint on the output, enforced token by token: `json_object` (any JSON object) or `json_schema`
    (`schema` is the JSON Schema as JSON text: a string key for the compiled-grammar cache)."""

    kind: Literal["json_object", "json_schema"]
    schema: str = ""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """temperature 0 means greedy; top_k 0 means no top-k cut; logprobs None means none returned."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's: over prompt and output tokens, divides positive logits
    presence_penalty: float = 0.0  # OpenAI's: over the tokens generated so far
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    guided: GuidedDecoding | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not 1 <= self.max_tokens <= INT64_MAX:
            raise InvalidRequestError(
                f"max_tokens must be between 1 and {INT64_MAX}, not {self.max_tokens}", "max_tokens"
            )
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(f"temperature must be between 0 and 2, not {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], not {self.top_p}", "top_p")
        if not 0 <= self.top_k <= INT64_MAX:
            raise InvalidRequestError(f"top_k must be 0 (off) or positive up to {INT64_MAX}, not {self.top_k}", "top_k")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise InvalidRequestError(f"seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}", "seed")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings are allowed", "stop")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_STRING_CHARS:
                raise InvalidRequestError(f"each stop string must have 1 to {MAX_STOP_STRING_CHARS} characters", "stop")
        if any(not 0 <= t <= INT64_MAX for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative token ids", "stop_token_ids")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be between 0 and 1, not {self.min_p}", "min_p")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise InvalidRequestError(
                f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}], not {self.repetition_penalty}",
                "repetition_penalty",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be between -2 and 2, not {value}", name)
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
        for token, bias in self.logit_bias:
            if not 0 <= token <= INT64_MAX or not -100.0 <= bias <= 100.0:
                raise InvalidRequestError("logit_bias maps token ids to biases between -100 and 100", "logit_bias")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or top_k 1: the likeliest token, the first of tied ones (a top-k of 1 would keep every
        token tied with the likeliest and draw among them)."""
        return self.temperature == 0.0 or self.top_k == 1
