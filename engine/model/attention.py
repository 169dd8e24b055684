"""Paged attention: writes each step's new K/V into the block pool and attends over every request's blocks.

The plain-torch reference implementation below runs on CPU and CUDA. It is registered with transformers'
attention interface under ATTENTION_NAME, so the model definition stays transformers' own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

from engine.cpu.decode_kernel import AttentionKernel, AttentionRows
from engine.model.attention_features import PLAIN, LayerFeatures, causal_mask, prefill_attention, scores_to_probs
from engine.model.kv_cache import gather_blocks, gather_slots, rotate_queries, rotated, store

ATTENTION_NAME = "appliance_paged"
# A decode group's fixed cost per layer (its gathers, matmuls and softmax launched once more), in gathered
# blocks' worth, for torch's decode attention (the compiled kernel, engine.cpu.decode_kernel, needs no groups).
# `python -m bench.engine.steps --variants none/bfloat16 --batches 8,32,64,128 --context 160 --sigma 0.8
# --attention torch/one,torch/48` (bundled model, one thread), ms per decode step: one padded group
# 65/264/492/1014, grouped 70/150/253/438; costs of 16 to 64 measured alike, 0 (a group per length) slower.
GROUP_COST_BLOCKS = 48


@dataclass(slots=True)
class PrefillSeq:
    """One request computing several tokens this step: its token range in the flat batch and its context."""

    start: int
    num_tokens: int
    context_slots: torch.Tensor | None  # pool slots of the whole context; None when nothing was computed before
    computed: int  # tokens of its context computed before this step
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor | None:
        """[num_tokens, context] bool, causal (with the offset of what was computed) within the window; None
        for a plain causal prefill of its own tokens, which SDPA masks itself. Built once per window and step."""
        if window not in self._masks:
            plain = self.context_slots is None and window is None
            context = self.computed + self.num_tokens
            self._masks[window] = (
                None if plain else causal_mask(self.computed, self.num_tokens, context, window, device)
            )
        return self._masks[window]


@dataclass(slots=True)
class DecodeGroup:
    """Decoding requests [start, stop) of the flat batch, whose blocks are gathered together, each row padded to
    the group's longest; the runner sorts decodes longest first, so a group's rows are of like lengths."""

    start: int
    stop: int
    blocks: torch.Tensor  # [(stop - start) * max_blocks] block ids, each row padded (with block 0)
    bias: torch.Tensor  # [1, stop - start, 1, max_blocks * block_size] fp32: 0 or -inf (padding, beyond the context)
    lens: torch.Tensor  # [stop - start] context lengths
    _window_bias: dict[int, torch.Tensor] = field(default_factory=dict)

    def bias_for(self, window: int | None) -> torch.Tensor:
        """The bias that also hides keys before a sliding window's reach; built once per window and step."""
        if window is None:
            return self.bias
        if window not in self._window_bias:
            positions = torch.arange(self.bias.shape[-1], device=self.bias.device)
            before = positions.unsqueeze(0) < (self.lens - window).unsqueeze(1)
            self._window_bias[window] = self.bias.masked_fill(before.view(self.bias.shape), float("-inf"))
        return self._window_bias[window]

    @classmethod
    def build(
        cls,
        start: int,
        tables: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        block_size: int,
        device: torch.device,
    ) -> DecodeGroup:
        """The group of the requests whose block tables (each cut to its context's blocks) and context lengths
        are given, longest first, starting at `start` in the flat batch."""
        max_blocks = len(tables[0])
        flat: list[int] = []
        for table in tables:
            flat.extend(table)
            flat.extend([0] * (max_blocks - len(table)))  # padding reads block 0; the bias hides it
        positions = torch.arange(max_blocks * block_size, device=device)
        lens = torch.tensor(list(context_lens), device=device)
        beyond = positions.unsqueeze(0) >= lens.unsqueeze(1)
        bias = torch.zeros(beyond.shape, dtype=torch.float32, device=device).masked_fill_(beyond, float("-inf"))
        rows = len(tables)
        blocks = torch.tensor(flat, dtype=torch.long, device=device)
        return cls(start, start + rows, blocks, bias.view(1, rows, 1, -1), lens)


