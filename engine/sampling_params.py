"""How one request samples and when it stops; a msgspec struct so it crosses the process boundary as is."""

from __future__ import annotations

import msgspec

from engine.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LOGPROBS = 20
# Integers cross to the engine process as msgpack (int64/uint64). A seed is what torch's manual_seed takes;
# top_k above the vocabulary means "no cut" (the sampler clamps it), so int64 is its only bound.
INT64_MAX = 2**63 - 1
SEED_RANGE = (-(2**63), 2**64 - 1)


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
