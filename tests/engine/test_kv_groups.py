"""KV layer groups (engine.sched.kv_groups): the plan that cuts a model's layers into groups of one kind, and the
block manager whose requests hold a table per group, all from one pool."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.sched.kv_groups import SKIPPED, GroupedBlockManager, KVGroups
from tests.engine.test_block_manager import all_blocks, derived_prompt


def test_alike_layers_make_one_group_of_every_layer() -> None:
    plain = KVGroups.plan([None] * 4)
    assert plain.count == 1 and plain.size == 4 and plain.layer_slot == (0, 1, 2, 3) and not plain.reclaims
    mistral = KVGroups.plan([32] * 3)
    assert mistral.windows == (32,) and mistral.reclaims and mistral.layer_group == (0, 0, 0)


def test_mixed_layers_are_cut_into_groups_of_the_smallest_kind_global_first() -> None:
    # Gemma 3's pattern: five windowed layers, then a global one.
    windows = [512, 512, 512, 512, 512, None] * 2 + [512, 512]
    groups = KVGroups.plan(windows)
    assert groups.size == 2 and groups.windows == (None, 512, 512, 512, 512, 512, 512)
    assert groups.layer_group[5] == groups.layer_group[11] == 0 and {groups.layer_slot[5], groups.layer_slot[11]} == {
        0,
        1,
    }
    # Every (group, slot) is one layer's: no two layers write the same place of a page.
    places = list(zip(groups.layer_group, groups.layer_slot, strict=True))
    assert len(set(places)) == len(windows)
    assert "7 groups of 2 layers" in groups.describe()


def test_a_request_takes_a_block_in_every_group_and_the_windowed_ones_give_theirs_back() -> None:
    bm = GroupedBlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False, windows=(None, 4))
    assert bm.capacity_tokens == 24
    assert bm.allocate_slots("a", 16)
    global_table, windowed_table = bm.tables("a")
    assert len(global_table) == len(windowed_table) == 4 and not set(global_table) & set(windowed_table)
    assert bm.num_free_blocks == 4 and bm.block_table("a") == global_table and bm.num_slots("a") == 16
    bm.release_behind("a", 16)  # the next query, at 16, sees 13..16: blocks 0-2 of the windowed table go
    assert bm.num_free_blocks == 7 and bm.num_released_blocks == 3
    # All or nothing: 8 more tokens need 2 blocks in each group, 4 in all; 7 are free.
    assert bm.allocate_slots("a", 24)
    assert not bm.allocate_slots("b", 16), "4 + 4 blocks wanted, 3 free: nothing taken"
    assert bm.num_free_blocks == 3 and bm.tables("b") == [[], []]
    bm.free("a")
    assert bm.num_free_blocks == 12 and bm.num_used_blocks == 0


@pytest.mark.parametrize("windows", [(None, 8), (None, None, 8)])
def test_a_prefix_hit_is_what_every_group_still_holds(windows: tuple[int | None, ...]) -> None:
    bm = GroupedBlockManager(num_blocks=30, block_size=4, enable_prefix_caching=True, windows=windows)
    prompt = list(range(100, 121))  # 21 tokens: 5 full blocks, the 21st token always computed
    assert bm.allocate_slots("a", len(prompt))
    bm.cache_blocks("a", prompt, len(prompt))
    a_tables = bm.tables("a")
    bm.free("a")
    hits, covered = bm.get_computed_blocks(prompt)
    assert covered == 20 and len(hits) == 5 * len(windows)
    # The windowed group's first query (position 20, window 8) sees tokens 13..20: blocks 3 and 4 only.
    assert hits[-5:] == [SKIPPED, SKIPPED, SKIPPED, *a_tables[-1][3:5]]
    assert hits[:5] == a_tables[0][:5]
    assert bm.allocate_slots("b", len(prompt), hits)
    b_tables = bm.tables("b")
    assert b_tables[0][:5] == a_tables[0][:5] and b_tables[-1][3:5] == a_tables[-1][3:5]
    assert bm.num_used_blocks == 6 * len(windows) - 3, "nothing taken for the skipped places"
    bm.free("b")
    assert bm.num_used_blocks == 0
    # The windowed group's early blocks evicted: no loss. Its block 3 evicted: the prefix that group can
    # take ends where its window needs nothing evicted (2 blocks: position 8 sees tokens 1..8, blocks 0-1).
    early, needed = a_tables[-1][0], a_tables[-1][3]
    while needed in bm._free:  # take free blocks, oldest first, until that one is reused
        assert bm.allocate_slots("filler", bm.num_slots("filler") + 4)
    assert early not in bm._free
    hits, covered = bm.get_computed_blocks(prompt)
    assert covered < 20 and needed not in hits


def test_a_windowed_block_from_another_prefix_is_never_a_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A windowed group skips the blocks its window cannot see, so it cannot check its chain back to the start:
    under a hash that ignores the chain (collisions made easy), prompts that differ only in their first block
    give their later windowed blocks the same keys. The anchor to group 0's chain still tells them apart."""
    from engine.sched import block_manager, kv_groups

    def weak(parent_key: int | None, tokens: tuple[int, ...]) -> int:
        return hash(tokens)

    monkeypatch.setattr(block_manager, "block_hash", weak)
    monkeypatch.setattr(kv_groups, "block_hash", weak)
    bm = GroupedBlockManager(num_blocks=40, block_size=4, enable_prefix_caching=True, windows=(None, 4))
    other, mine = [9, 9, 9, 9, *range(50, 67)], [1, 2, 3, 4, *range(50, 67)]
    for rid, prompt in (("other", other), ("mine", mine)):
        assert bm.allocate_slots(rid, len(prompt))
        bm.cache_blocks(rid, prompt, len(prompt))
    others = set(bm.tables("other")[1])
    bm.free("other")
    bm.free("mine")
    hits, covered = bm.get_computed_blocks(mine)
    assert not others & set(hits), "a windowed block computed after another first block was taken"
    assert covered == 0  # mine's own windowed blocks lost their keys to other's: nothing to prove them


