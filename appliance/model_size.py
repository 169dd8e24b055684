"""How much memory a model takes before it is loaded: its shape from config.json, GGUF metadata or a random
preset, then weights at the chosen quantization and KV bytes per token. Estimates for decoder-only
transformers (Llama, Qwen2, Mistral shapes), good to a few percent; doctor and the README use them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.gguf_header import GGUFHeaderError, read_header
from engine.sources import RANDOM_PREFIX, default_model_path

# bitsandbytes 4-bit: half a byte per weight plus one float32 absmax per 64-weight block (no double quant);
# int8: one byte plus a float32 scale per row, negligible. Embeddings and lm_head are not quantized.
QUANTIZED_BYTES_PER_PARAM = {"nf4": 0.5 + 4 / 64, "fp4": 0.5 + 4 / 64, "int8": 1.0}
PRESET_VOCAB = 49152  # the random presets use the bundled model's tokenizer
CUDA_OVERHEAD_BYTES = 1 << 30  # CUDA context, allocator slack and one forward's activations, roughly


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    context: int

    @property
    def linear_params(self) -> int:
        """Parameters of the attention and MLP projections, which bitsandbytes quantizes."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp)

    @property
    def embedding_params(self) -> int:
        """Input embeddings and the output head (one matrix when tied), kept in the compute dtype."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.linear_params + self.embedding_params

    def weights_bytes(self, quantization: str, dtype_bytes: int) -> int:
        per_param = QUANTIZED_BYTES_PER_PARAM.get(quantization, dtype_bytes)
        return int(self.linear_params * per_param + self.embedding_params * dtype_bytes)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_shape(model: str) -> Shape:
    """Raises ValueError (unknown form or unreadable file) or engine.ModelLoadError (default not installed)."""
    if model.startswith(RANDOM_PREFIX):
        from engine.presets import get_preset  # torch and transformers: seconds, only for the test presets

        p = get_preset(model.removeprefix(RANDOM_PREFIX))
        head_dim = p.hidden_size // p.num_heads
        return Shape(
            p.hidden_size,
            p.num_layers,
            p.num_heads,
            p.num_kv_heads,
            head_dim,
            p.intermediate_size,
            PRESET_VOCAB,
            p.tie_word_embeddings,
            p.max_position_embeddings,
        )
    path = default_model_path() if model == "default" else Path(model).expanduser()
    if path.is_dir():
        return _from_hf_config(json.loads((path / "config.json").read_text()))
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _from_gguf(path)
    raise ValueError(f"{model} is not a model directory, a .gguf file or random:<preset>")


def _from_hf_config(config: dict[str, Any]) -> Shape:
    text = config.get("text_config") or config
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    return Shape(
        hidden=hidden,
        layers=text["num_hidden_layers"],
        heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or hidden // heads,
        intermediate=text["intermediate_size"],
        vocab=text["vocab_size"],
        tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        context=text.get("max_position_embeddings", 2048),
    )


def _from_gguf(path: Path) -> Shape:
    try:
        header = read_header(path)
    except GGUFHeaderError as exc:
        raise ValueError(str(exc)) from None

    def field(key: str) -> Any:
        if key not in header.values:
            raise ValueError(f"{path.name} has no {key} metadata")
        return header.values[key]

    arch = field("general.architecture")
    hidden, heads = int(field(f"{arch}.embedding_length")), int(field(f"{arch}.attention.head_count"))
    key_length = header.values.get(f"{arch}.attention.key_length")  # set when head_dim != hidden / heads
    return Shape(
        hidden=hidden,
        layers=int(field(f"{arch}.block_count")),
        heads=heads,
        kv_heads=int(field(f"{arch}.attention.head_count_kv")),
        head_dim=int(key_length) if key_length is not None else hidden // heads,
        intermediate=int(field(f"{arch}.feed_forward_length")),
        vocab=header.array_lengths.get("tokenizer.ggml.tokens", 0),
        tied_embeddings="output.weight" not in header.tensor_names,
        context=int(field(f"{arch}.context_length")),
    )


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    weights: int
    kv_per_token: int
    context: int  # tokens one full-length sequence holds
    overhead: int

    @property
    def minimum(self) -> int:
        """Weights, KV for one sequence at full context, and the runtime's own share."""
        return self.weights + self.kv_per_token * self.context + self.overhead


def memory_need(shape: Shape, quantization: str, dtype_bytes: int, max_model_len: int | None, gpu: bool) -> MemoryNeed:
    context = min(shape.context, max_model_len) if max_model_len else shape.context
    return MemoryNeed(
        weights=shape.weights_bytes(quantization, dtype_bytes),
        kv_per_token=shape.kv_bytes_per_token(dtype_bytes),
        context=context,
        overhead=CUDA_OVERHEAD_BYTES if gpu else 0,
    )
