"""Turns a step's logits into next tokens: logit_bias and penalties (engine.sample.penalties), greedy, temperature,
min_p, top-k, top-p (vLLM's order), per-request seeds, logprobs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sample.penalties import TokenHistory, adjusts_logits, apply_penalties
from engine.sampling_params import SamplingParams

# The draw searches the cumulative mass of blocks of this many tokens, then within the one block it lands in.
DRAW_BLOCK = 256
LOG2E = math.log2(math.e)


@dataclass(slots=True)
class TopLogprobs:
    """The sampled token's logprob and the top-N alternatives (ids and logprobs), from the raw model logits."""

    token_logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TopLogprobs | None]


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[TokenHistory] | None = None,
) -> SampleResult:
    """logits [N, V]; params, generators and histories (the rows' token ids: needed once a row sets logit_bias
    or a penalty) one per row. A row with a generator draws only from it, so a seeded request samples the same tokens
    whatever else shares its batch. Logprobs come from the raw model logits, before any knob (as vLLM's
    default): they say what the model thought, not what the knobs made of it."""
    logits = logits.float()
    n = logits.shape[0]
    token_ids = torch.empty(n, dtype=torch.long, device=logits.device)
    # Greedy rows without knobs: argmax over the raw logits, no extra tensor. Over every row, then picked: a
    # row's argmax costs less than copying the row out.
    plain = [i for i, p in enumerate(params) if p.greedy and not adjusts_logits(p)]
    if plain:
        idx = _index(plain, n, logits.device)
        token_ids[idx] = _argmax(logits)[idx]
    rest = [i for i, p in enumerate(params) if not p.greedy or adjusts_logits(p)]
    if rest:
        rows = _adjusted(logits, rest, params, histories)
        greedy = [j for j, i in enumerate(rest) if params[i].greedy]
        if greedy:
            picked = _argmax(rows[_index(greedy, len(rest), logits.device)])
            token_ids[torch.tensor([rest[j] for j in greedy], device=logits.device)] = picked
        random = [j for j, i in enumerate(rest) if not params[i].greedy]
        if random:
            weights = _weights(rows[_index(random, len(rest), logits.device)], [params[rest[j]] for j in random])
            _draw(weights, [rest[j] for j in random], generators, token_ids)
    ids = token_ids.tolist()
    return SampleResult(ids, _logprobs(logits, params, ids))


def _adjusted(
    logits: torch.Tensor,
    rest: list[int],
    params: Sequence[SamplingParams],
    histories: Sequence[TokenHistory] | None,
) -> torch.Tensor:
    """logits' rows `rest`, with logit_bias and the penalties applied to the rows that set them; never writes
    into logits, the model's own tensor (a fp32 model's logits are not copied by .float())."""
    knobbed = [i for i in rest if adjusts_logits(params[i])]
    if not knobbed:
        return logits[_index(rest, logits.shape[0], logits.device)]
    if histories is None:
        raise ValueError("logit_bias and penalties need the rows' token histories")
    changed = logits[torch.tensor(knobbed, device=logits.device)]  # a copy: indexing with a tensor
    apply_penalties(changed, [params[i] for i in knobbed], [histories[i] for i in knobbed])
    if len(knobbed) == len(rest):
        return changed
    rows = logits.index_select(0, torch.tensor(rest, device=logits.device))  # a copy, even of every row
    at = [j for j, i in enumerate(rest) if adjusts_logits(params[i])]
    rows[torch.tensor(at, device=logits.device)] = changed
    return rows