def test_groups_never_share_a_cached_block() -> None:
    """Group 1 holds other layers than group 0: the same tokens are two blocks, never one hit for both."""
    bm = GroupedBlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True, windows=(None, 4))
    assert bm.allocate_slots("a", 5)
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    g0, g1 = bm.tables("a")
    assert bm.num_cached_blocks == 4 and not set(g0) & set(g1)
    with pytest.raises(ValueError, match="root"):
        bm.allocate_slots("b", 5, g1[:2] + g1[:2])  # group 1's chain offered as group 0's


class GroupedBlocksMachine(RuleBasedStateMachine):
    """Random admissions, steps (each followed by the windowed groups giving back what their next query cannot
    see) and frees against a shadow of what every block holds: its group's layers for a token prefix. A prefix hit
    must never hand a group a block of another group or of another prefix, under weak hashes too."""

    def __init__(self) -> None:
        super().__init__()
        self.reqs: dict[str, list[int]] = {}  # tokens
        self.computed: dict[str, int] = {}
        self.prompts: list[list[int]] = []
        self.content: dict[int, tuple[int, tuple[int, ...]] | None] = {}
        self.next_id = 0

    @initialize(
        num_blocks=st.integers(2, 24),
        block_size=st.integers(1, 4),
        caching=st.booleans(),
        windows=st.sampled_from([(None, 1), (None, 3), (None, 6), (None, None, 4), (None, 2, 5), (3, 5)]),
        weak=st.sampled_from([None, None, "mod3", "chainless"]),
    )
    def setup(
        self, num_blocks: int, block_size: int, caching: bool, windows: tuple[int | None, ...], weak: str | None
    ) -> None:
        from engine.sched import block_manager, kv_groups

        self.real_hash = block_manager.block_hash
        real = self.real_hash
        if weak is not None:

            def weak_hash(parent_key: int | None, tokens: tuple[int, ...]) -> int:
                return real(parent_key, tokens) % 3 if weak == "mod3" else real(None, tokens)

            block_manager.block_hash = kv_groups.block_hash = weak_hash
        self.bm = GroupedBlockManager(num_blocks, block_size, caching, windows)

    def teardown(self) -> None:
        from engine.sched import block_manager, kv_groups

        block_manager.block_hash = kv_groups.block_hash = self.real_hash

    def _held(self, rid: str) -> list[list[tuple[int, int]]]:
        """Per group, the (place, block) entries the request holds: those not skipped or given back."""
        out = []
        for gid in self.bm._ids(rid):
            state = self.bm._requests.get(gid)
            out.append([] if state is None else list(enumerate(state.table))[state.num_released :])
        return out

    def _snapshot(self) -> tuple[object, ...]:
        bm = self.bm
        return {r: bm.tables(r) for r in self.reqs}, list(bm._free), dict(bm._cached), bm.num_used_blocks

    def _advance(self, rid: str, chunk: int, hits: list[int]) -> bool:
        tokens, size = self.reqs[rid], self.bm.block_size
        target = min(len(tokens), self.computed[rid] + chunk)
        before = self._snapshot()
        if not self.bm.allocate_slots(rid, target, hits):
            assert self._snapshot() == before, "a refused allocation changed something"
            return False
        attached = set(hits)
        for g, held in enumerate(self._held(rid)):
            for i, block_id in held:
                if block_id not in attached and (i + 1) * size > self.computed[rid]:
                    self.content[block_id] = None  # a new block: nothing written yet
                if (i + 1) * size <= target:
                    written = (g, tuple(tokens[: (i + 1) * size]))
                    assert self.content.get(block_id) in (None, written), "a held block holds other KV"
                    self.content[block_id] = written
        self.computed[rid] = target
        self.bm.cache_blocks(rid, tokens, target)
        self.bm.release_behind(rid, target)
        if target == len(tokens):
            tokens.append(len(tokens) % 3)
        return True

    @rule(base=st.integers(0, 1000), cut=st.integers(0, 1000), suffix=st.lists(st.integers(0, 2), max_size=8),
          chunk=st.integers(1, 12))  # fmt: skip
    def add(self, base: int, cut: int, suffix: list[int], chunk: int) -> None:
        prompt = derived_prompt(self.prompts, base, cut, suffix)
        if not prompt:
            return
        bm, size = self.bm, self.bm.block_size
        hits, covered = bm.get_computed_blocks(prompt)
        groups = len(bm.windows)
        n = len(hits) // groups
        assert covered == n * size <= len(prompt) - 1 and len(hits) == n * groups
        for g, window in enumerate(bm.windows):
            for i, block_id in enumerate(hits[g * n : (g + 1) * n]):
                if block_id == SKIPPED:
                    assert g > 0 and window is not None and (i + 1) * size <= covered - window + 1, "a seen place"
                else:
                    assert self.content.get(block_id) == (g, tuple(prompt[: (i + 1) * size])), "a wrong hit"
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.reqs[rid], self.computed[rid] = list(prompt), covered
        if not self._advance(rid, chunk, hits):
            assert bm.tables(rid) == [[] for _ in bm.windows]
            del self.reqs[rid], self.computed[rid]

    @precondition(lambda self: bool(self.reqs))
    @rule(pick=st.integers(0, 1000), chunk=st.integers(1, 6))
    def step(self, pick: int, chunk: int) -> None:
        self._advance(sorted(self.reqs)[pick % len(self.reqs)], chunk, [])

    @precondition(lambda self: bool(self.reqs))
    @rule(pick=st.integers(0, 1000))
    def finish(self, pick: int) -> None:
        rid = sorted(self.reqs)[pick % len(self.reqs)]
        self.bm.free(rid)
        del self.reqs[rid], self.computed[rid]

    @invariant()
    def every_block_is_counted_once_per_holder(self) -> None:
        bm = self.bm
        holders: Counter[int] = Counter(b for rid in self.reqs for held in self._held(rid) for _, b in held)
        assert all(block.ref_count == holders[b] for b, block in all_blocks(bm).items())
        assert set(bm._free) == {b for b, block in all_blocks(bm).items() if block.ref_count == 0}
        assert bm.num_used_blocks == len(holders)
        if not self.reqs:
            assert bm.num_free_blocks == bm.num_blocks


GroupedBlocksMachine.TestCase.settings = settings(max_examples=200, deadline=None, stateful_step_count=40)
TestGroupedBlocksMachine = GroupedBlocksMachine.TestCase
