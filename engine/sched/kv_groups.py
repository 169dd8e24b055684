"""KV layer groups: how a model whose layers attend differently (some through a sliding window, some over the
whole context: Gemma 2 and 3, gpt-oss) shares one pool of blocks, so that blocks behind the window are given back
by the layers that slide while the layers that attend fully keep theirs.

The design (vLLM's hybrid allocator does the same): the layers are cut into groups of equal size, each group of
one kind (one window, or none); a pool block (a page) holds one group's layers for block_size tokens, and every
request has one block table per group, all drawn from the one free list. A windowed group's table gives back the
blocks wholly behind its window as the request advances; a global group's keeps them to the end. With one kind of
layer there is one group of every layer: the plain paged pool, unchanged.

Why not a ring per windowed layer, or two pools: a ring would need its own addressing in every attention path
(the compiled kernel, the torch paths, prefix caching) and two pools need a split decided before the traffic is
known (long chats want global blocks, many short ones windowed ones); pages of one size in one free list need
neither. The cost is padding: a kind whose layer count is not a multiple of the group size leaves the last
group's pages partly unused (Gemma 3's 22 windowed and 4 global layers: 6 groups of 4 for 22 layers, 2 of 28
layer slots idle, 7%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.sched.block_manager import BlockManager, _RequestState, block_hash

# A place in a windowed group's prefix hits that its first query cannot see: no block is taken for it.
SKIPPED = -1


@dataclass(frozen=True, slots=True)
class KVGroups:
    """layer_group[l]: layer l's group; layer_slot[l]: its place in that group's pages (0..size-1); windows[g]:
    group g's sliding window, None for a group that attends fully."""

    layer_group: tuple[int, ...]
    layer_slot: tuple[int, ...]
    windows: tuple[int | None, ...]
    size: int  # layers in a page

    @classmethod
    def plan(cls, layer_windows: Sequence[int | None]) -> KVGroups:
        """Groups for layers with these windows (None: full attention): one group where every layer is alike,
        else groups as large as the smallest kind's layer count."""
        kinds: dict[int | None, list[int]] = {}
        for layer, window in enumerate(layer_windows):
            kinds.setdefault(window, []).append(layer)
        if len(kinds) <= 1:
            n = len(layer_windows)
            window = layer_windows[0] if n else None
            return cls((0,) * n, tuple(range(n)), (window,), max(n, 1))
        size = min(len(layers) for layers in kinds.values())
        group, slot = [0] * len(layer_windows), [0] * len(layer_windows)
        windows: list[int | None] = []
        # Global layers first, so group 0 is a global one: the table that counts a request's tokens.
        for window in sorted(kinds, key=lambda w: (w is not None, w or 0)):
            layers = kinds[window]
            for start in range(0, len(layers), size):
                for i, layer in enumerate(layers[start : start + size]):
                    group[layer], slot[layer] = len(windows), i
                windows.append(window)
        return cls(tuple(group), tuple(slot), tuple(windows), size)

    @property
    def count(self) -> int:
        return len(self.windows)

    @property
    def reclaims(self) -> bool:
        """Whether any group gives blocks back as its requests advance."""
        return any(w is not None for w in self.windows)

    def describe(self) -> str:
        if self.count == 1:
            reach = "every token" if self.windows[0] is None else f"the last {self.windows[0]} tokens"
            return f"one group of {self.size} layers keeping {reach}"
        windowed = sum(w is not None for w in self.windows)
        reaches = ", ".join(str(w) for w in sorted({w for w in self.windows if w is not None}))
        return (
            f"{self.count} groups of {self.size} layers a page: {self.count - windowed} keep every token, "
            f"{windowed} give back blocks behind their window ({reaches})"
        )


