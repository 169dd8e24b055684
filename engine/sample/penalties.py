"""The knobs that reshape a row's logits before any sampling, greedy rows included, in vLLM's order: logit_bias
added, then repetition_penalty over prompt and output tokens (vLLM's and HF's: positive logits divided,
negative ones multiplied), then OpenAI's presence and frequency penalties over the tokens generated so far.

Batched: one tensor op per knob over the rows that set it, each row its own values. Generated-token counts come
from a scatter over the rows' padded token ids, built only for the rows that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from engine.sampling_params import SamplingParams


class TokenHistory(Protocol):
    """What the penalties read of a request (engine.sched.request.Request has both)."""

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
    # A row with no tokens yet has nothing to penalize.
    penalized = [j for j, p in enumerate(params) if _penalized(p) and _length(histories[j])]
    if penalized:
        _penalize(logits, [params[j] for j in penalized], [histories[j] for j in penalized], penalized)


def _penalize(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[TokenHistory], rows: list[int]
) -> None:
    """Penalties touch only the tokens a row has seen, so they are computed at those ids alone (gathered and
    scattered back) rather than over [rows, V]: a few hundred ids against a vocabulary of 49,152 or more."""
    device, vocab = logits.device, logits.shape[1]
    ids, generated = _padded_ids(histories, vocab)
    ids_t = torch.from_numpy(ids).to(device)
    # How often each id was generated: [rows, V + 1], the last bin taking the padding.
    counts = torch.zeros(len(rows), vocab + 1, dtype=logits.dtype, device=device)
    counts.scatter_add_(1, ids_t, torch.from_numpy(generated).to(device=device, dtype=logits.dtype))
    # Padding repeats the row's first id: it computes that id's value again, so the scatter writes it twice alike.
    ids_t = torch.where(ids_t == vocab, ids_t[:, :1], ids_t)
    row_idx = torch.tensor(rows, device=device).unsqueeze(1)
    values = logits[row_idx, ids_t]
    count = counts.gather(1, ids_t)
    repetition = _column([p.repetition_penalty for p in params], values)
    values = torch.where(values > 0, values / repetition, values * repetition)
    values = values - _column([p.frequency_penalty for p in params], values) * count
    values = values - _column([p.presence_penalty for p in params], values) * (count > 0)
    logits[row_idx, ids_t] = values


def _padded_ids(histories: Sequence[TokenHistory], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's prompt then output ids, padded with `vocab`, and a 0/1 mark of the output positions. numpy
    fills them: torch.tensor over Python lists costs about six times as much per id."""
    width = max(_length(h) for h in histories)
    ids = np.full((len(histories), width), vocab, dtype=np.int64)
    generated = np.zeros((len(histories), width), dtype=np.float32)
    for j, h in enumerate(histories):
        n_prompt, n_output = len(h.prompt_token_ids), len(h.output_token_ids)
        ids[j, :n_prompt] = h.prompt_token_ids
        ids[j, n_prompt : n_prompt + n_output] = h.output_token_ids
        generated[j, n_prompt : n_prompt + n_output] = 1.0
    return ids, generated


def _length(h: TokenHistory) -> int:
    return len(h.prompt_token_ids) + len(h.output_token_ids)


def _penalized(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return _tensor(values, like.dtype, like.device).unsqueeze(1)


def _tensor(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
