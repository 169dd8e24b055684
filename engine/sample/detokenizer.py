"""Turns one request's generated token ids into text deltas: never half a character, never a stop string."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    """Streams the text of decode(output_ids), cut right before the first stop string completed in it.

    Decoding is done by the Rust `DecodeStream`, which holds back a tail that ends in an incomplete UTF-8
    sequence. On top of it this class holds back the longest tail that could still grow into a stop string.
    """

    __slots__ = (
        "_decoded_chars",
        "_held",
        "_output_ids",
        "_parts",
        "_rust",
        "_skip_special_tokens",
        "_stop_string",
        "_stops",
        "_stream",
    )

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        # prompt_token_ids is deliberately unused: the output text is defined as decode(output ids), and an
        # unseeded DecodeStream reproduces that exactly, including the leading-space rules of Strip decoders.
        del prompt_token_ids
        rust = getattr(tokenizer, "_tokenizer", None)
        if not isinstance(rust, Tokenizer):
            raise TypeError(f"{type(tokenizer).__name__} is not backed by a Rust `tokenizers.Tokenizer`")
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._rust = rust
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._skip_special_tokens = skip_special_tokens
        self._stops = tuple(dict.fromkeys(stop))
        # Kept only so flush() can decode what DecodeStream still holds; it exposes no flush of its own.
        self._output_ids: list[int] = []
        self._decoded_chars = 0
        self._held = ""
        self._parts: list[str] = []
        self._stop_string: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far: the concatenation of every delta returned."""
        return "".join(self._parts)

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, or None while none has matched."""
        return self._stop_string

    def add_tokens(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Feed newly generated token ids; returns (text safe to emit now, whether a stop string matched).

        Once it returns stopped=True the text is final and the request must not feed more tokens.
        """
        if self._stop_string is not None:
            raise RuntimeError("add_tokens called after a stop string matched")
        if not token_ids:
            return "", False
        self._output_ids.extend(token_ids)
        chunk = self._stream.step(self._rust, token_ids[0] if len(token_ids) == 1 else list(token_ids))
        if chunk is None:
            return "", False
        self._decoded_chars += len(chunk)
        if not self._stops:
            self._parts.append(chunk)
            return chunk, False
        return self._advance(chunk, final=False)

    def flush(self) -> str:
        """At the end of a request not stopped by a stop string: return all text still held back.

        An incomplete UTF-8 tail comes out as U+FFFD, as in a full decode. A stop string that only shows up in
        that tail still cuts the text (and sets stop_string), so the text never contains one.
        """
        if self._stop_string is not None:
            return ""
        full = self._rust.decode(self._output_ids, skip_special_tokens=self._skip_special_tokens)
        tail = full[self._decoded_chars :]
        self._decoded_chars = len(full)
        delta, _ = self._advance(tail, final=True)
        return delta

    def _advance(self, chunk: str, final: bool) -> tuple[str, bool]:
        pending = self._held + chunk
        # The held tail already contains no whole stop string, and any match starting in emitted text would
        # have been held; so the first match in pending is the first in the whole text.
        # The stop string completed first when reading left to right wins (on a tie, the one starting earlier),
        # so where the text is cut does not depend on how tokens were grouped into calls.
        cut = stop_end = len(pending)
        for s in self._stops:
            i = pending.find(s, 0, stop_end)
            if i >= 0 and (i + len(s) < stop_end or i < cut):
                cut, stop_end = i, i + len(s)
                self._stop_string = s
        if self._stop_string is not None:
            self._held = ""
            delta = pending[:cut]
            self._parts.append(delta)
            return delta, True
        keep = len(pending) if final else self._stop_prefix_start(pending)
        self._held = pending[keep:]
        delta = pending[:keep]
        self._parts.append(delta)
        return delta, False

    def _stop_prefix_start(self, pending: str) -> int:
        """Index where the longest suffix of pending that is a proper prefix of some stop string begins."""
        n = len(pending)
        start = n
        for s in self._stops:
            first = s[0]
            # Only candidates earlier than the best so far can lengthen the held suffix.
            i = pending.find(first, max(0, n - len(s) + 1), start)
            while i >= 0:
                if s.startswith(pending[i:]):
                    start = i
                    break
                i = pending.find(first, i + 1, start)
        return start
