"""The KV block pool: per-layer key and value tensors carved into fixed-size blocks, sized from a memory budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class KVCache:
    """Layer l's keys live in key[l] as [kv_heads, num_blocks * block_size, head_dim]: slot = block * size + offset.

    Heads first, so that a request's blocks copied out for one head are already the rows attention multiplies."""

    key: list[torch.Tensor]
    value: list[torch.Tensor]
    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> int:
    """Keys and values of every layer for block_size tokens."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> KVCache:
    shape = (num_kv_heads, num_blocks * block_size, head_dim)
    key = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    value = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    per_block = bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, dtype)
    return KVCache(key, value, num_blocks, block_size, per_block)
