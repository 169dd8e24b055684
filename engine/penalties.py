"""The knobs that reshape a row's logits before any sampling, greedy rows included, in vLLM's order: logit_bias
added, then repetition_penalty over prompt and output tokens (vLLM's and HF's: positive logits divided,
negative ones multiplied), then OpenAI's presence and frequency penalties over the tokens generated so far.

Batched: one tensor op per knob over the rows that set it, each row its own values; token counts come from a
scatter over the rows' padded token ids, built only for the rows that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from engine.sampling_params import SamplingParams


class TokenHistory(Protocol):
    """What the penalties read of a request (engine.request.Request has both)."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...


def adjusts_logits(p: SamplingParams) -> bool:
    """Whether the row leaves the sampler's plain path: a knob that can change even the argmax."""
    return bool(p.logit_bias) or _penalized(p)


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]) -> None:
    """In place on logits [R, V] (the caller's own copy), one row per params/histories entry. logit_bias ids are
    below V: the engine refuses larger ones at admission (EngineCore.add_request); a repeated id adds up."""
    biased = [(j, token, bias) for j, p in enumerate(params) for token, bias in p.logit_bias]
    if biased:
        rows, tokens, biases = zip(*biased, strict=True)
        index = (_tensor(rows, torch.long, logits.device), _tensor(tokens, torch.long, logits.device))
        logits.index_put_(index, _tensor(biases, logits.dtype, logits.device), accumulate=True)
    penalized = [j for j, p in enumerate(params) if _penalized(p)]
    if not penalized:
        return
    idx = _tensor(penalized, torch.long, logits.device)
    rows_params = [params[j] for j in penalized]
    x = logits[idx]
    vocab = x.shape[1]
    outputs = [histories[j].output_token_ids for j in penalized]
    counts = _token_counts(outputs, vocab, x.device, x.dtype)
    generated = counts > 0
    if any(p.repetition_penalty != 1.0 for p in rows_params):
        prompts = [histories[j].prompt_token_ids for j in penalized]
        seen = generated | (_token_counts(prompts, vocab, x.device, x.dtype) > 0)
        repetition = _column([p.repetition_penalty for p in rows_params], x)
        factor = torch.where(seen, repetition, 1.0)
        x = torch.where(x > 0, x / factor, x * factor)
    x = x - _column([p.frequency_penalty for p in rows_params], x) * counts
    x = x - _column([p.presence_penalty for p in rows_params], x) * generated
    logits[idx] = x


def _penalized(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _token_counts(seqs: Sequence[Sequence[int]], vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[len(seqs), vocab]: how often each token id occurs in each sequence. Ids are padded with `vocab`, an
    extra bin dropped after the scatter; numpy fills the padded array (torch.tensor over Python lists costs
    about six times as much per id)."""
    width = max((len(s) for s in seqs), default=0)
    padded = np.full((len(seqs), width), vocab, dtype=np.int64)
    for j, s in enumerate(seqs):
        padded[j, : len(s)] = s
    ids = torch.from_numpy(padded).to(device)
    counts = torch.zeros(len(seqs), vocab + 1, dtype=dtype, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=dtype, device=device))
    return counts[:, :vocab]


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return _tensor(values, like.dtype, like.device).unsqueeze(1)


def _tensor(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
