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
    key_cache: list[torch.Tensor]  # per layer [kv_heads, num_slots, head_dim]
    value_cache: list[torch.Tensor]
    block_size: int = 16
    num_decodes: int = 0
    decode_blocks: torch.Tensor | None = None  # [num_decodes * max_blocks] block ids, each row padded
    decode_bias: torch.Tensor | None = None  # [1, num_decodes, 1, max_blocks * block_size] fp32: 0 or -inf
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
    k_cache.index_copy_(1, meta.slot_mapping, key[0].to(k_cache.dtype))
    v_cache.index_copy_(1, meta.slot_mapping, value[0].to(v_cache.dtype))

    q = query[0]  # [H, T, D]
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # [T, H, D]
    if meta.num_decodes:
        out[: meta.num_decodes] = _decode_attention(q[:, : meta.num_decodes], k_cache, v_cache, meta, scaling)
    for p in meta.prefills:
        qp = q[:, p.start : p.start + p.num_tokens].unsqueeze(0)  # [1, H, n, D]
        if p.context_slots is None:
            kp = key[:, :, p.start : p.start + p.num_tokens]
            vp = value[:, :, p.start : p.start + p.num_tokens]
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scaling, enable_gqa=True)
        else:
            kp = k_cache[:, p.context_slots].unsqueeze(0).to(q.dtype)
            vp = v_cache[:, p.context_slots].unsqueeze(0).to(q.dtype)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, scale=scaling, enable_gqa=True)
        out[p.start : p.start + p.num_tokens] = op[0].transpose(0, 1)
    return out.unsqueeze(0), None


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scaling: float | None
) -> torch.Tensor:
    """q [H, B, D], one query per request -> [B, H, D].

    Whole blocks are copied out with one index_select per tensor (rows of block_size * head_dim), already in
    the [KVH, B, L, D] order the two batched matmuls want: per-slot gathers and SDPA's CPU kernel took 2.7x
    (fp32) to 10x (bf16) as long on one core at 64 requests. Scores are small, so the softmax runs in fp32.
    """
    assert meta.decode_blocks is not None and meta.decode_bias is not None
    kv_heads, num_slots, head_dim = k_cache.shape
    heads, batch, _ = q.shape
    length = meta.decode_bias.shape[-1]
    rows = (kv_heads, num_slots // meta.block_size, meta.block_size * head_dim)
    k = k_cache.view(rows).index_select(1, meta.decode_blocks).view(kv_heads, batch, length, head_dim)
    v = v_cache.view(rows).index_select(1, meta.decode_blocks).view(kv_heads, batch, length, head_dim)
    # Query head h reads KV head h // group, as SDPA's enable_gqa does.
    qg = q.view(kv_heads, heads // kv_heads, batch, head_dim).transpose(1, 2).to(k.dtype)
    scale = scaling if scaling is not None else head_dim**-0.5
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale + meta.decode_bias
    probs = scores.softmax(dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [KVH, B, group, D]
    return out.permute(1, 0, 2, 3).reshape(batch, heads, head_dim).to(q.dtype)


AttentionInterface.register(ATTENTION_NAME, paged_attention)
