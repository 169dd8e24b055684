"""The KV block pool: per-layer key and value tensors carved into fixed-size blocks, sized from a memory budget, in
the model's dtype or in 8 bits with a scale per token and KV head; and the one way K/V are written and read back.

The 8-bit layout (kv_cache_dtype int8, or fp8 = e4m3): each (layer, KV head, token) row of head_dim keys (and of
values) is stored as head_dim 8-bit codes and one bfloat16 scale, symmetric: scale = max|x| / QMAX (127 for int8,
448 for e4m3), code = x / scale (rounded to nearest for int8, to e4m3 for fp8), x ~ code * scale.

- Per token, not per block: a block fills a token at a time across steps (decode appends one token into a partly
  full block, and a prefix-cache hit shares a block that a later request only reads), so a block-wide scale would
  have to be fixed before its last token is seen, or every code rewritten when it grows. A row's scale is final
  the moment the row is written, and nothing else in the block changes: prefix caching and preemption, which work
  on whole blocks, are unchanged.
- Per KV head: heads differ in magnitude by 10x or more (a few carry outliers), one scale across them would spend
  the outlier head's range on all.
- bfloat16 scales: 2 bytes a row against head_dim bytes of codes (3% at head_dim 64); float32 scales would make the
  8-bit pool hold only 1.88x the tokens of a 16-bit one at head_dim 64. bfloat16 keeps float32's exponent range;
  its coarser mantissa only changes which step size the row gets, since codes are computed with the stored scale.
- int8 keys are rotated before they are quantized (rotate: the Walsh-Hadamard transform of each row, where
  head_dim is a power of two): a few channels of a key carry most of its magnitude (up to 10x the median on the
  bundled model), and a per-row scale spent on them leaves the rest few steps; the rotation spreads every channel
  over all, halving the keys' quantization error there (1.1% -> 0.56% RMS). Values (no such channels: 0.67% ->
  0.59%) are stored as they are, and so are fp8 keys: e4m3 keeps each channel's relative precision already, and
  the rotation made a key with one outlier channel worse. As H H = head_dim * I, q . k = rotate(q) . rotate(k) /
  head_dim: readers rotate the query (rotate_queries) and never un-rotate a key.
- The scales are counted in bytes_per_block, so a pool of the same bytes holds 2 * head_dim / (head_dim + 2) times
  the tokens of a 16-bit pool (1.94x at head_dim 64, 1.97x at 128), 4x less 3% of a float32 one.

Readers dequantize to the compute dtype as they load, with rotated queries for rotated keys: the torch paths here,
the compiled CPU kernel (engine/cpu/csrc/paged_decode.c). The own forward's write (engine/cpu/csrc/layer_ops.c)
rotates and rounds as rotate() and quantize() do, to the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.bfloat16
# Largest code of each 8-bit format: a row's largest magnitude is stored as this.
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# EngineConfig.kv_storage's names.
STORAGE = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "float8_e4m3fn": torch.float8_e4m3fn,
}
_TINY = torch.finfo(torch.float32).tiny  # an all-zero row's scale: its codes are 0 either way


@dataclass(slots=True)
class KVCache:
    """Layer l's keys live in key[l] as [kv_heads, num_blocks * block_size, head_dim]: slot = block * size + offset
    (where layers are grouped, several layers share one tensor, each in its own group's blocks).
    In 8 bits, key_scale[l] is [kv_heads, num_blocks * block_size] bfloat16, one per row; empty lists otherwise.

    Heads first, so that a request's blocks copied out for one head are already the rows attention multiplies."""

    key: list[torch.Tensor]
    value: list[torch.Tensor]
    num_blocks: int
    block_size: int
    bytes_per_block: int
    key_scale: list[torch.Tensor]
    value_scale: list[torch.Tensor]

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def dtype(self) -> torch.dtype:
        return self.key[0].dtype

    @property
    def quantized(self) -> bool:
        return bool(self.key_scale)


def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> int:
    """Keys and values of every layer for block_size tokens, in the pool's dtype, with their scales in 8 bits."""
    element = torch.empty((), dtype=dtype).element_size()
    row = head_dim * element + (SCALE_DTYPE.itemsize if dtype in QMAX else 0)
    return 2 * num_layers * block_size * num_kv_heads * row


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    layer_slot: Sequence[int] | None = None,
) -> KVCache:
    """A pool whose blocks hold num_layers layers each. layer_slot: where the model's layers are grouped
    (engine.sched.kv_groups), layer l's place in a block; its lists are then per model layer, layers of one
    place sharing one tensor (each group addresses its own blocks of it)."""
    shape = (num_kv_heads, num_blocks * block_size, head_dim)
    key = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    value = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    scales = dtype in QMAX
    key_scale = [torch.zeros(shape[:2], dtype=SCALE_DTYPE, device=device) for _ in range(num_layers) if scales]
    value_scale = [torch.zeros(shape[:2], dtype=SCALE_DTYPE, device=device) for _ in range(num_layers) if scales]
    if layer_slot is not None:
        key, value = [key[j] for j in layer_slot], [value[j] for j in layer_slot]
        if scales:
            key_scale, value_scale = [key_scale[j] for j in layer_slot], [value_scale[j] for j in layer_slot]
    per_block = bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, dtype)
    return KVCache(key, value, num_blocks, block_size, per_block, key_scale, value_scale)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> codes [..., D] of dtype (int8 or float8_e4m3fn) and scales [...] bfloat16, one per row."""
    xf = x.float()
    qmax = QMAX[dtype]
    scale = (xf.abs().amax(-1) / qmax).clamp_min(_TINY).to(SCALE_DTYPE)
    scaled = (xf / scale.float().unsqueeze(-1)).clamp(-qmax, qmax)
    return (scaled.round() if dtype is torch.int8 else scaled).to(dtype), scale


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x H in float32, H the D x D Walsh-Hadamard matrix of +-1 (Sylvester's order), by the fast
    transform's butterflies in engine/cpu/csrc/layer_ops.c's order (so both give the same bits); x itself where D
    is not a power of two."""
    d = x.shape[-1]
    y = x.float()
    if d & (d - 1):
        return y
    h = 1
    while h < d:
        pairs = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(x.shape)


