"""Sliding windows, logit soft-capping and attention sinks: the compiled kernel, torch's decode groups and the
prefill path each equal a dense computation of transformers' eager arithmetic."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig
from engine.cpu.decode_kernel import RowsBuilder, attention_kernel
from engine.cpu.plan import cpu_plan, this_machine
from engine.model.attention import DecodeGroup, _decode_attention
from engine.model.attention_features import LayerFeatures, causal_mask, prefill_attention

CPU = torch.device("cpu")
HEADS, KV_HEADS, HEAD_DIM, BLOCK, POOL = 4, 2, 16, 4, 64
LENS = [61, 40, 9, 3]
CASES = {
    "plain": (None, None, False),
    "window-mid-block": (5, None, False),
    "window-wider-than-short-rows": (16, None, False),
    "softcap": (None, 2.0, False),
    "sinks": (None, None, True),
    "all": (7, 1.5, True),
}


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, f: LayerFeatures) -> torch.Tensor:
    """q [H, n, D], k/v [KVH, L, D], mask [n, L] -> [n, H, D], as transformers' eager attention computes it."""
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = q @ k.transpose(-1, -2) * HEAD_DIM**-0.5
    if f.softcap is not None:
        scores = torch.tanh(scores / f.softcap) * f.softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if f.sinks is not None:
        scores = torch.cat([scores, f.sinks.view(-1, 1, 1).expand(-1, scores.shape[1], 1)], dim=-1)
    probs = scores.softmax(-1)[..., : k.shape[1]]
    return (probs @ v).transpose(0, 1)


def features(name: str) -> LayerFeatures:
    window, softcap, sinks = CASES[name]
    return LayerFeatures(window, softcap, torch.randn(HEADS) * 3 if sinks else None)


@pytest.mark.parametrize("name", list(CASES))
def test_decode_paths_equal_the_dense_computation(name: str) -> None:
    torch.manual_seed(0)
    f = features(name)
    k_cache, v_cache = (torch.randn(KV_HEADS, POOL * BLOCK, HEAD_DIM) for _ in range(2))
    order, tables = torch.randperm(POOL).tolist(), []
    for n in LENS:
        tables.append(order[: (n + BLOCK - 1) // BLOCK])
        order = order[len(tables[-1]) :]
    q = torch.randn(len(LENS), HEADS, HEAD_DIM)
    want = []
    for i, n in enumerate(LENS):
        slots = torch.tensor([tables[i][p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
        mask = causal_mask(n - 1, 1, n, f.window, CPU)
        want.append(dense(q[i].unsqueeze(1), k_cache[:, slots], v_cache[:, slots], mask, f)[0])
    plan = cpu_plan(EngineConfig(decode_attention="compiled"), "cpu", "float32", "LlamaForCausalLM", this_machine())
    kernel, _ = attention_kernel(plan, torch.float32, HEAD_DIM, HEADS, KV_HEADS)
    assert kernel is not None
    rows = RowsBuilder(BLOCK)
    for i, (table, n) in enumerate(zip(tables, LENS, strict=True)):
        rows.add(table, i, 1, n)
    built = rows.build()
    assert built is not None
    compiled = torch.zeros_like(q)
    kernel(q, k_cache, v_cache, built, HEAD_DIM**-0.5, compiled, f)
    group = DecodeGroup.build(0, tables, LENS, BLOCK, CPU)
    grouped = _decode_attention(q.transpose(0, 1), k_cache, v_cache, group, BLOCK, HEAD_DIM**-0.5, f)
    torch.testing.assert_close(compiled, torch.stack(want), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(grouped, torch.stack(want), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("computed", [0, 23])
def test_prefill_equals_the_dense_computation(name: str, computed: int) -> None:
    torch.manual_seed(1)
    f = features(name)
    n = 30
    q = torch.randn(HEADS, n, HEAD_DIM)
    k, v = (torch.randn(KV_HEADS, computed + n, HEAD_DIM) for _ in range(2))
    full = causal_mask(computed, n, computed + n, f.window, CPU)
    mask = None if computed == 0 and f.window is None else full
    got = prefill_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, HEAD_DIM**-0.5, f)
    torch.testing.assert_close(got[0].transpose(0, 1), dense(q, k, v, full, f), atol=2e-6, rtol=1e-5)
