"""Paged attention compiled for this CPU (engine/cpu/csrc/paged_decode.c, built by engine.cpu.kernel_build): every
query row whose context is already in the pool (a decode, or a prefill chunk continuing a computed context),
read where its blocks lie.

torch's decode attention (engine.model.attention) copies each request's blocks out per layer, padded to the longest
of its group, and multiplies the copy; a prefill that continues a context gathers it and runs SDPA with an
explicit causal mask. The kernel walks each row's block table instead, up to the row's own position: no copy,
no padding, no mask. It is built when the engine starts, for the model's head size, heads per KV head and
dtype, and for a pool of that dtype or of int8 codes with their scales (widened as they load), where the CPU plan
(engine.cpu.plan) chooses it; where it does not build, attention stays torch's, and the plan records why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.cpu.kernel_build import KernelBuildError, build_kernel
from engine.cpu.plan import Attention, CpuPlan, Decision


class KernelFeatures(Protocol):
    """What the kernel computes beyond plain causal attention (engine.model.attention_features.LayerFeatures has
    it): a sliding window, logit soft-capping, attention sinks (one fp32 logit per query head)."""

    @property
    def window(self) -> int | None: ...

    @property
    def softcap(self) -> float | None: ...

    @property
    def sinks(self) -> torch.Tensor | None: ...


__all__ = ["AttentionKernel", "AttentionRows", "KernelBuildError", "KernelFeatures", "RowsBuilder", "attention_kernel"]

ELEMENT = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True, slots=True)
class AttentionRows:
    """The step's rows the kernel computes, int32: row r is token rows[r] of the flat batch, attending with block
    table tables[table_of[r]] over its first lens[r] tokens."""

    tables: torch.Tensor  # [requests, max_blocks]; a table's unused tail is 0 (never read: lens bound it)
    rows: torch.Tensor
    table_of: torch.Tensor
    lens: torch.Tensor
    max_len: int
    block_size: int


@dataclass(slots=True)
class RowsBuilder:
    block_size: int
    _tables: list[Sequence[int]] = field(default_factory=list)
    _rows: list[int] = field(default_factory=list)
    _table_of: list[int] = field(default_factory=list)
    _lens: list[int] = field(default_factory=list)

    def add(self, table: Sequence[int], first_row: int, num_rows: int, first_len: int) -> None:
        """A request's num_rows tokens from first_row on, the first attending over first_len tokens (its context
        and itself), each next one over one more; table: its block ids, at least those of its last row."""
        if len(table) * self.block_size < first_len + num_rows - 1:
            raise ValueError(f"a block table of {len(table)} blocks is short of {first_len + num_rows - 1} tokens")
        index = len(self._tables)
        self._tables.append(table)
        self._rows.extend(range(first_row, first_row + num_rows))
        self._table_of.extend([index] * num_rows)
        self._lens.extend(range(first_len, first_len + num_rows))

    def build(self) -> AttentionRows | None:
        if not self._rows:
            return None
        width = max(len(t) for t in self._tables)
        flat = [b for t in self._tables for b in (*t, *([0] * (width - len(t))))]
        tables = torch.tensor(flat, dtype=torch.int32).view(len(self._tables), width)
        return AttentionRows(
            tables,
            torch.tensor(self._rows, dtype=torch.int32),
            torch.tensor(self._table_of, dtype=torch.int32),
            torch.tensor(self._lens, dtype=torch.int32),
            max(self._lens),
            self.block_size,
        )


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """The kernel built for one model's shape and dtype, called once per layer and step."""

    function: Callable[..., int]
    dtype: torch.dtype
    build_s: float
    kv_dtype: torch.dtype | None = None  # the pool's, where it is not dtype: torch.int8

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: AttentionRows,
        scale: float,
        out: torch.Tensor,
        features: KernelFeatures | None = None,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """q [T, H, D] (D contiguous), caches [KVH, slots, D] contiguous, out [T, H, D] contiguous, all of the
        kernel's dtype (the caches: of kv_dtype, with their scales [KVH, slots] bf16, where it has one): writes
        out[rows.rows] and nothing else. features: the layer's window, soft-cap, sinks."""
        if q.stride(-1) != 1 or q.dtype != self.dtype:
            q = q.to(self.dtype).contiguous()
        if out.dtype != self.dtype or not out.is_contiguous():
            raise ValueError("the kernel writes a contiguous output of its own dtype")
        if k_cache.dtype != (self.kv_dtype or self.dtype) or (k_scale is None) != (self.kv_dtype is None):
            raise ValueError(f"the kernel was built for a {self.kv_dtype or self.dtype} pool, not {k_cache.dtype}")
        kv_heads, num_slots, _ = k_cache.shape
        sinks = None
        window, softcap = (None, None) if features is None else (features.window, features.softcap)
        if features is not None and features.sinks is not None:
            sinks = features.sinks.detach().to(torch.float32).contiguous()
            if sinks.shape != (q.shape[1],):
                raise ValueError(f"{tuple(sinks.shape)} sinks for {q.shape[1]} query heads")
        failed = self.function(
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            None if k_scale is None else k_scale.data_ptr(),
            None if v_scale is None else v_scale.data_ptr(),
            num_slots,
            rows.tables.data_ptr(),
            rows.tables.shape[1],
            rows.rows.data_ptr(),
            rows.table_of.data_ptr(),
            rows.lens.data_ptr(),
            rows.rows.shape[0],
            kv_heads,
            rows.block_size,
            scale,
            rows.max_len,
            window or 0,
            softcap or 0.0,
            None if sinks is None else sinks.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            torch.get_num_threads(),
        )
        if failed == 1:
            raise MemoryError("the attention kernel could not allocate its scores")
        if failed:
            raise RuntimeError("a row's length or block table lies outside the KV pool (an engine bug)")


def attention_kernel(
    plan: CpuPlan, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int, kv_dtype: torch.dtype | None = None
) -> tuple[AttentionKernel | None, CpuPlan]:
    """The kernel for this model where the plan chose it, else None (torch's attention), and the plan with the
    build's outcome recorded. kv_dtype: the pool's (None: dtype; the plan chose the kernel only for a pool of
    dtype or int8). Where the plan requires it (decode_attention=compiled), a failed build raises KernelBuildError
    rather than fall back."""
    if plan.attention.choice is not Attention.COMPILED:
        return None, plan
    element = ELEMENT.get(dtype, str(dtype).removeprefix("torch."))
    int8 = kv_dtype == torch.int8
    if kv_dtype is not None and kv_dtype != dtype and not int8:  # weights loaded for another engine's plan
        pool = str(kv_dtype).removeprefix("torch.")
        why = f"the compiled kernel reads a KV pool of the model's dtype or int8, not {pool}"
        return None, plan.settled(attention=Decision(Attention.TORCH, why))
    try:
        function, seconds = build_kernel(element, head_dim, heads, kv_heads, int8)
    except KernelBuildError as exc:
        return None, plan.unbuilt("attention", exc)
    pool = " over an int8 pool" if int8 else ""
    built = (
        f"ready in {seconds:.1f} s (built, or kept from an earlier build) for {element}{pool}, "
        f"head size {head_dim}, {heads} heads over {kv_heads} KV heads"
    )
    return AttentionKernel(function, dtype, seconds, torch.int8 if int8 else None), plan.settled(
        attention=Decision(Attention.COMPILED, f"{plan.attention.reason}; {built}")
    )