def rotated(cache: torch.Tensor) -> bool:
    """Whether a pool of this cache's dtype holds its keys rotated: int8's."""
    return cache.dtype == torch.int8


def rotate_queries(q: torch.Tensor) -> torch.Tensor:
    """Queries [..., D] that score a rotated pool's keys as the plain ones: rotate(q) / D, in q's dtype."""
    d = q.shape[-1]
    return q if d & (d - 1) else (rotate(q) / d).to(q.dtype)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., D] and their scales [...] -> values [..., D] of dtype."""
    return codes.to(dtype) * scale.to(dtype).unsqueeze(-1)


def store(
    cache: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor, x: torch.Tensor, keys: bool = False
) -> None:
    """This step's keys (keys=True) or values x [kv_heads, T, D] into pool slots [T] of one layer's cache; scale:
    its scales in 8 bits (where int8 keys are rotated first), else None."""
    if scale is None:
        cache.index_copy_(1, slots, x.to(cache.dtype))
        return
    codes, row_scale = quantize(rotate(x) if keys and rotated(cache) else x, cache.dtype)
    _raw(cache).index_copy_(1, slots, _raw(codes))
    scale.index_copy_(1, slots, row_scale)


def gather_slots(
    cache: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Rows of pool slots [n] -> [kv_heads, n, D] of dtype."""
    rows = _raw(cache)[:, slots].view(cache.dtype)
    return rows.to(dtype) if scale is None else dequantize(rows, scale[:, slots], dtype)


def gather_blocks(
    cache: torch.Tensor, scale: torch.Tensor | None, blocks: torch.Tensor, block_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """Whole blocks [n] copied out with one index_select (rows of block_size * head_dim) -> [kv_heads, n * block_size,
    D] of dtype."""
    kv_heads, num_slots, head_dim = cache.shape
    raw = _raw(cache).view(kv_heads, num_slots // block_size, block_size * head_dim).index_select(1, blocks)
    rows = raw.view(cache.dtype).view(kv_heads, -1, head_dim)
    if scale is None:
        return rows if rows.dtype == dtype else rows.to(dtype)
    scales = scale.view(kv_heads, num_slots // block_size, block_size).index_select(1, blocks)
    return dequantize(rows, scales.view(kv_heads, -1), dtype)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """fp8 as bytes: torch's CPU index_copy_ and index_select do not take float8 (2.13)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
