"""Tests for the paged KV block manager: reference counts, all-or-nothing allocation and prefix caching."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.sched import block_manager
from engine.sched.block_manager import BlockManager, _Block


def all_blocks(bm: BlockManager) -> dict[int, _Block]:
    """Every block's record, id by id (the manager makes one at a block's first use)."""
    return {block_id: bm._blocks[block_id] for block_id in range(bm.num_blocks)}


def collide_first_blocks(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    """A hash under which every first block collides while later keys stay distinct."""
    return 0 if parent_key is None else hash((parent_key, tokens))


def run_prompt(bm: BlockManager, request_id: str, prompt: list[int]) -> list[int]:
    """Admit a prompt with its prefix hit, compute all of it and cache it; returns the hit block ids."""
    hits, _ = bm.get_computed_blocks(prompt)
    assert bm.allocate_slots(request_id, len(prompt), hits)
    bm.cache_blocks(request_id, prompt, len(prompt))
    return hits


def test_hit_never_covers_the_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(8))
    run_prompt(bm, "a", prompt)
    assert bm.num_cached_blocks == 2

    hits, num_hit = bm.get_computed_blocks(prompt)
    assert (len(hits), num_hit) == (1, 4)
    hits, num_hit = bm.get_computed_blocks([*prompt, 9])
    assert (hits, num_hit) == (bm.block_table("a")[:2], 8)
    assert bm.get_computed_blocks(prompt[:4]) == ([], 0)
    assert bm.get_computed_blocks([]) == ([], 0)


def test_shared_prefix_block_is_reference_counted() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    run_prompt(bm, "a", [1, 2, 3])
    hits = run_prompt(bm, "b", [1, 2, 5])
    assert hits == bm.block_table("a")[:1] == bm.block_table("b")[:1]
    assert bm.num_used_blocks == 3

    bm.free("a")
    assert bm.num_used_blocks == 2
    assert bm.get_computed_blocks([1, 2, 3]) == (hits, 2)
    bm.free("b")
    assert (bm.num_used_blocks, bm.num_free_blocks, bm.usage) == (0, 4, 0.0)


def test_only_full_computed_blocks_are_cached() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens = [1, 2, 3, 4, 5, 6]
    assert bm.allocate_slots("a", 6)
    bm.cache_blocks("a", tokens, 3)
    assert bm.num_cached_blocks == 0
    bm.cache_blocks("a", tokens, 6)
    assert bm.num_cached_blocks == 1
    tokens += [7, 8]
    assert bm.allocate_slots("a", 8)
    bm.cache_blocks("a", tokens, 8)
    assert bm.num_cached_blocks == 2
    assert bm.get_computed_blocks([*tokens, 0]) == (bm.block_table("a"), 8)


def test_lru_evicts_least_recently_freed_cached_block_first() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    run_prompt(bm, "a", [0, 1])
    run_prompt(bm, "b", [2, 3])
    bm.free("a")
    bm.free("b")
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (2, 2)

    assert bm.allocate_slots("c", 2)
    assert bm.get_computed_blocks([0, 1, 9]) == ([], 0)
    assert bm.get_computed_blocks([2, 3, 9])[1] == 2
    assert bm.num_cached_blocks == 1


def test_free_releases_tail_blocks_first() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    prompt = [0, 1, 2, 3]
    run_prompt(bm, "a", prompt)
    head = bm.block_table("a")[0]
    bm.free("a")

    assert bm.allocate_slots("c", 1)
    assert bm.get_computed_blocks([*prompt, 9]) == ([head], 2)


def test_uncached_free_blocks_are_handed_out_before_cached_ones() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    run_prompt(bm, "a", [0, 1])
    cached = bm.block_table("a")[0]
    assert bm.allocate_slots("b", 1)
    bm.free("a")
    bm.free("b")

    # The cached block was freed first, yet both uncached blocks go before it.
    assert bm.allocate_slots("c", 4)
    assert cached not in bm.block_table("c")
    assert bm.get_computed_blocks([0, 1, 9]) == ([cached], 2)


def test_failed_allocation_changes_nothing_and_counts_revived_blocks() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    prompt = [0, 1, 2, 3, 4]
    run_prompt(bm, "a", prompt[:4])
    bm.free("a")
    assert bm.allocate_slots("d", 1)
    hits, num_hit = bm.get_computed_blocks(prompt)
    assert num_hit == 4
    free_before = bm.num_free_blocks

    # Two cached-but-free hits plus one new block exceed the two free blocks.
    assert not bm.allocate_slots("b", 5, hits)
    assert bm.block_table("b") == []
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (free_before, 2)
    assert bm.get_computed_blocks(prompt) == (hits, 4)

    bm.free("d")
    assert bm.allocate_slots("b", 5, hits)
    assert bm.block_table("b")[:2] == hits
    assert bm.num_free_blocks == 0


def test_prefix_caching_off_never_hits() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    prompt = [0, 1, 2, 3, 4]
    run_prompt(bm, "a", prompt)
    bm.free("a")
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(prompt) == ([], 0)
    assert run_prompt(bm, "b", prompt) == []


def test_hash_collisions_never_give_a_wrong_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_manager, "block_hash", lambda parent_key, tokens: 7)
    bm = BlockManager(num_blocks=8, block_size=2)
    run_prompt(bm, "a", [0, 0, 1, 1, 5])
    # All blocks share one key: only the first is registered, and a chain cannot reuse it at another position.
    assert bm.num_cached_blocks == 1
    assert bm.get_computed_blocks([1, 1, 9]) == ([], 0)
    assert bm.get_computed_blocks([0, 0, 0, 0, 9]) == (bm.block_table("a")[:1], 2)
    assert run_prompt(bm, "b", [0, 0, 0, 0, 9]) == bm.block_table("a")[:1]
    assert bm.get_computed_blocks([0, 0, 0, 0, 0, 0, 9]) == (bm.block_table("a")[:1], 2)


def test_collision_does_not_let_later_blocks_chain_onto_foreign_content(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(block_manager, "block_hash", collide_first_blocks)
    bm = BlockManager(num_blocks=8, block_size=2)
    run_prompt(bm, "a", [0, 0, 5, 5, 9])
    run_prompt(bm, "b", [1, 1, 6, 6, 9])
    assert bm.num_cached_blocks == 3
    assert bm.get_computed_blocks([0, 0, 6, 6, 9]) == (bm.block_table("a")[:1], 2)
    assert bm.get_computed_blocks([1, 1, 6, 6, 9]) == ([], 0)


def test_duplicate_content_chains_onto_the_registered_copy() -> None:
    bm = BlockManager(num_blocks=8, block_size=2)
    # Both compute [0, 1] on their own before either caches it, as two requests admitted in one step do.
    assert bm.allocate_slots("a", 3)
    assert bm.allocate_slots("b", 4)
    bm.cache_blocks("a", [0, 1, 2], 3)
    bm.cache_blocks("b", [0, 1, 2, 3], 4)
    assert bm.num_cached_blocks == 2
    hits, num_hit = bm.get_computed_blocks([0, 1, 2, 3, 9])
    assert (hits, num_hit) == ([bm.block_table("a")[0], bm.block_table("b")[1]], 4)


def test_invalid_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=2)
    with pytest.raises(ValueError):
        BlockManager(num_blocks=2, block_size=0)
    bm = BlockManager(num_blocks=4, block_size=2)
    run_prompt(bm, "a", [0, 1, 2])
    with pytest.raises(ValueError):
        bm.allocate_slots("b", -1)
    with pytest.raises(ValueError):
        bm.allocate_slots("a", 5, bm.block_table("a")[:1])
    with pytest.raises(ValueError):
        bm.allocate_slots("b", 4, [bm.block_table("a")[1]])
    with pytest.raises(ValueError):
        bm.allocate_slots("b", 4, [99])
    with pytest.raises(ValueError):
        bm.cache_blocks("nobody", [0, 1], 2)
    with pytest.raises(ValueError):
        bm.cache_blocks("a", [0, 1, 2], 4)
    with pytest.raises(ValueError):
        bm.record_prefix_lookup(2, 3)
    assert bm.block_table("b") == []


def test_record_prefix_lookup_accumulates() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    bm.record_prefix_lookup(10, 4)
    bm.record_prefix_lookup(5, 0)
    assert (bm.prefix_queries, bm.prefix_hits) == (15, 4)
    bm.free("never-seen")
    assert bm.num_blocks_needed(0) == 0 and bm.num_blocks_needed(3) == 2


@dataclass(slots=True)
class _Req:
    tokens: list[int]
    num_computed: int = 0
    blocks_seen: int = 0  # table entries whose KV content the shadow model already tracks


@dataclass(slots=True)
class _Shadow:
    """What KV each block physically holds: the full token prefix up to the block's end, once written."""

    content: dict[int, tuple[int, ...] | None] = field(default_factory=dict)


