"""The constrained requests of a batch: one grammar matcher per request, and the step's token bitmask, filled
and applied only to the constrained rows of the logits."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import xgrammar

from engine.sample.bitmask_cpu import Bans, MaskPlan, apply, plan
from engine.sample.guided import GrammarCache


class GuidedBatch:
    def __init__(self, grammars: GrammarCache, max_num_seqs: int, device: torch.device) -> None:
        self.grammars = grammars
        self._on_cpu = device.type == "cpu"
        self.vocab_size = grammars.vocab_size
        self._matchers: dict[str, xgrammar.GrammarMatcher] = {}
        # One row per seat; a step's sampling rows never outnumber the running requests.
        self._bitmask = xgrammar.allocate_token_bitmask(max_num_seqs, self.vocab_size)
        # On a CPU the forward has every core but the one left to the web server, where this batch's fill runs
        # on its own worker thread: xgrammar's own threads ("auto": one per core) would take the forward's
        # cores (measured: 1.3 ms more per step of random:tiny with 16 of 64 rows constrained on 2 cores).
        self._filler = xgrammar.BatchGrammarMatcher(max_threads=1 if self._on_cpu else "auto")
        # Tokens with a raw byte below 0x20, valid nowhere in compact JSON (engine.sample.guided); but xgrammar 0.2.8's
        # rule for a string with maxLength or minLength allows them: '{"a": "\x05"}' would come out, and not
        # parse. Banned in every constrained row (on a CPU by the plan; elsewhere ANDed into the bitmask).
        self._control: Bans | None = None
        self._no_control: torch.Tensor | None = None  # the bitmask row that bans them (off a CPU)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bitmask")
        self._filling: Future[MaskPlan | None] | None = None
        self._rows: list[int] = []

    @property
    def active(self) -> bool:
        """Any constrained request running: when not, a step does no guided work at all."""
        return bool(self._matchers)

    @property
    def rows(self) -> int:
        """The constrained rows of the step prepare() was last given (what its guided work scales with)."""
        return len(self._rows)

    def start(self, request_id: str, compiled: xgrammar.CompiledGrammar) -> None:
        if self._control is None:
            pieces = compiled.tokenizer_info.decoded_vocab
            control = [token for token, piece in enumerate(pieces) if any(b < 0x20 for b in piece)]
            self._control = Bans.of(control, self.vocab_size)
            if not self._on_cpu:
                self._no_control = _bitmask_row(control, self._bitmask.shape[1])
        self._matchers[request_id] = xgrammar.GrammarMatcher(compiled)

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the request's matcher by its sampled token; True when its output is complete (the grammar
        took a stop token) or the token broke it, so the request must end."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        return not matcher.accept_token(token) or matcher.is_terminated()

    def release(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def prepare(self, request_ids: Sequence[str]) -> None:
        """Start filling the bitmask for a step whose logits row i will be request_ids[i]. The matchers' state
        after the last step's tokens is all it needs, so it runs on a worker thread beside the forward
        (xgrammar releases the GIL) and mask() waits for it."""
        rows = [i for i, rid in enumerate(request_ids) if rid in self._matchers]
        self._rows = rows
        matchers = [self._matchers[request_ids[i]] for i in rows]
        self._filling = self._pool.submit(self._fill, matchers, rows) if rows else None

    def _fill(self, matchers: list[xgrammar.GrammarMatcher], rows: list[int]) -> MaskPlan | None:
        """Fill the rows' bitmask; on a CPU also work out the writes that apply it (engine.sample.bitmask_cpu)."""
        self._filler.batch_fill_next_token_bitmask(matchers, self._bitmask, rows)
        assert self._control is not None  # set by the first start
        if self._on_cpu:
            return plan(self._bitmask, rows, self.vocab_size, self._control)
        assert self._no_control is not None
        self._bitmask[torch.tensor(rows)] &= self._no_control
        return None

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Ban, in the rows prepare() was given, every token their grammar does not allow next. Returns the
        logits (float32: the sampler works in it anyway)."""
        filling, rows = self._filling, self._rows
        if filling is None:
            return logits
        self._filling = None
        cpu_plan = filling.result()
        logits = logits.float()
        if cpu_plan is not None:
            apply(logits, cpu_plan)
        else:
            bitmask = self._bitmask[: max(rows) + 1].to(logits.device, non_blocking=True)
            xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows, vocab_size=self.vocab_size)
        return logits


def _bitmask_row(banned: list[int], words: int) -> torch.Tensor:
    """A bitmask row (int32 words, bit i of word w is token 32w + i) allowing every token but `banned`."""
    allowed = np.ones(words * 32, dtype=bool)
    allowed[banned] = False
    return torch.from_numpy(np.packbits(allowed, bitorder="little").view(np.int32).copy())
