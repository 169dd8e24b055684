"""Offline API for scripts and tests: LLM(EngineConfig(...)).generate(prompts, params) runs to completion."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.errors import InvalidRequestError
from engine.messages import Logprob, RequestOutput, Timings, Usage
from engine.model.loader import LoadedModel
from engine.sample.prompts import chat_ids, prompt_ids
from engine.sampling_params import SamplingParams
from engine.sched.tenant import Tenant

Prompt = str | Sequence[int]


@dataclass(slots=True)
class CompletionResult:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[Logprob] = field(default_factory=list)
    usage: Usage | None = None
    timings: Timings | None = None


class LLM:
    def __init__(
        self,
        config: EngineConfig | None = None,
        progress: Callable[[str], None] | None = None,
        loaded: LoadedModel | None = None,
    ) -> None:
        """loaded: weights already loaded (with config's quantization and dtype), to compare engines on one copy."""
        self.core = EngineCore(config or EngineConfig(), progress, loaded)
        self.tokenizer = self.core.tokenizer
        self._next_id = 0

    def encode(self, prompt: Prompt) -> list[int]:
        """A text prompt's ids as the served API makes them (its BOS included); token ids as given."""
        if isinstance(prompt, str):
            return prompt_ids(self.tokenizer, prompt)
        return list(prompt)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation rendered through the model's chat template, ready for the reply."""
        return chat_ids(self.tokenizer, messages)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        on_step: Callable[[list[RequestOutput]], None] | None = None,
        tenant: Tenant | None = None,
    ) -> list[CompletionResult]:
        """Generate for every prompt (strings or token-id lists), params one for all or one per prompt, all on
        behalf of tenant (None: the anonymous default tenant). Results come back in prompt order."""
        prompt_list = _prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            param_list = [params or SamplingParams()] * len(prompt_list)
        else:
            param_list = list(params)
        if len(param_list) != len(prompt_list):
            raise ValueError(f"{len(param_list)} sampling params for {len(prompt_list)} prompts")
        results: dict[str, CompletionResult] = {}
        for prompt, p in zip(prompt_list, param_list, strict=True):
            rid = f"offline-{self._next_id}"
            self._next_id += 1
            ids = self.encode(prompt)
            results[rid] = CompletionResult(rid, ids)
            self.core.add_request(rid, ids, p, tenant=tenant)
        while self.core.has_work():
            outputs = self.core.step()
            rejected = self.core.take_rejected()
            if rejected:  # a grammar failed to compile: refused as add_request refuses a bad request
                self.core.abort(list(results))
                raise InvalidRequestError(rejected[0].message, rejected[0].param)
            if on_step is not None:
                on_step(outputs)
            for out in outputs:
                collect(results[out.request_id], out)
        return list(results.values())


def collect(result: CompletionResult, out: RequestOutput) -> None:
    """Accumulate one delta into a result."""
    result.token_ids.extend(out.token_ids)
    result.text += out.text
    if out.logprobs:
        result.logprobs.extend(out.logprobs)
    if out.finished:
        result.finish_reason = out.finish_reason
        result.usage = out.usage
        result.timings = out.timings


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (a string or a token-id list) or a sequence of them, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(p, int) for p in items):
        return [[int(p) for p in items]]  # type: ignore[arg-type]
    return items  # type: ignore[return-value]
