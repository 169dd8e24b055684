"""Random-weight presets: real decoder architectures at chosen sizes, with seeded weights and no download."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True, slots=True)
class Preset:
    """The shape of one architecture; the vocabulary comes from the tokenizer it is paired with."""

    model_type: str  # a transformers model_type: "llama", "qwen2"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    # Tiny presets use a large std so logits are peaky: greedy equivalence tests compare two implementations
    # token by token, and a top-1/top-2 near-tie would flip on float noise. 0.2 gives a median gap of ~0.25.
    initializer_range: float = 0.02

    def hf_config(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedConfig:
        return AutoConfig.for_model(
            self.model_type,
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            tie_word_embeddings=self.tie_word_embeddings,
            initializer_range=self.initializer_range,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )


def _tiny(model_type: str, context: int = 2048) -> Preset:
    return Preset(
        model_type,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=context,
        initializer_range=0.2,
    )


PRESETS: dict[str, Preset] = {
    "tiny": _tiny("llama"),
    # Qwen2 carries q/k/v biases: the second family, so bias handling is exercised too.
    "tiny-qwen2": _tiny("qwen2"),
    # The agents' prompts (Codex CLI, Claude Code: instructions and tool lists of 10-20k tokens) need a long context;
    # a tiny model prefills them in seconds on a CPU.
    "tiny-long": _tiny("llama", context=32768),
    # Llama-3.2-1B shapes; its 131072-token context is capped to 8192, where it needs no llama3 rope scaling.
    "llama-1b": Preset(
        "llama",
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=8192,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B shapes.
    "llama-8b": Preset(
        "llama",
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(f"random:{key}" for key in PRESETS)
        raise ModelLoadError(f"unknown random preset {name!r}; known presets: {known}") from None


def build_random_model(
    hf_config: PreTrainedConfig,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
) -> PreTrainedModel:
    """Build the architecture on `device` in `dtype`; one seed on one device always gives the same weights."""
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, **extra)
    # transformers zero-initialises biases; random ones make a bias path (Qwen2's q/k/v) actually count.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, hf_config.initializer_range)
    return model
