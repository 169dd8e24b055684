"""Turns the scheduler's decision into one flattened ragged batch, runs the model once, and samples.

The only module that knows torch tensors in depth; the attention layers read the step's metadata, passed
through the model's forward as a keyword argument, never from a global.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.cpu.decode_kernel import AttentionKernel, RowsBuilder
from engine.model.attention import (
    ATTENTION_NAME,
    GROUP_COST_BLOCKS,
    AttentionMetadata,
    DecodeGroup,
    PrefillSeq,
    plan_decode_groups,
)
from engine.model.forward import CpuForward
from engine.model.kv_cache import KVCache
from engine.model.rope import RequestRope
from engine.sample.guided_batch import GuidedBatch
from engine.sample.sampler import SampleResult, TopLogprobs, sample
from engine.sched.scheduler import ScheduledRequest

__all__ = ["ATTENTION_NAME", "ModelRunner", "StepResult"]


@dataclass(slots=True)
class StepResult:
    sampled: dict[str, int]
    logprobs: dict[str, TopLogprobs]


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        device: torch.device,
        guided: GuidedBatch | None = None,
        decode_kernel: AttentionKernel | None = None,
        forward: CpuForward | None = None,
        rope: RequestRope | None = None,
        layer_group: Sequence[int] = (),
    ) -> None:
        """guided: the constrained requests' matchers; None where no request can be constrained (warm-up).
        decode_kernel: attention compiled for this CPU, for decodes and prefills continuing a context; None:
        torch's (decodes in groups of like lengths, SDPA for prefills). forward: the engine's own forward
        (engine.model.forward) in place of the model's; None: the model's. rope: the model's longrope, chosen per
        request (engine.model.rope); None for any other rope. layer_group: each layer's KV group where the pool
        groups layers (engine.sched.kv_groups); empty for one group."""
        self.model = model
        self.kv = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size
        self._generators: dict[str, torch.Generator] = {}
        self.guided = guided
        self.group_cost = GROUP_COST_BLOCKS  # decode attention's grouping (engine.model.attention.plan_decode_groups)
        self.decode_kernel = decode_kernel
        self.forward = forward
        self.rope = rope
        self.layer_group = tuple(layer_group)

    def release(self, request_id: str) -> None:
        """Forget a finished request's sampling state."""
        self._generators.pop(request_id, None)
        if self.rope is not None:
            self.rope.release(request_id)
        if self.guided is not None:
            self.guided.release(request_id)

    @torch.inference_mode()
    def execute(self, scheduled: Sequence[ScheduledRequest], block_tables: dict[str, list[list[int]]]) -> StepResult:
        """block_tables: each request's table in every KV group, group 0 first (one group where layers are not
        grouped)."""
        starts = {s.request.request_id: self._first_position(s) for s in scheduled}
        # Longest context first: decode attention gathers groups of like lengths (engine.model.attention).
        decodes = sorted((s for s in scheduled if _span(s, starts) == 1), key=_context_len, reverse=True)
        prefills = [s for s in scheduled if _span(s, starts) > 1]
        ordered = decodes + prefills
        input_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        lengths: list[int] = []
        for s in ordered:
            req = s.request
            start = starts[req.request_id]
            stop = req.num_computed_tokens + s.num_new_tokens
            input_ids.extend(req.token_slice(start, stop))
            positions.extend(range(start, stop))
            lengths.extend([req.num_tokens] * (stop - start))
            if s.samples:
                sample_rows.append(len(input_ids) - 1)
        groups = [
            self._metadata(ordered, decodes, prefills, starts, {rid: t[g] for rid, t in block_tables.items()})
            for g in range(max(self.layer_group, default=0) + 1)
        ]
        meta = groups[0]
        if len(groups) > 1:
            meta.groups, meta.layer_group = groups, self.layer_group
        if self.rope is not None:
            self.rope.select(lengths, self.device)
        sampling = [s for s in ordered if s.samples]
        if self.guided is not None and self.guided.active:
            self.guided.prepare([s.request.request_id for s in sampling])
        logits = self._logits(input_ids, positions, meta, sample_rows)
        if logits is None:
            return StepResult({}, {})
        if self.guided is not None:
            # Before the sampler, so its knobs (temperature, penalties, bias) only ever see allowed tokens.
            logits = self.guided.mask(logits)
        result = self._sample(logits, sampling)
        sampled = {s.request.request_id: t for s, t in zip(sampling, result.token_ids, strict=True)}
        logprobs = {s.request.request_id: lp for s, lp in zip(sampling, result.logprobs, strict=True) if lp is not None}
        return StepResult(sampled, logprobs)

    def _metadata(
        self,
        ordered: list[ScheduledRequest],
        decodes: list[ScheduledRequest],
        prefills: list[ScheduledRequest],
        starts: dict[str, int],
        block_tables: dict[str, list[int]],
    ) -> AttentionMetadata:
        """The step's attention metadata over one KV group's block tables."""
        bs = self.block_size
        slots: list[int] = []
        for s in ordered:
            req = s.request
            table = block_tables[req.request_id]
            slots.extend(
                table[p // bs] * bs + p % bs
                for p in range(starts[req.request_id], req.num_computed_tokens + s.num_new_tokens)
            )
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            key_cache=self.kv.key,
            value_cache=self.kv.value,
            key_scale=self.kv.key_scale,
            value_scale=self.kv.value_scale,
            block_size=bs,
        )
        rows = RowsBuilder(bs) if self.decode_kernel is not None else None
        self._decode_metadata(meta, decodes, block_tables, rows)
        self._prefill_metadata(meta, prefills, starts, block_tables, len(decodes), rows)
        if rows is not None:
            meta.kernel, meta.kernel_rows = self.decode_kernel, rows.build()
        return meta

    def _logits(
        self, input_ids: list[int], positions: list[int], meta: AttentionMetadata, sample_rows: list[int]
    ) -> torch.Tensor | None:
        """The logits of the rows that sample, by the engine's own forward or the model's; None where no row
        samples (a step that only computes prompts)."""
        ids, at = self._tensor(input_ids), self._tensor(positions)
        if self.forward is not None:
            logits = self.forward(ids, at, meta, self._tensor(sample_rows))
            return logits if sample_rows else None
        keep = self._tensor(sample_rows or [len(input_ids) - 1])  # the model computes at least one row's logits
        out = self.model(
            input_ids=ids.unsqueeze(0), position_ids=at.unsqueeze(0), use_cache=False, logits_to_keep=keep, paged=meta
        )
        return out.logits[0] if sample_rows else None

    def _sample(self, logits: torch.Tensor, sampling: list[ScheduledRequest]) -> SampleResult:
        params = [s.request.params for s in sampling]
        generators = [self._generator(s) for s in sampling]
        return sample(logits, params, generators, [s.request for s in sampling])

    def _generator(self, s: ScheduledRequest) -> torch.Generator | None:
        seed = s.request.params.seed
        if seed is None or s.request.params.greedy:
            return None
        gen = self._generators.get(s.request.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[s.request.request_id] = gen
        return gen

    def _first_position(self, s: ScheduledRequest) -> int:
        """The step's first position for the request: what it computed before, unless longrope recomputes it."""
        req = s.request
        if self.rope is None:
            return req.num_computed_tokens
        return self.rope.first_position(req.request_id, req.num_computed_tokens, req.num_tokens)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _decode_metadata(
        self,
        meta: AttentionMetadata,
        decodes: list[ScheduledRequest],
        block_tables: dict[str, list[int]],
        rows: RowsBuilder | None,
    ) -> None:
        """decodes: sorted longest context first. rows: the kernel's, where it attends."""
        if not decodes:
            return
        bs = self.block_size
        context_lens = [_context_len(s) for s in decodes]
        num_blocks = [(n + bs - 1) // bs for n in context_lens]
        tables = [block_tables[s.request.request_id][:n] for s, n in zip(decodes, num_blocks, strict=True)]
        if rows is not None:
            for i, (table, n) in enumerate(zip(tables, context_lens, strict=True)):
                rows.add(table, i, 1, n)
            return
        for start, stop in plan_decode_groups(num_blocks, self.group_cost):
            group = DecodeGroup.build(start, tables[start:stop], context_lens[start:stop], bs, self.device)
            meta.decode_groups.append(group)

    def _prefill_metadata(
        self,
        meta: AttentionMetadata,
        prefills: list[ScheduledRequest],
        starts: dict[str, int],
        block_tables: dict[str, list[int]],
        start: int,
        rows: RowsBuilder | None,
    ) -> None:
        """A prefill with nothing computed before runs SDPA over its own tokens; one continuing a context (a
        prefix-cache hit, a later chunk) is the kernel's rows where it attends, else SDPA with a causal mask."""
        bs = self.block_size
        for s in prefills:
            computed = starts[s.request.request_id]
            context = s.request.num_computed_tokens + s.num_new_tokens
            n = context - computed
            table = block_tables[s.request.request_id][: (context + bs - 1) // bs]
            if computed == 0:
                meta.prefills.append(PrefillSeq(start, n, None, 0))
            elif rows is not None:
                rows.add(table, start, n, computed + 1)
            else:
                offsets = torch.arange(bs, device=self.device)
                context_slots = (self._tensor(table).unsqueeze(-1) * bs + offsets).view(-1)[:context]
                meta.prefills.append(PrefillSeq(start, n, context_slots, computed))
            start += n


def _span(s: ScheduledRequest, starts: dict[str, int]) -> int:
    """Tokens the request computes this step."""
    return s.request.num_computed_tokens + s.num_new_tokens - starts[s.request.request_id]


def _context_len(s: ScheduledRequest) -> int:
    """A decoding request's context this step: what it computed before and the token it computes now."""
    return s.request.num_computed_tokens + 1
