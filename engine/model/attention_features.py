"""A layer's attention features beyond plain causal softmax, as transformers passes them to an attention function:
a sliding window, logit soft-capping and attention sinks; and the torch arithmetic each path uses for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# The keyword arguments transformers 5.24 passes to an attention function that the engine either implements
# (the three features) or that change nothing in attention (use_cache, router outputs, the positions already
# applied by rotary embedding). engine.model.fidelity refuses a model that passes anything else.
FEATURE_KWARGS = ("sliding_window", "softcap", "s_aux")
INERT_KWARGS = ("position_ids", "use_cache", "output_router_logits", "cache_position", "output_attentions", "paged")


@dataclass(frozen=True, slots=True)
class LayerFeatures:
    """window: a query attends to the last `window` positions, itself included (transformers' sliding window:
    key k is seen from query q when q - window < k <= q). softcap: scores become softcap * tanh(score / softcap)
    before the mask. sinks: one logit per query head that joins each softmax's denominator and adds no value."""

    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [heads]

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, object]) -> LayerFeatures:
        window, softcap, sinks = (kwargs.get(name) for name in FEATURE_KWARGS)
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"sliding_window must be a positive integer or None, not {window!r}")
        if softcap is not None and (not isinstance(softcap, int | float) or softcap <= 0):
            raise ValueError(f"softcap must be a positive number or None, not {softcap!r}")
        if sinks is not None and not isinstance(sinks, torch.Tensor):
            raise ValueError(f"s_aux (attention sinks) must be a tensor or None, not {type(sinks).__name__}")
        if window is None and softcap is None and sinks is None:
            return PLAIN
        return cls(window, None if softcap is None else float(softcap), sinks)


PLAIN = LayerFeatures()


def causal_mask(first: int, num_queries: int, context: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[num_queries, context] bool: queries at positions first.. see keys 0..context-1 causally, within window."""
    keys = torch.arange(context, device=device).unsqueeze(0)
    queries = torch.arange(first, first + num_queries, device=device).unsqueeze(1)
    seen = keys <= queries
    if window is not None:
        seen &= keys > queries - window
    return seen


def scores_to_probs(
    scores: torch.Tensor, softcap: float | None, sinks: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """fp32 scores (already scaled) [..., keys] -> softmax weights, in transformers' eager order: soft-capped,
    then the bias (0 or -inf) added, then the sinks (shaped to broadcast to [..., 1]) in the denominator."""
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    if sinks is None:
        return scores.softmax(dim=-1)
    sink = sinks.float().expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, features: LayerFeatures
) -> torch.Tensor:
    """q [1, H, n, D], k/v [1, KVH, L, D], mask [n, L] bool or None (causal, n == L) -> [1, H, n, D]. SDPA
    where it computes the layer (no soft-cap, no sinks), else the same arithmetic spelled out."""
    if features.softcap is None and features.sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
    if mask is None:
        mask = causal_mask(0, q.shape[2], k.shape[2], None, q.device)
    heads, kv_heads = q.shape[1], k.shape[1]
    qg = q[0].view(kv_heads, heads // kv_heads, q.shape[2], q.shape[3])  # query head h reads KV head h // group
    scores = torch.matmul(qg, k[0].unsqueeze(1).transpose(-1, -2)).float() * scale
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=q.device).masked_fill_(~mask, float("-inf"))
    sinks = features.sinks.view(kv_heads, heads // kv_heads, 1, 1) if features.sinks is not None else None
    probs = scores_to_probs(scores, features.softcap, sinks, bias)
    out = torch.matmul(probs.to(v.dtype), v[0].unsqueeze(1))  # [KVH, group, n, D]
    return out.reshape(1, heads, q.shape[2], q.shape[3]).to(q.dtype)
