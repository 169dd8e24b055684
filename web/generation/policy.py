"""A key's policy applied to a request: the max_tokens it runs with (within the key's cap and what the context
leaves: trimmed, or refused where the operator wants it strict), and the one prepared value admission and the engine
take."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine import ContextLengthError, ModelInfo, SamplingParams, Tenant
from web.errors import ContextLengthExceeded, InvalidRequest
from web.history.record import RequestLog
from web.keys.info import KeyInfo
from web.tools import NO_TOOLS, ToolPlan

TRIMMED_HEADER = "x-max-tokens-trimmed-to"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request in engine terms: prompt ids and sampling, max_tokens already the effective one."""

    prompt_ids: list[int]
    params: SamplingParams
    requested_max_tokens: int | None  # as asked (the history row keeps it), None when the body had none
    prompt_text: str | None = None
    tenant: Tenant | None = None  # whose share it draws on, set at admission; None: the engine's default
    n: int = 1  # choices: n engine requests on the same prompt ids
    tools: ToolPlan = NO_TOOLS  # how the answer's tool calls are read (web/tools)
    model: str = ""  # the served name asked for: the router sends the request to a backend that serves it

    def choices(self) -> list[SamplingParams]:
        """Each choice's sampling: the request's, seeded seed, seed + 1, ... when seeded (so that seeded choices
        differ and repeat); a seed pushed past the engine's range raises its InvalidRequestError."""
        seed = self.params.seed
        if self.n == 1 or seed is None:
            return [self.params] * self.n
        return [msgspec.structs.replace(self.params, seed=seed + i) for i in range(self.n)]


def effective_max_tokens(
    requested: int | None,
    key: KeyInfo,
    default: int,
    prompt_tokens: int,
    info: ModelInfo,
    prompt_field: str,
    trim: bool = True,
) -> int:
    """The one decision on a request's max_tokens. The prompt alone must leave room (else a 400 naming
    `prompt_field`). Without an ask: the key's cap or the server default, within that room. An ask above the key's
    cap or the room is trimmed to what fits (the request then ends with finish_reason "length"; the answer's
    x-max-tokens-trimmed-to says so), or, with `trim` off, refused as before (400)."""
    try:
        info.check_fits(prompt_tokens, 1)
    except ContextLengthError as exc:
        raise ContextLengthExceeded(str(exc), param=prompt_field) from None
    cap = key.max_tokens_per_request
    room = info.room(prompt_tokens)
    if requested is None:
        return min(cap if cap is not None else default, room)
    if trim:
        return min(requested, room, cap if cap is not None else requested)
    if cap is not None and requested > cap:
        raise InvalidRequest(
            f"max_tokens {requested} is above this API key's limit of {cap} tokens per request", param="max_tokens"
        )
    try:
        info.check_fits(prompt_tokens, requested)
    except ContextLengthError as exc:
        raise ContextLengthExceeded(str(exc), param=exc.param) from None
    return requested


def trimmed_to(log: RequestLog) -> dict[str, str]:
    """The header of an answer whose max_tokens runs below what was asked (the key's cap, the context's room, or
    the quota left cut it): what it runs with."""
    asked, applied = log.max_tokens_requested, log.max_tokens_applied
    if asked is None or applied is None or applied >= asked:
        return {}
    return {TRIMMED_HEADER: str(applied)}
