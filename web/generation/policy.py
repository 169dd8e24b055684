"""A key's policy applied to a request: the max_tokens it runs with (within the key's cap; the server default
shortened to what the context leaves), and the one prepared value admission and the engine take."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine import ContextLengthError, ModelInfo, SamplingParams, Tenant
from web.errors import ContextLengthExceeded, InvalidRequest
from web.keys.service import KeyInfo
from web.tools import NO_TOOLS, ToolPlan


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
    requested: int | None, key: KeyInfo, default: int, prompt_tokens: int, info: ModelInfo, prompt_field: str
) -> int:
    """What the request asked, within its key's cap; without an ask the key's cap or the server default, shortened
    to what the context leaves. Whether prompt + max_tokens fits is the engine's check (ModelInfo.check_fits);
    `prompt_field` names the body's prompt when the prompt alone is too long."""
    cap = key.max_tokens_per_request
    if requested is None:
        chosen = min(cap if cap is not None else default, max(info.max_model_len - prompt_tokens, 1))
    elif cap is not None and requested > cap:
        raise InvalidRequest(
            f"max_tokens {requested} is above this API key's limit of {cap} tokens per request", param="max_tokens"
        )
    else:
        chosen = requested
    try:
        info.check_fits(prompt_tokens, chosen)
    except ContextLengthError as exc:
        param = prompt_field if exc.prompt_too_long else exc.param
        raise ContextLengthExceeded(str(exc), param=param) from None
    return chosen
