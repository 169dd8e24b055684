"""The CPU bitmask plan and apply give exactly the logits xgrammar's own kernel gives, for every kind of row: nearly all
banned (a structural position), nearly all allowed (inside a string), mixed, and a vocabulary narrower than the
logits (padded embeddings); with the tokens every constrained row bans (control bytes) as a bitmask row ANDed
into the bitmask would ban them."""

from __future__ import annotations

import numpy as np
import torch
import xgrammar
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sample.bitmask_cpu import FEW_WORDS, Bans, apply, plan
from engine.sample.guided_batch import _bitmask_row

WORDS = 40  # 1,280 bits: small enough to draw, wide enough for every row kind


@st.composite
def bitmask_row(draw: st.DrawFn) -> list[int]:
    kind = draw(st.sampled_from(["sparse", "dense", "mixed"]))
    if kind == "mixed":
        return draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=WORDS, max_size=WORDS))
    base = 0 if kind == "sparse" else -1
    row = [base] * WORDS
    changed = draw(st.lists(st.integers(0, WORDS - 1), max_size=FEW_WORDS + 2))  # around the threshold
    for word in changed:
        row[word] = draw(st.integers(-(2**31), 2**31 - 1))
    return row


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(bitmask_row(), min_size=1, max_size=6),
    spare=st.integers(0, 6),
    padding=st.integers(0, 70),
    seed=st.integers(0, 2**16),
    banned=st.lists(st.integers(0, WORDS * 32 - 71), max_size=40, unique=True),
)
def test_the_cpu_apply_matches_xgrammars_kernel(
    rows: list[list[int]], spare: int, padding: int, seed: int, banned: list[int]
) -> None:
    n = len(rows) + spare
    which = sorted(np.random.default_rng(seed).choice(n, size=len(rows), replace=False).tolist())
    bitmask = torch.full((n, WORDS), -1, dtype=torch.int32)
    for i, row in zip(which, rows, strict=True):
        bitmask[i] = torch.tensor(row, dtype=torch.int32)
    vocab = WORDS * 32 - padding
    logits = torch.randn(n, WORDS * 32 + 5, generator=torch.Generator().manual_seed(seed))
    expected = logits.clone()
    # The Bans are what a row of the bitmask ANDed into it bans (as on a GPU).
    xgrammar.apply_token_bitmask_inplace(
        expected, bitmask & _bitmask_row(banned, WORDS), indices=which, vocab_size=vocab
    )
    apply(logits, plan(bitmask, which, vocab, Bans.of(banned, vocab)))
    assert torch.equal(logits, expected)
