"""Paged attention: writes each step's new K/V into the block pool and attends over every request's blocks.

The plain-torch reference implementation below runs on CPU and CUDA. It is registered with transformers'
attention interface under ATTENTION_NAME, so the model definition stays transformers' own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTENTION_NAME = "appliance_paged"


@dataclass(slots=True)
class PrefillSeq:
    """One request computing several tokens this step: its token range in the flat batch and its context."""

    start: int
    num_tokens: int
    context_slots: torch.Tensor | None  # pool slots of the whole context; None when nothing was computed before
    mask: torch.Tensor | None  # [num_tokens, context_len] causal mask with offset; None with context_slots


@dataclass(slots=True)
class AttentionMetadata:
    """Built once per step by the runner and shared by every layer.

    The flat batch holds the decode tokens first (one per request, positions [0, num_decodes)), then the
    prefill chunks in order.
    """

    slot_mapping: torch.Tensor  # [T] pool slot that receives each token's K/V
    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    num_decodes: int = 0
    decode_slots: torch.Tensor | None = None  # [num_decodes, max_context] pool slots, padded
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_context] True where a key is real
    prefills: list[PrefillSeq] = field(default_factory=list)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, KVH, T, D] (RoPE applied) -> output [1, T, H, D]."""
    meta = kwargs.get("paged")
    if not isinstance(meta, AttentionMetadata):
        raise RuntimeError("paged attention needs the step's AttentionMetadata passed as paged=")
    layer: int = module.layer_idx  # type: ignore[assignment]
    k_cache, v_cache = meta.key_cache[layer], meta.value_cache[layer]
    new_k = key[0].transpose(0, 1)  # [T, KVH, D]
    new_v = value[0].transpose(0, 1)
    k_cache.index_copy_(0, meta.slot_mapping, new_k.to(k_cache.dtype))
    v_cache.index_copy_(0, meta.slot_mapping, new_v.to(v_cache.dtype))

    q = query[0]  # [H, T, D]
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # [T, H, D]
    nd = meta.num_decodes
    if nd:
        assert meta.decode_slots is not None and meta.decode_mask is not None
        qd = q[:, :nd].transpose(0, 1).unsqueeze(2)  # [B, H, 1, D]
        kd = k_cache[meta.decode_slots].transpose(1, 2)  # [B, KVH, L, D]
        vd = v_cache[meta.decode_slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(
            qd, kd.to(q.dtype), vd.to(q.dtype), attn_mask=meta.decode_mask, scale=scaling, enable_gqa=True
        )
        out[:nd] = od[:, :, 0]
    for p in meta.prefills:
        qp = q[:, p.start : p.start + p.num_tokens].unsqueeze(0)  # [1, H, n, D]
        if p.context_slots is None:
            kp = key[:, :, p.start : p.start + p.num_tokens]
            vp = value[:, :, p.start : p.start + p.num_tokens]
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scaling, enable_gqa=True)
        else:
            kp = k_cache[p.context_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            vp = v_cache[p.context_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, scale=scaling, enable_gqa=True)
        out[p.start : p.start + p.num_tokens] = op[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, paged_attention)
