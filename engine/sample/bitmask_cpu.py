"""Applying a step's token bitmask to CPU logits, split in two: `plan` reads the bitmask (on the bitmask worker
thread, while the forward runs) and `apply` writes the logits (on the step's thread, after the forward) with as
few numpy calls as it can, since each call right after a forward costs tens of microseconds of cold caches.

xgrammar's CPU kernel writes banned tokens one by one: 3.2 ms for 16 rows of a 49,152-token vocabulary at a
structural position (nearly all banned). Nearly every row is nearly all banned (a key, a comma, a digit) or nearly
all allowed (inside a string), so the few exceptions are found word by word: a banned-everywhere row is filled
and its few allowed logits put back, an allowed-everywhere row gets its few bans; only the rest are unpacked bit by
bit. The logits come out exactly as xgrammar's kernel makes them (tests/engine/test_guided_mask.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# A row whose bitmask has at most this many words allowing anything, or banning anything, is written token by
# token; the rows between, bit by bit.
FEW_WORDS = 16
_BITS = np.arange(32, dtype=np.int64)
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(slots=True, frozen=True)
class Bans:
    """Tokens banned in every constrained row whatever its grammar allows, as ids and as a mask of the
    vocabulary (True where banned)."""

    ids: np.ndarray
    mask: np.ndarray

    @classmethod
    def of(cls, ids: list[int], vocab_size: int) -> Bans:
        mask = np.zeros(vocab_size, dtype=bool)
        mask[ids] = True
        return cls(np.asarray(ids, dtype=np.int64), mask)


@dataclass(slots=True, frozen=True)
class MaskPlan:
    """The writes that ban, in some logits rows, every token of the first vocab_size their bitmask rows ban
    (and the Bans)."""

    vocab_size: int
    filled: np.ndarray  # logits rows set to -inf, but for their kept tokens
    kept_rows: np.ndarray
    kept_tokens: np.ndarray
    banned_rows: np.ndarray
    banned_tokens: np.ndarray
    unpacked: list[tuple[int, np.ndarray]]  # (logits row, banned-token mask) of the rows neither


def plan(bitmask: torch.Tensor, rows: list[int], vocab_size: int, bans: Bans) -> MaskPlan:
    """The writes for logits row rows[j] under bitmask row rows[j] (int32 words; bit i of word w is token
    32w + i, set where allowed). It runs beside the forward, which it slows by every numpy call it makes while
    holding the GIL: few calls, none per token."""
    words = bitmask[rows].numpy()  # a copy: the bitmask is refilled for the next step
    at = np.asarray(rows, dtype=np.int64)
    sparse = np.count_nonzero(words, axis=1) <= FEW_WORDS
    dense = ~sparse & (np.count_nonzero(words != -1, axis=1) <= FEW_WORDS)
    kept_rows, kept_tokens = _NONE, _NONE
    if sparse.any():
        kept_rows, kept_tokens = _set_bits(words[sparse], at[sparse], vocab_size)
        allowed = ~bans.mask[kept_tokens]
        kept_rows, kept_tokens = kept_rows[allowed], kept_tokens[allowed]
    banned_rows, banned_tokens = _NONE, _NONE
    if dense.any():
        # Flipped, the banned tokens' bits are the set ones; and the Bans in each of these rows.
        rows_, tokens_ = _set_bits(~words[dense], at[dense], vocab_size)
        banned_rows = np.concatenate([rows_, np.repeat(at[dense], len(bans.ids))])
        banned_tokens = np.concatenate([tokens_, np.tile(bans.ids, int(dense.sum()))])
    unpacked = [
        (rows[j], (np.unpackbits(words[j].view(np.uint8), bitorder="little")[:vocab_size] == 0) | bans.mask)
        for j in np.flatnonzero(~(sparse | dense)).tolist()
    ]
    return MaskPlan(vocab_size, at[sparse], kept_rows, kept_tokens, banned_rows, banned_tokens, unpacked)


def apply(logits: torch.Tensor, mask: MaskPlan) -> None:
    """Make the plan's writes into logits (float32, on the CPU), in place."""
    values = logits.numpy()
    kept = values[mask.kept_rows, mask.kept_tokens]
    values[mask.filled, : mask.vocab_size] = -np.inf
    values[mask.kept_rows, mask.kept_tokens] = kept
    values[mask.banned_rows, mask.banned_tokens] = -np.inf
    for row, banned in mask.unpacked:
        np.copyto(values[row, : mask.vocab_size], -np.inf, where=banned)


def _set_bits(words: np.ndarray, at: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits row, token) of every set bit below vocab_size in words, whose row j is logits row at[j]."""
    flat = np.flatnonzero(words)
    row, column = np.divmod(flat, words.shape[1])
    bits = ((words.ravel()[flat].astype(np.int64)[:, None] >> _BITS) & 1) == 1
    token = column[:, None] * 32 + _BITS
    wanted = bits & (token < vocab_size)
    return np.broadcast_to(at[row][:, None], token.shape)[wanted], token[wanted]