class GroupedBlockManager(BlockManager):
    """A block manager whose requests hold one table per KV group (engine.sched.kv_groups), all from one pool.

    What the scheduler sees is unchanged: a request's blocks are allocated, cached, promised and freed in every
    group at once (all or nothing); a prefix hit is the prefix every group still holds; block_table and num_slots
    are group 0's (a global group where there is one). Groups other than 0 keep their tables under the request id
    plus the group number and chain their prefix-cache keys from a root of their own; their cached blocks carry
    an anchor (their group and group 0's chain at their place), the only proof a hit of theirs is taken on, so no
    group is ever handed a block of another group's layers or of another prefix."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        windows: Sequence[int | None] = (None,),
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        if not windows:
            raise ValueError("a block manager needs at least one group")
        self.windows = tuple(windows)
        # Group 0 chains from None as a lone block manager does; the others from a key no token block has.
        self._roots: tuple[int | None, ...] = (None, *(block_hash(None, (-1, g)) for g in range(1, len(windows))))

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request could hold if it had the pool to itself: every group holds its whole table while a
        step computes."""
        return self.num_blocks // len(self.windows) * self.block_size

    def _ids(self, request_id: str) -> list[str]:
        return [request_id] + [f"{request_id}\x1f{g}" for g in range(1, len(self.windows))]

    def tables(self, request_id: str) -> list[list[int]]:
        """The request's block table in every group, group 0 first."""
        if len(self.windows) == 1:
            return [self.block_table(request_id)]
        return [self.block_table(rid) for rid in self._ids(request_id)]

    def get_computed_blocks(self, token_ids: Sequence[int], root: int | None = None) -> tuple[list[int], int]:
        """The longest prefix every group can take, each group's blocks for it concatenated group by group.

        Group 0's hits are a lone block manager's (its chain proves the prefix). The other groups' blocks are
        proved by their anchor, group 0's chain at the same place (their own keys could collide with any
        group's): a group that attends fully needs every block of the prefix; a windowed one only those its
        first computed query can see, its earlier places given as SKIPPED (never read, never taken), so a shared
        system prompt still hits after those blocks were given back and reused."""
        if len(self.windows) == 1:
            return super().get_computed_blocks(token_ids)
        first = super().get_computed_blocks(token_ids)[0]
        anchors = [self._blocks[b].serial for b in first]
        n, found = len(first), [first]
        while True:
            found = [first[:n]] + [self._group_hits(token_ids, g, anchors, n) for g in range(1, len(self.windows))]
            shortest = min(len(hits) for hits in found)
            if shortest == n:
                return [b for hits in found for b in hits], n * self.block_size
            n = shortest

    def _group_hits(self, token_ids: Sequence[int], group: int, anchors: list[int | None], n: int) -> list[int]:
        """Group `group`'s blocks for the longest prefix of at most n blocks it can take."""
        window, size = self.windows[group], self.block_size
        keys: list[int] = []
        key = self._roots[group]
        for i in range(n):
            key = block_hash(key, tuple(token_ids[i * size : (i + 1) * size]))
            keys.append(key)
        for m in range(n, 0, -1):
            # The first query computed, at position m * size, sees keys from m * size - window + 1 on.
            lo = 0 if window is None else min(max(0, m * size - window + 1) // size, m - 1)
            blocks = [self._proved(keys[i], group, anchors[i]) for i in range(lo, m)]
            if None not in blocks:
                return [SKIPPED] * lo + blocks  # type: ignore[operator]
        return []

    def _proved(self, key: int, group: int, anchor: int | None) -> int | None:
        """The cached block of this key that this group registered at group 0's anchor, or None."""
        block_id = self._cached.get(key)
        if block_id is None or anchor is None or self._blocks[block_id].anchor != (group, anchor):
            return None
        return block_id

    def awaits_prefix(self, token_ids: Sequence[int], hit_blocks: Sequence[int], root: int | None = None) -> bool:
        """Group 0 decides: every group promises the same blocks."""
        return super().awaits_prefix(token_ids, hit_blocks[: len(hit_blocks) // len(self.windows)], self._roots[0])

    def allocate_slots(
        self, request_id: str, num_tokens: int, computed_blocks: Sequence[int] = (), root: int | None = None
    ) -> bool:
        if len(self.windows) == 1:
            return super().allocate_slots(request_id, num_tokens, computed_blocks)
        if not computed_blocks and 0 <= num_tokens <= self.num_slots(request_id):
            return True  # a decode step inside its last block (every group's table is as long)
        n = len(computed_blocks) // len(self.windows)
        parts = [computed_blocks[g * n : (g + 1) * n] for g in range(len(self.windows))]
        ids = self._ids(request_id)
        need = sum(self.blocks_to_allocate(rid, num_tokens, hits) for rid, hits in zip(ids, parts, strict=True))
        if need > self.num_free_blocks:
            return False
        # Every group's hits first: a new block taken for one group must not evict another group's hit.
        for rid, hits, r in zip(ids, parts, self._roots, strict=True):
            if hits and hits[0] == SKIPPED:
                self._attach_window(rid, hits)
            elif hits or self.num_slots(rid) == 0:
                super().allocate_slots(rid, len(hits) * self.block_size, hits, r)
        for rid in ids:
            allocated = super().allocate_slots(rid, num_tokens)
            assert allocated, "counted free blocks fell short"
        return True

    def _attach_window(self, request_id: str, hits: Sequence[int]) -> None:
        """A windowed group's prefix hits (_group_hits): the places it skips stand as given back."""
        if request_id in self._requests:
            raise ValueError(f"prefix hits given for request {request_id!r} that already has blocks")
        skipped = sum(1 for b in hits if b == SKIPPED)
        state = self._requests[request_id] = _RequestState(table=[0] * skipped, num_released=skipped)
        for block_id in hits[skipped:]:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            state.table.append(block_id)
        last = self._blocks[hits[-1]]
        state.num_cached, state.last_key, state.last_serial = len(hits), last.key, last.serial

    def promise(self, request_id: str, token_ids: Sequence[int]) -> None:
        for rid in self._ids(request_id):
            super().promise(rid, token_ids)

    def cache_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_computed_tokens: int,
        anchors: Sequence[int | None] = (),
        group: int = 0,
    ) -> None:
        """Every group's full blocks; groups other than 0 anchored to group 0's chain."""
        ids = self._ids(request_id)
        super().cache_blocks(ids[0], token_ids, num_computed_tokens)
        first = self._requests.get(ids[0])
        chain = first.chain if first is not None else []
        for g, rid in enumerate(ids[1:], 1):
            super().cache_blocks(rid, token_ids, num_computed_tokens, chain, g)

    def free(self, request_id: str) -> None:
        for rid in self._ids(request_id):
            super().free(rid)

    def release_behind(self, request_id: str, num_computed_tokens: int) -> None:
        """After a step: each windowed group gives back the blocks its next query (at num_computed_tokens) can no
        longer see (it sees keys from num_computed_tokens - window + 1 on)."""
        for rid, window in zip(self._ids(request_id), self.windows, strict=True):
            if window is not None:
                self.release_before(rid, num_computed_tokens - window + 1)
