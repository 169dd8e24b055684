"""Longrope (Phi-3's short/long rotary factors) chosen per request, as transformers' generate chooses them for one
sequence alone, never per batch.

transformers picks the factors for a whole forward from its longest position, so in a mixed batch one long
request would switch every other request's factors. Its generate for one sequence uses the short factors while
the sequence is at most the pretraining length, the long ones once it is longer, and on the step it first grows
past that length recomputes every cached key with the long factors (Phi3ForCausalLM.prepare_inputs_for_generation
drops the cache). The engine does the same per request: a request's tokens take the long factors when the
request is longer than that length, and its first step past it recomputes its context from position 0 (that
step computes the request's whole context, beyond the step's token budget, once).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.errors import ModelLoadError

__all__ = ["RequestRope", "install_request_rope"]


class RequestRope(nn.Module):
    """Replaces the model's rotary module: cos/sin per token, short or long as `select` said for this step."""

    def __init__(self, rotary: Any, config: Any) -> None:
        super().__init__()
        self.original_max = int(config.rope_parameters["original_max_position_embeddings"])
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](
            config, rotary.original_inv_freq.device, seq_len=self.original_max + 1
        )
        self.short_inv_freq = nn.Buffer(rotary.original_inv_freq.clone(), persistent=False)
        self.long_inv_freq = nn.Buffer(long, persistent=False)
        self.attention_scaling = float(rotary.attention_scaling)
        self._long: torch.Tensor | None = None
        self._short: set[str] = set()  # requests whose cached keys have the short factors

    def first_position(self, request_id: str, num_computed: int, length: int) -> int:
        """Where a request's computation starts this step: num_computed, or 0 on the step it first grows past the
        pretraining length with keys of the short factors cached. length: its tokens (prompt and output)."""
        if num_computed == 0:
            self._short.discard(request_id)
        if length <= self.original_max:
            self._short.add(request_id)
            return num_computed
        if request_id in self._short:
            self._short.discard(request_id)
            return 0
        return num_computed

    def release(self, request_id: str) -> None:
        self._short.discard(request_id)

    def select(self, lengths: list[int], device: torch.device) -> None:
        """The step's tokens, each by its request's length: the long factors where it passes the pretraining
        length."""
        self._long = torch.tensor([n > self.original_max for n in lengths], dtype=torch.bool, device=device)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._long is None or self._long.shape[0] != position_ids.shape[-1]:
            raise RuntimeError("longrope needs the step's tokens selected before the forward (an engine bug)")
        inv_freq = torch.where(self._long.unsqueeze(-1), self.long_inv_freq, self.short_inv_freq)  # [T, D/2]
        # transformers' arithmetic: position (float) times inverse frequency, duplicated, cos/sin times scaling.
        freqs = position_ids[0].unsqueeze(-1).float() * inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(0)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def install_request_rope(model: Any, rope_types: frozenset[str]) -> RequestRope | None:
    """Put a RequestRope in place of a longrope model's rotary module; None for any other rope. A longrope model
    whose rotary module is not where transformers' decoders keep it is refused."""
    if "longrope" not in rope_types:
        return None
    inner: Any = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) != "longrope" or not hasattr(rotary, "original_inv_freq"):
        raise ModelLoadError("this model's longrope rotary module is not one the engine can choose per request")
    rope = RequestRope(rotary, model.config.get_text_config())
    inner.rotary_emb = rope
    return rope