@dataclass(slots=True)
class AttentionMetadata:
    """Built once per step by the runner and shared by every layer.

    The flat batch holds the decode tokens first (one per request, in decode_groups' order), then the
    prefill chunks in order.
    """

    slot_mapping: torch.Tensor  # [T] pool slot that receives each token's K/V
    key_cache: list[torch.Tensor]  # per layer [kv_heads, num_slots, head_dim]
    value_cache: list[torch.Tensor]
    key_scale: list[torch.Tensor] = field(default_factory=list)  # per layer [kv_heads, num_slots]: an 8-bit pool's
    value_scale: list[torch.Tensor] = field(default_factory=list)  # (engine.model.kv_cache); empty otherwise
    block_size: int = 16
    decode_groups: list[DecodeGroup] = field(default_factory=list)  # torch's decode attention
    prefills: list[PrefillSeq] = field(default_factory=list)  # torch's: all prefills, or those the kernel is not for
    kernel: AttentionKernel | None = None  # engine.cpu.decode_kernel: decodes and prefills continuing a context
    kernel_rows: AttentionRows | None = None
    # Where layers are grouped (engine.sched.kv_groups): every group's metadata (its own slots and tables), this
    # one first, and each layer's group. Empty for one group: this metadata serves every layer.
    groups: list[AttentionMetadata] = field(default_factory=list)
    layer_group: Sequence[int] = ()

    def for_layer(self, layer: int) -> AttentionMetadata:
        """The metadata that addresses layer's blocks."""
        return self.groups[self.layer_group[layer]] if self.groups else self


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
    """query [1, H, T, D], key/value [1, KVH, T, D] (RoPE applied) -> output [1, T, H, D]. The layer's sliding
    window, soft-cap and sinks come as transformers passes them (engine.model.attention_features)."""
    meta = kwargs.get("paged")
    if not isinstance(meta, AttentionMetadata):
        raise RuntimeError("paged attention needs the step's AttentionMetadata passed as paged=")
    layer: int = module.layer_idx  # type: ignore[assignment]
    meta = meta.for_layer(layer)
    k_scale, v_scale = scales(meta, layer)
    store(meta.key_cache[layer], k_scale, meta.slot_mapping, key[0], keys=True)
    store(meta.value_cache[layer], v_scale, meta.slot_mapping, value[0])
    features = LayerFeatures.from_kwargs(kwargs)
    return attend(meta, layer, query[0], key[0], value[0], scaling, features).unsqueeze(0), None


def attend(
    meta: AttentionMetadata,
    layer: int,
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    features: LayerFeatures = PLAIN,
) -> torch.Tensor:
    """One layer's attention for the step, once its keys and values are in the pool: q [H, T, D], this step's own
    key/value [KVH, T, D] (any strides, D contiguous) -> [T, H, D]."""
    meta = meta.for_layer(layer)
    k_cache, v_cache = meta.key_cache[layer], meta.value_cache[layer]
    k_scale, v_scale = scales(meta, layer)
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # [T, H, D]
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    if meta.kernel is not None and meta.kernel_rows is not None:  # it rotates the queries itself, as need be
        meta.kernel(q.transpose(0, 1), k_cache, v_cache, meta.kernel_rows, scale, out, features, k_scale, v_scale)
    # An int8 pool's keys are rotated (engine.model.kv_cache): torch's queries that read them are too.
    reads = meta.decode_groups or any(p.context_slots is not None for p in meta.prefills)
    pooled = rotate_queries(q) if reads and rotated(k_cache) else q
    for g in meta.decode_groups:
        qg = pooled[:, g.start : g.stop]
        out[g.start : g.stop] = _decode_attention(
            qg, k_cache, v_cache, g, meta.block_size, scale, features, k_scale, v_scale
        )
    for p in meta.prefills:
        qp = q[:, p.start : p.start + p.num_tokens].unsqueeze(0)  # [1, H, n, D]
        if p.context_slots is None:  # its own keys, as computed
            kp = key[:, p.start : p.start + p.num_tokens].unsqueeze(0)
            vp = value[:, p.start : p.start + p.num_tokens].unsqueeze(0)
        else:
            qp = pooled[:, p.start : p.start + p.num_tokens].unsqueeze(0)
            kp = gather_slots(k_cache, k_scale, p.context_slots, q.dtype).unsqueeze(0)
            vp = gather_slots(v_cache, v_scale, p.context_slots, q.dtype).unsqueeze(0)
        op = prefill_attention(qp, kp, vp, p.mask(features.window, q.device), scale, features)
        out[p.start : p.start + p.num_tokens] = op[0].transpose(0, 1)
    return out