def _draw(
    weights: torch.Tensor,
    row_ids: list[int],
    generators: Sequence[torch.Generator | None],
    token_ids: torch.Tensor,
) -> None:
    """One inverse-CDF draw per row of weights (probabilities up to a factor) into token_ids[row_ids[j]], from one
    uniform number per row: a seeded row's from its own generator, the others' from torch's.

    torch.multinomial took 160 ms for 64 rows of 49,152 on one CPU core, as long as the model's step; a cumulative
    sum over the whole row, which torch does not vectorize, still took 7 ms of a 32 ms draw at 128 rows. So the
    search is in two levels: the cumulative mass of blocks of DRAW_BLOCK tokens (a vectorized sum), then the
    cumulative sum of the one block the target falls in."""
    device = weights.device
    rows, vocab = weights.shape
    u = torch.rand(rows, device=device)
    for j, i in enumerate(row_ids):
        gen = generators[i]
        if gen is not None:
            u[j] = torch.rand((), generator=gen, device=gen.device).to(device)
    full = vocab // DRAW_BLOCK * DRAW_BLOCK
    sums = weights[:, :full].reshape(rows, -1, DRAW_BLOCK).sum(dim=-1)
    if full < vocab:
        sums = torch.cat([sums, weights[:, full:].sum(dim=-1, keepdim=True)], dim=1)
    cdf = sums.cumsum(dim=-1)
    target = u * cdf[:, -1]
    # The first block whose cumulative mass exceeds the target, then the first token in it that does.
    block = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)
    before = torch.cat([cdf.new_zeros(rows, 1), cdf], dim=1).gather(1, block.unsqueeze(1)).squeeze(1)
    ids = block.unsqueeze(1) * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=device)
    inside = weights.gather(1, ids.clamp(max=vocab - 1)).masked_fill_(ids >= vocab, 0.0)
    offset = torch.searchsorted(inside.cumsum(dim=-1), (target - before).unsqueeze(1), right=True).squeeze(1)
    drawn = (block * DRAW_BLOCK + offset.clamp_(max=DRAW_BLOCK - 1)).clamp_(max=vocab - 1)
    # A token of zero mass is never drawn: where rounding put the target past the last token with mass, the
    # likeliest is taken instead.
    lost = weights.gather(1, drawn.unsqueeze(1)).squeeze(1) == 0
    if lost.any():
        drawn = torch.where(lost, weights.argmax(dim=-1), drawn)
    token_ids[torch.tensor(row_ids, device=device)] = drawn


def _argmax(rows: torch.Tensor) -> torch.Tensor:
    """Per-row argmax (first index among ties, as torch's). On CPU torch's argmax does not vectorize: 2.7 ms
    against numpy's 0.3 ms over [100, 49152] fp32 logits on one core, a sixth of a tiny model's step."""
    if rows.device.type == "cpu":
        return torch.from_numpy(np.argmax(rows.numpy(), axis=-1))
    return rows.argmax(dim=-1)


def _index(rows: list[int], n: int, device: torch.device) -> slice | torch.Tensor:
    if len(rows) == n:
        return slice(None)
    return torch.tensor(rows, device=device)


def _weights(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's probabilities up to a factor, exp(logit / temperature - the row's top), after min_p, top-k and
    top-p; no softmax: the draw needs no normalised row, and softmax's division is one more pass over it."""
    temps = torch.tensor([p.temperature for p in params], device=logits.device).unsqueeze(1)
    logits = logits / temps  # this function's own tensor from here on
    min_p_rows = [j for j, p in enumerate(params) if p.min_p > 0.0]
    if min_p_rows:
        # vLLM's min_p, after temperature and before top-k/top-p: drop tokens less likely than min_p times the
        # likeliest one, that is with a logit below the top logit + log(min_p) (no softmax needed), and only in
        # the rows that ask (logits is this function's own tensor here).
        idx = _index(min_p_rows, len(params), logits.device)
        rows = logits[idx]
        log_min_p = torch.tensor([math.log(params[j].min_p) for j in min_p_rows], device=logits.device)
        floor = rows.amax(dim=-1, keepdim=True) + log_min_p.unsqueeze(1)
        logits[idx] = rows.masked_fill(rows < floor, float("-inf"))
    top_ks = [p.top_k for p in params]
    if any(k > 0 for k in top_ks):
        vocab = logits.shape[1]
        ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=logits.device)
        sorted_logits = logits.sort(dim=-1, descending=True).values
        kth = sorted_logits.gather(1, (ks - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_ps = [p.top_p for p in params]
    if any(p < 1.0 for p in top_ps):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        ps = torch.tensor(top_ps, device=logits.device).unsqueeze(1)
        # Drop a token when the tokens before it already reach top_p; the first token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= ps
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    # 2^((x - top) log2 e), not e^(x - top): torch's exp2 is the cheaper kernel on a CPU (over [16, 49152] here,
    # 0.25 ms against exp's 0.85 ms), the scaling one more pass at memory speed.
    return logits.sub_(logits.amax(dim=-1, keepdim=True)).mul_(LOG2E).exp2_()


def _logprobs(logits: torch.Tensor, params: Sequence[SamplingParams], ids: list[int]) -> list[TopLogprobs | None]:
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[TopLogprobs | None] = [None] * len(params)
    if not wanted:
        return out
    logp = logits[torch.tensor(wanted, device=logits.device)].log_softmax(dim=-1)
    for j, i in enumerate(wanted):
        n_top = params[i].logprobs or 0
        top = logp[j].topk(n_top) if n_top else None
        out[i] = TopLogprobs(
            token_logprob=float(logp[j, ids[i]]),
            top_ids=top.indices.tolist() if top is not None else [],
            top_logprobs=top.values.tolist() if top is not None else [],
        )
    return out
