"""The embedding model itself: tokenize (refusing or cutting over-long input), run the encoder over length-sorted
batches, pool and normalize as the model's layout says, return float32 vectors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.embed.layout import EmbeddingLayout
from engine.errors import ContextLengthError, InvalidRequestError, ModelLoadError

EmbeddingInput = str | Sequence[int]
# A tokenizer's "no limit" is a huge sentinel (1e30); anything above this is one.
NO_LIMIT = 1 << 20


class Encoder:
    """max_input_tokens: the most tokens one input may have, the special tokens the model adds not counted."""

    def __init__(self, layout: EmbeddingLayout) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.layout = layout
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(layout.path)
            self.model = AutoModel.from_pretrained(layout.path, dtype=torch.float32).eval()
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the embedding model in {layout.path}: {exc}") from exc
        config = self.model.config
        self.dimensions = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.prefix, self.suffix = _special_tokens(self.tokenizer)
        limits = [getattr(config, "max_position_embeddings", None), self.tokenizer.model_max_length]
        if layout.max_seq_length is not None:
            limits = [layout.max_seq_length]
        self.max_seq_length = min(int(n) for n in limits if n is not None and n < NO_LIMIT)
        self.max_input_tokens = self.max_seq_length - len(self.prefix) - len(self.suffix)

    def token_ids(self, inputs: Sequence[EmbeddingInput], truncate: bool) -> list[list[int]]:
        """Each input's own token ids: a text tokenized, a token-id list checked against the vocabulary. Longer
        than max_input_tokens: cut to it when `truncate`, else ContextLengthError (OpenAI refuses such input too)."""
        texts = [(i, text) for i, text in enumerate(inputs) if isinstance(text, str)]
        encoded = self.tokenizer([t for _, t in texts], add_special_tokens=False)["input_ids"] if texts else []
        ids: list[list[int]] = [[] for _ in inputs]
        for (i, _), one in zip(texts, encoded, strict=True):
            ids[i] = list(one)
        for i, item in enumerate(inputs):
            if not isinstance(item, str):
                ids[i] = _checked_ids(item, self.vocab_size, i)
            if len(ids[i]) > self.max_input_tokens:
                if not truncate:
                    raise ContextLengthError(
                        f"input {i} has {len(ids[i])} tokens; the embedding model takes at most "
                        f"{self.max_input_tokens} per input: shorten it or split it",
                        "input",
                        prompt_too_long=True,
                    )
                ids[i] = ids[i][: self.max_input_tokens]
        return ids

    @torch.inference_mode()
    def encode(self, ids: Sequence[Sequence[int]], max_batch_tokens: int) -> np.ndarray:
        """One float32 row per input, in input order. Inputs run longest first in batches of at most
        max_batch_tokens padded tokens, so little of each batch is padding."""
        rows = [[*self.prefix, *one, *self.suffix] for one in ids]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out = np.empty((len(rows), self.dimensions), dtype=np.float32)
        start = 0
        while start < len(order):
            width = len(rows[order[start]])
            count = max(1, min(len(order) - start, max_batch_tokens // width))
            chunk = order[start : start + count]
            out[chunk] = self._forward([rows[i] for i in chunk], width).numpy()
            start += count
        return out

    def _forward(self, rows: list[list[int]], width: int) -> torch.Tensor:
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            input_ids[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        pooled = pool(hidden, mask, self.layout.pooling)
        return torch.nn.functional.normalize(pooled, p=2, dim=1) if self.layout.normalize else pooled


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden: (batch, tokens, width), right-padded; mask: 1 on real tokens. mode: one of layout.POOLINGS."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def _special_tokens(tokenizer: object) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one text ([CLS] and [SEP] for BERT), found by tokenizing a
    word with and without them; token-id input gets the same, so it embeds as its text does."""
    plain = tokenizer("hello", add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    full = tokenizer("hello", add_special_tokens=True)["input_ids"]  # type: ignore[operator]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start]), list(full[start + len(plain) :])
    raise ModelLoadError("the embedding model's tokenizer changes a text's own tokens when it adds special ones")


def _checked_ids(item: Sequence[int], vocab_size: int, index: int) -> list[int]:
    ids = list(item)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"input {index} has token id {bad!r}; the embedding model's ids are 0 to {vocab_size - 1}", "input"
        )
    return ids