vocab = st.integers(0, 3)


def derived_prompt(prompts: list[list[int]], base: int, cut: int, suffix: list[int]) -> list[int]:
    """A new prompt for a state machine: a cut of an earlier one (so prefixes are shared), then suffix; kept in
    prompts unless empty."""
    prefix: list[int] = []
    if prompts:
        earlier = prompts[base % len(prompts)]
        prefix = earlier[: cut % (len(earlier) + 1)]
    prompt = prefix + suffix
    if prompt:
        prompts.append(prompt)
    return prompt


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions, steps and frees against a shadow of what KV every block really holds."""

    def __init__(self) -> None:
        super().__init__()
        self.reqs: dict[str, _Req] = {}
        self.prompts: list[list[int]] = []
        self.shadow = _Shadow()
        self.next_id = 0
        self.real_hash = block_manager.block_hash

    @initialize(
        num_blocks=st.integers(1, 16),
        block_size=st.integers(1, 4),
        caching=st.booleans(),
        hash_mode=st.sampled_from(["real", "real", "constant", "mod3", "first"]),
    )
    def setup(self, num_blocks: int, block_size: int, caching: bool, hash_mode: str) -> None:
        # Weak hashes make collisions common, which must never turn into a wrong hit.
        if hash_mode == "constant":
            block_manager.block_hash = lambda parent_key, tokens: 0
        elif hash_mode == "mod3":
            block_manager.block_hash = lambda parent_key, tokens: self.real_hash(parent_key, tokens) % 3
        elif hash_mode == "first":
            block_manager.block_hash = collide_first_blocks
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)

    def teardown(self) -> None:
        block_manager.block_hash = self.real_hash

    def _snapshot(self) -> tuple[object, ...]:
        bm = self.bm
        tables = {rid: list(bm.block_table(rid)) for rid in self.reqs}
        return tables, list(bm._free), dict(bm._cached), bm.num_used_blocks

    def _advance(self, rid: str, chunk: int, computed_blocks: list[int]) -> bool:
        req = self.reqs[rid]
        target = min(len(req.tokens), req.num_computed + chunk)
        before = self._snapshot()
        if not self.bm.allocate_slots(rid, target, computed_blocks):
            assert self._snapshot() == before
            return False
        table = self.bm.block_table(rid)
        for block_id in table[req.blocks_seen :]:
            if block_id not in computed_blocks:
                self.shadow.content[block_id] = None
        req.blocks_seen = len(table)
        req.num_computed = target
        size = self.bm.block_size
        for i in range(target // size):
            written = tuple(req.tokens[: (i + 1) * size])
            assert self.shadow.content.get(table[i]) in (None, written)
            self.shadow.content[table[i]] = written
        self.bm.cache_blocks(rid, req.tokens, req.num_computed)
        if req.num_computed == len(req.tokens):
            req.tokens.append(len(req.tokens) % 4)
        return True

    @rule(
        base=st.integers(0, 1000),
        cut=st.integers(0, 1000),
        suffix=st.lists(vocab, max_size=8),
        chunk=st.integers(1, 12),
    )
    def add(self, base: int, cut: int, suffix: list[int], chunk: int) -> None:
        prompt = derived_prompt(self.prompts, base, cut, suffix)
        if not prompt:
            return
        hits, num_hit = self.bm.get_computed_blocks(prompt)
        size = self.bm.block_size
        assert num_hit == len(hits) * size <= len(prompt) - 1
        assert len(set(hits)) == len(hits)
        for i, block_id in enumerate(hits):
            assert self.shadow.content.get(block_id) == tuple(prompt[: (i + 1) * size])
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.reqs[rid] = _Req(tokens=list(prompt), num_computed=num_hit)
        if self._advance(rid, chunk, hits):
            self.bm.record_prefix_lookup(len(prompt), num_hit)
        else:
            assert self.bm.block_table(rid) == []
            del self.reqs[rid]

    @precondition(lambda self: bool(self.reqs))
    @rule(pick=st.integers(0, 1000), chunk=st.integers(1, 6))
    def step(self, pick: int, chunk: int) -> None:
        rid = sorted(self.reqs)[pick % len(self.reqs)]
        self._advance(rid, chunk, [])

    @precondition(lambda self: bool(self.reqs))
    @rule(pick=st.integers(0, 1000))
    def finish(self, pick: int) -> None:
        rid = sorted(self.reqs)[pick % len(self.reqs)]
        self.bm.free(rid)
        del self.reqs[rid]
        assert self.bm.block_table(rid) == []

    @rule()
    def free_everything(self) -> None:
        for rid in list(self.reqs):
            self.bm.free(rid)
        self.reqs.clear()
        assert (self.bm.num_used_blocks, self.bm.num_free_blocks) == (0, self.bm.num_blocks)

    @invariant()
    def accounting_holds(self) -> None:
        bm = self.bm
        holders: dict[int, list[tuple[str, int]]] = {}
        for rid in self.reqs:
            table = bm.block_table(rid)
            assert len(set(table)) == len(table)
            assert len(table) >= bm.num_blocks_needed(self.reqs[rid].num_computed)
            for i, block_id in enumerate(table):
                holders.setdefault(block_id, []).append((rid, i))
        refs = Counter({block_id: len(held) for block_id, held in holders.items()})
        assert all(block.ref_count == refs[block_id] for block_id, block in all_blocks(bm).items())
        assert sum(block.ref_count for block in all_blocks(bm).values()) == sum(refs.values())
        unreferenced = {block_id for block_id, block in all_blocks(bm).items() if block.ref_count == 0}
        assert set(bm._free) == unreferenced
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert bm.num_used_blocks == len(holders)
        assert bm.num_cached_blocks == sum(block.key is not None for block in all_blocks(bm).values())
        if not self.reqs:
            assert (bm.num_used_blocks, bm.num_free_blocks) == (0, bm.num_blocks)

    @invariant()
    def shared_blocks_hold_the_same_prefix(self) -> None:
        size = self.bm.block_size
        for rid in self.reqs:
            for i, block_id in enumerate(self.bm.block_table(rid)):
                others = [r for r in self.reqs if r != rid and block_id in self.bm.block_table(r)]
                if not others:
                    continue
                assert self.bm._blocks[block_id].key is not None
                for holder in [rid, *others]:
                    assert self.bm.block_table(holder).index(block_id) == i
                    assert tuple(self.reqs[holder].tokens[: (i + 1) * size]) == self.shadow.content[block_id]


BlockManagerMachine.TestCase.settings = settings(max_examples=200, deadline=None, stateful_step_count=40)
TestBlockManagerMachine = BlockManagerMachine.TestCase


@pytest.mark.parametrize("caching", [False, True])
def test_blocks_behind_a_window_are_given_back_once_and_the_rest_at_the_end(caching: bool) -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=caching)
    tokens = list(range(20))
    assert bm.allocate_slots("a", 20)
    bm.cache_blocks("a", tokens, 20)
    bm.release_before("a", 9)  # tokens 0..8: blocks 0 and 1 lie wholly before token 9
    assert bm.num_free_blocks == 8 - 5 + 2 and bm.num_released_blocks == 2
    bm.release_before("a", 6)  # behind what was already given back: nothing more
    assert bm.num_free_blocks == 5 and bm.num_slots("a") == 20, "the table still counts every token"
    assert bm.allocate_slots("a", 24)
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.num_used_blocks == 0


def test_with_prefix_caching_only_registered_blocks_are_given_back() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    assert bm.allocate_slots("a", 16)
    bm.cache_blocks("a", list(range(16)), 4)  # one full block computed and registered
    bm.release_before("a", 12)
    assert bm.num_released_blocks == 1, "blocks not yet in the prefix cache stay until they are"


def test_a_blocks_record_is_made_at_its_first_use_and_ids_outside_the_pool_are_refused() -> None:
    bm = BlockManager(num_blocks=1 << 20, block_size=16)  # a tiny model's pool: a million blocks
    assert len(bm._blocks) == 0
    assert bm.allocate_slots("r", 40)
    assert sorted(bm._blocks) == sorted(bm.block_table("r")) and bm.num_free_blocks == (1 << 20) - 3
    for outside in (-1, 1 << 20):
        with pytest.raises(IndexError, match="outside"):
            bm._blocks[outside]
