"""Decode attention in groups of like lengths: the plan is the cheapest split, and grouped attention gives what one
padded group gives."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from engine.model.attention import DecodeGroup, _decode_attention, plan_decode_groups


def cost(num_blocks: list[int], groups: list[tuple[int, int]], group_cost: int) -> int:
    return sum((stop - start) * num_blocks[start] + group_cost for start, stop in groups)


def every_split(n: int) -> list[list[tuple[int, int]]]:
    splits = []
    for cuts in itertools.product([False, True], repeat=n - 1):
        edges = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        splits.append(list(itertools.pairwise(edges)))
    return splits


def test_no_requests_no_groups() -> None:
    assert plan_decode_groups([]) == []


def test_like_lengths_stay_one_group() -> None:
    assert plan_decode_groups([5, 5, 5, 4, 4], group_cost=32) == [(0, 5)]


def test_a_long_request_among_short_ones_gets_its_own_group() -> None:
    # One padded group: 40 rows of 36 blocks (1,440); apart: 36 + 39 * 2 and two group costs.
    assert plan_decode_groups([36] + [2] * 39, group_cost=32) == [(0, 1), (1, 40)]


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_is_the_cheapest_split(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    num_blocks = sorted((rng.choice([1, 2, 3, 8, 20, 40]) for _ in range(n)), reverse=True)
    group_cost = rng.choice([0, 4, 32, 100])
    plan = plan_decode_groups(num_blocks, group_cost)
    assert [a for a, _ in plan] == [0] + [b for _, b in plan[:-1]] and plan[-1][1] == n, "groups tile the batch"
    cheapest = min(cost(num_blocks, split, group_cost) for split in every_split(n))
    assert cost(num_blocks, plan, group_cost) == cheapest


def group(tables: list[list[int]], lens: list[int], start: int, stop: int, block_size: int) -> DecodeGroup:
    return DecodeGroup.build(start, tables[start:stop], lens[start:stop], block_size, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_attention_equals_one_padded_group(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    kv_heads, heads, head_dim, block_size, pool = 2, 4, 16, 4, 64
    k_cache = torch.randn(kv_heads, pool * block_size, head_dim, dtype=dtype)
    v_cache = torch.randn(kv_heads, pool * block_size, head_dim, dtype=dtype)
    lens = [61, 40, 9, 8, 3, 1]
    order = torch.randperm(pool).tolist()
    tables, used = [], 0
    for n in lens:
        count = (n + block_size - 1) // block_size
        tables.append(order[used : used + count])
        used += count
    q = torch.randn(heads, len(lens), head_dim, dtype=dtype)
    whole = _decode_attention(q, k_cache, v_cache, group(tables, lens, 0, len(lens), block_size), block_size, None)
    plan = plan_decode_groups([len(t) for t in tables], group_cost=0)
    assert len(plan) > 2
    parts = [
        _decode_attention(q[:, a:b], k_cache, v_cache, group(tables, lens, a, b, block_size), block_size, None)
        for a, b in plan
    ]
    torch.testing.assert_close(torch.cat(parts), whole)
