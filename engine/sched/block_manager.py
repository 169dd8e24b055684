"""Paged KV block manager: owns every request's block table, block reference counts and the prefix cache."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hash(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    """Prefix-cache key of a full block, chained from its parent's key; module-level so tests can patch it."""
    return hash((parent_key, tokens))


@dataclass(slots=True)
class _Block:
    ref_count: int = 0
    # The fields below are set only while the block is registered in the prefix-cache map.
    key: int | None = None
    tokens: tuple[int, ...] = ()
    # Serials are never reused, so a child whose parent_serial equals the matched parent's serial proves the
    # whole chain; comparing parent keys could not, once keys collide or get re-registered for other content.
    serial: int | None = None
    parent_serial: int | None = None
    # Where layers are grouped (engine.sched.kv_groups): this block's group and the serial of group 0's block at
    # the same place in the chain when it was registered, which proves it without its parents.
    anchor: tuple[int, int | None] | None = None


class _Blocks(dict[int, _Block]):
    """Block id -> its record, made at its first use: a small model's pool is a quarter of a million blocks, and
    making every record up front cost a second of each engine start (the collector walking the loaded heap)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__()
        self.num_blocks = num_blocks

    def __missing__(self, block_id: int) -> _Block:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} outside 0..{self.num_blocks - 1}")
        block = self[block_id] = _Block()
        return block


@dataclass(slots=True)
class _RequestState:
    table: list[int] = field(default_factory=list)
    num_cached: int = 0  # leading blocks cache_blocks has already handled
    last_key: int | None = None  # chain key of the last handled block
    last_serial: int | None = None  # chain identity of the last handled block's content
    promised: list[int] = field(default_factory=list)  # keys of the full blocks it announced (promise)
    num_released: int = 0  # leading blocks given back early (release_before); their entries are never read
    chain: list[int | None] = field(default_factory=list)  # the chain identity (serial) of each handled block


class BlockManager:
    """Hands out KV blocks, shares full cached blocks between equal prefixes and evicts them lazily."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._blocks = _Blocks(num_blocks)
        # Blocks with ref_count 0 in eviction order (head first); an ordered dict gives O(1) removal from the
        # middle when a cached block is revived by a prefix hit.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # key -> block id
        # Full blocks a running request is computing: key -> that request's id (promise, awaits_prefix).
        self._promised: dict[int, str] = {}
        self._requests: dict[str, _RequestState] = {}
        self._serials = itertools.count()
        self.num_released_blocks = 0  # blocks given back before their request ended (release_before)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def num_blocks_needed(self, num_tokens: int) -> int:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.block_size)

    def num_slots(self, request_id: str) -> int:
        """How many tokens request_id's blocks hold (0 for a request without blocks)."""
        state = self._requests.get(request_id)
        return len(state.table) * self.block_size if state is not None else 0

    def block_table(self, request_id: str) -> list[int]:
        state = self._requests.get(request_id)
        return state.table if state is not None else []

    def record_prefix_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        if not 0 <= num_hit_tokens <= num_queried_tokens:
            raise ValueError(f"need 0 <= hit ({num_hit_tokens}) <= queried ({num_queried_tokens}) tokens")
        self.prefix_queries += num_queried_tokens
        self.prefix_hits += num_hit_tokens

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request could hold if it had the pool to itself."""
        return self.num_blocks * self.block_size

    def get_computed_blocks(self, token_ids: Sequence[int], root: int | None = None) -> tuple[list[int], int]:
        """Longest cached run of full blocks matching a prefix of token_ids, always leaving the last token
        to compute so the model has logits to sample from. Returns (block_ids, num_tokens_covered). root: the
        key the chain starts from (engine.sched.kv_groups: one per layer group)."""
        if not self.enable_prefix_caching:
            return [], 0
        size = self.block_size
        hits: list[int] = []
        parent_key: int | None = root
        parent_serial: int | None = None
        for i in range(max(0, len(token_ids) - 1) // size):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            key = block_hash(parent_key, tokens)
            block_id = self._cached.get(key)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.tokens != tokens or block.parent_serial != parent_serial:
                break
            hits.append(block_id)
            parent_key, parent_serial = key, block.serial
        return hits, len(hits) * size

    def promise(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Announce the full blocks of token_ids that request_id, just seated with its prefix hits attached, is
        going to compute, until cache_blocks registers them or the request is freed."""
        if not self.enable_prefix_caching:
            return
        state = self._requests.get(request_id)
        if state is None:
            raise ValueError(f"unknown request {request_id!r}")
        size = self.block_size
        key = state.last_key
        for i in range(state.num_cached, len(token_ids) // size):
            key = block_hash(key, tuple(token_ids[i * size : (i + 1) * size]))
            if self._promised.setdefault(key, request_id) == request_id:
                state.promised.append(key)

    def awaits_prefix(self, token_ids: Sequence[int], hit_blocks: Sequence[int], root: int | None = None) -> bool:
        """Whether the next block that could extend the prefix hits (get_computed_blocks) of token_ids is one a
        running request promised: waiting for it to be cached beats computing a copy of it. A hint only (a key
        collision costs a wait, never wrong KV): hits are still confirmed by content when they are taken."""
        if not self._promised:
            return False
        size, i = self.block_size, len(hit_blocks)
        if i >= max(0, len(token_ids) - 1) // size:  # the last token is always computed: no further hit
            return False
        parent_key = self._blocks[hit_blocks[-1]].key if hit_blocks else root
        return block_hash(parent_key, tuple(token_ids[i * size : (i + 1) * size])) in self._promised

    def blocks_to_allocate(self, request_id: str, num_tokens: int, computed_blocks: Sequence[int] = ()) -> int:
        """Free blocks allocate_slots would take: new ones, and prefix hits it would revive from the free list."""
        state = self._requests.get(request_id)
        table_len = len(state.table) if state is not None else 0
        num_new = max(0, self.num_blocks_needed(num_tokens) - table_len - len(computed_blocks))
        # A negative id stands for a block a windowed group does not need (engine.sched.kv_groups): none taken.
        return num_new + sum(1 for b in computed_blocks if b >= 0 and self._blocks[b].ref_count == 0)

    def allocate_slots(
        self, request_id: str, num_tokens: int, computed_blocks: Sequence[int] = (), root: int | None = None
    ) -> bool:
        """Grow request_id's table to hold num_tokens tokens in total, first attaching computed_blocks
        (first call only; root: the key their chain started from, get_computed_blocks'). All or nothing:
        returns False and changes nothing when free blocks fall short."""
        state = self._requests.get(request_id)
        if state is not None and not computed_blocks and 0 <= num_tokens <= len(state.table) * self.block_size:
            return True  # a decode step inside its last block: nearly every call, kept cheap
        table_len = len(state.table) if state is not None else 0
        if computed_blocks and table_len:
            raise ValueError(f"computed_blocks given for request {request_id!r} whose table is not empty")
        self._check_prefix_chain(computed_blocks, root)
        num_new = max(0, self.num_blocks_needed(num_tokens) - table_len - len(computed_blocks))
        num_revived = sum(1 for block_id in computed_blocks if self._blocks[block_id].ref_count == 0)
        if num_new + num_revived > len(self._free):
            return False
        if state is None:
            state = self._requests[request_id] = _RequestState(last_key=root)
        for block_id in computed_blocks:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            state.table.append(block_id)
        if computed_blocks:
            last = self._blocks[computed_blocks[-1]]
            state.num_cached, state.last_key, state.last_serial = len(computed_blocks), last.key, last.serial
            state.chain = [self._blocks[b].serial for b in computed_blocks]
        for _ in range(num_new):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.key is not None:
                self._evict(block_id)
            block.ref_count = 1
            state.table.append(block_id)
        return True

    def cache_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_computed_tokens: int,
        anchors: Sequence[int | None] = (),
        group: int = 0,
    ) -> None:
        """Register the request's full, fully computed blocks in the prefix cache; O(1) if none filled up.
        anchors: group 0's chain (engine.sched.kv_groups), each block registered here for `group` anchored to
        its place."""
        if not self.enable_prefix_caching:
            return
        state = self._requests.get(request_id)
        if state is None:
            raise ValueError(f"unknown request {request_id!r}")
        if not 0 <= num_computed_tokens <= len(token_ids):
            raise ValueError(f"num_computed_tokens {num_computed_tokens} outside 0..{len(token_ids)}")
        num_full = num_computed_tokens // self.block_size
        if num_full > len(state.table):
            raise ValueError(f"request {request_id!r} has computed more tokens than its blocks hold")
        size = self.block_size
        for i in range(state.num_cached, num_full):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            key = block_hash(state.last_key, tokens)
            if self._promised.get(key) == request_id:  # kept, it would only slow awaits_prefix down
                del self._promised[key]
            block_id = state.table[i]
            block = self._blocks[block_id]
            assert block.key is None, "only attached prefix hits are registered ahead of num_cached"
            owner_id = self._cached.get(key)
            if owner_id is None:
                block.key, block.tokens, block.parent_serial = key, tokens, state.last_serial
                block.serial = next(self._serials)
                block.anchor = (group, anchors[i]) if i < len(anchors) else None
                self._cached[key] = block_id
                state.last_serial = block.serial
            else:
                owner = self._blocks[owner_id]
                if owner.tokens == tokens and owner.parent_serial == state.last_serial:
                    # Same content cached by another request: chain later blocks onto that copy.
                    state.last_serial = owner.serial
                else:
                    # A hash collision: a fresh identity stops later blocks chaining onto foreign content.
                    state.last_serial = next(self._serials)
            state.last_key = key
            state.chain.append(state.last_serial)
        state.num_cached = max(state.num_cached, num_full)

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first, so its tail blocks are evicted before its head blocks."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        for key in state.promised:
            if self._promised.get(key) == request_id:
                del self._promised[key]
        for block_id in reversed(state.table[state.num_released :]):
            self._release(block_id)

    def release_before(self, request_id: str, num_tokens: int) -> None:
        """Give back the request's leading blocks that lie wholly before token num_tokens, beyond every layer's
        sliding window: their table entries stay (the table's length still counts the request's tokens) and are
        never read unmasked again. With prefix caching, only blocks already registered go, so they stay hits."""
        state = self._requests.get(request_id)
        if state is None:
            return
        stop = min(num_tokens // self.block_size, len(state.table))
        if self.enable_prefix_caching:
            stop = min(stop, state.num_cached)
        for i in range(state.num_released, stop):
            self._release(state.table[i])
            self.num_released_blocks += 1
        state.num_released = max(state.num_released, stop)

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} released more often than taken"
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.key is None:
                # Nothing to reuse in it, so hand it out before any cached block.
                self._free.move_to_end(block_id, last=False)

    def _check_prefix_chain(self, block_ids: Sequence[int], root: int | None) -> None:
        parent_serial: int | None = None
        for i, block_id in enumerate(block_ids):
            if not 0 <= block_id < self.num_blocks:
                raise ValueError(f"block id {block_id} outside 0..{self.num_blocks - 1}")
            block = self._blocks[block_id]
            if block.key is None or block.parent_serial != parent_serial:
                raise ValueError("computed_blocks must be a cached prefix chain from get_computed_blocks")
            if i == 0 and block.key != block_hash(root, block.tokens):
                raise ValueError("computed_blocks must start from the chain's root (another layer group's?)")
            parent_serial = block.serial

    def _evict(self, block_id: int) -> None:
        block = self._blocks[block_id]
        assert block.key is not None and self._cached[block.key] == block_id
        del self._cached[block.key]
        block.key, block.tokens, block.serial, block.parent_serial, block.anchor = None, (), None, None, None
