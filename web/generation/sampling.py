"""The sampling fields every dialect decodes into one typed value (Sampling), and the checks of a guided-decoding
constraint; max_tokens is not among them: the key's policy sets it (web/generation/policy.py)."""

from __future__ import annotations

import asyncio

import msgspec

from engine import GuidedDecoding, InvalidRequestError, SamplingParams, validate_guided
from web.errors import InvalidRequest
from web.tools import ToolPlan


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """A request's sampling in engine terms, as its dialect decoded it; the defaults are the engine's. The engine's
    own limits on these fields are checked when they become SamplingParams (Prompts.prepare)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias): Prompts checks the ids against the vocabulary
    guided: GuidedDecoding | None = None

    def params(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams (raises its InvalidRequestError for a field beyond the engine's limits)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
            guided=self.guided,
        )


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


async def check_guided(guided: GuidedDecoding | None, param: str = "response_format") -> None:
    """The engine's check of a constraint, before admission, off the event loop: its first use imports
    xgrammar (and torch), and a large schema takes a while to parse. A refusal names `param`, the body's field."""
    if guided is None:
        return
    try:
        await asyncio.to_thread(validate_guided, guided)
    except RecursionError:  # msgspec took the nesting; a parser below it may not
        raise InvalidRequest("the JSON schema is nested too deeply", param=param) from None
    except InvalidRequestError as exc:
        raise InvalidRequest(str(exc), param=param) from None