def scales(meta: AttentionMetadata, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The layer's key and value scales in an 8-bit pool; None, None otherwise."""
    if not meta.key_scale:
        return None, None
    return meta.key_scale[layer], meta.value_scale[layer]


def plan_decode_groups(num_blocks: Sequence[int], group_cost: int = GROUP_COST_BLOCKS) -> list[tuple[int, int]]:
    """Split requests sorted longest first (their block counts, non-increasing) into groups [start, stop) that
    minimise the blocks gathered, each row padded to its group's longest, plus group_cost per group.

    One padded group for all is what a long request among short ones makes costly: the gathers and matmuls
    grow with the longest context times the batch (3-5x the real blocks in the served benchmark's mix). The
    search is exact: a group starts where the counts change (splitting equal counts never pays), and
    dynamic programming over those starts is quadratic in the distinct counts, a few dozen at most.
    """
    n = len(num_blocks)
    if n == 0:
        return []
    starts = [i for i in range(n) if i == 0 or num_blocks[i] != num_blocks[i - 1]] + [n]
    best = [0] + [-1] * (len(starts) - 1)  # best[b]: least cost of requests [0, starts[b])
    cut = [0] * len(starts)
    for b in range(1, len(starts)):
        stop = starts[b]
        for a in range(b):
            cost = best[a] + (stop - starts[a]) * num_blocks[starts[a]] + group_cost
            if best[b] < 0 or cost < best[b]:
                best[b], cut[b] = cost, a
    groups, b = [], len(starts) - 1
    while b > 0:
        groups.append((starts[cut[b]], starts[b]))
        b = cut[b]
    return groups[::-1]


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    block_size: int,
    scaling: float | None,
    features: LayerFeatures = PLAIN,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [H, B, D], one query per request of the group -> [B, H, D]; k_scale, v_scale: an 8-bit pool's scales.

    Whole blocks are copied out with one index_select per tensor (rows of block_size * head_dim), already in
    the [KVH, B, L, D] order the two batched matmuls want: per-slot gathers and SDPA's CPU kernel took 2.7x
    (fp32) to 10x (bf16) as long on one core at 64 requests. Scores are small, so the softmax runs in fp32.
    A 16/32-bit pool is multiplied in its own dtype; an 8-bit one is dequantized to the query's as it is copied.
    """
    kv_heads, _, head_dim = k_cache.shape
    heads, batch, _ = q.shape
    length = group.bias.shape[-1]
    dtype = k_cache.dtype if k_scale is None else q.dtype
    k = gather_blocks(k_cache, k_scale, group.blocks, block_size, dtype).view(kv_heads, batch, length, head_dim)
    v = gather_blocks(v_cache, v_scale, group.blocks, block_size, dtype).view(kv_heads, batch, length, head_dim)
    # Query head h reads KV head h // group, as SDPA's enable_gqa does.
    qg = q.view(kv_heads, heads // kv_heads, batch, head_dim).transpose(1, 2).to(k.dtype)
    scale = scaling if scaling is not None else head_dim**-0.5
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale
    if features.plain:
        probs = (scores + group.bias).softmax(dim=-1).to(v.dtype)
    else:
        group_size = heads // kv_heads
        sinks = features.sinks.view(kv_heads, 1, group_size, 1) if features.sinks is not None else None
        probs = scores_to_probs(scores, features.softcap, sinks, group.bias_for(features.window)).to(v.dtype)
    out = torch.matmul(probs, v)  # [KVH, B, group, D]
    return out.permute(1, 0, 2, 3).reshape(batch, heads, head_dim).to(q.dtype)


AttentionInterface.register(ATTENTION_NAME, paged_attention)
