"""The load-time allow-list: a model is served only if every feature that shapes its attention or positions is one
the engine computes as transformers does; otherwise it is refused with the feature named (ModelLoadError)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface

from engine.errors import ModelLoadError
from engine.model.attention_features import FEATURE_KWARGS, INERT_KWARGS, LayerFeatures

__all__ = ["ModelFeatures", "check_fidelity"]

PROBE_NAME = "appliance_probe"
LAYER_TYPES = ("full_attention", "sliding_attention")
# Rope types whose frequencies are fixed at load (transformers' own rotary module computes them), and longrope,
# whose short/long choice engine.model.rope makes per request. "dynamic" (NTK) rescales with the longest position the
# forward sees, so a request's tokens would depend on its batch-mates and on its own history.
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# Config attributes whose names say they change attention or positions; those below are the ones the engine
# knows (the probe and the value checks here cover them). Any other such attribute, set, refuses the model.
FEATURE_WORDS = ("window", "softcap", "sink", "chunk", "alibi", "bidirectional", "rope", "rotary", "attention_type")
KNOWN = frozenset(
    {
        "sliding_window",  # per layer, as transformers passes it to attention (probe)
        "use_sliding_window",
        "max_window_layers",
        "sliding_window_pattern",
        "_sliding_window_pattern",
        "attn_logit_softcapping",  # passed to attention as softcap (probe)
        "final_logit_softcapping",  # in the model's own forward, on the logits
        "chunk_size_feed_forward",  # feed-forward chunking for memory, same arithmetic
        "rope_parameters",  # checked below
        "rope_theta",
        "partial_rotary_factor",
        "no_rope_layers",  # NoPE layers: the model's own layers skip rotary embedding
        "no_rope_layer_interval",
        "use_bidirectional_attention",  # refused below when set
        "attention_chunk_size",  # refused below when set
        "alibi",  # refused below when set
    }
)
REFUSED_WHEN_SET = {
    "use_bidirectional_attention": "bidirectional attention",
    "attention_chunk_size": "chunked local attention (attention_chunk_size)",
    "alibi": "ALiBi position biases",
}


@dataclass(frozen=True, slots=True)
class ModelFeatures:
    """What the probe saw: each layer's attention features, and whether rotary frequencies are per request."""

    layers: tuple[LayerFeatures, ...]
    rope_types: frozenset[str]

    @property
    def plain(self) -> bool:
        """Full causal attention everywhere and rope fixed at load: what the engine's own forward computes."""
        return all(f.plain for f in self.layers) and self.rope_types <= {"default", "linear", "llama3"}

    @property
    def widest_window(self) -> int | None:
        """The reach of the widest sliding window where every layer has one; None where a layer attends fully."""
        windows = [f.window for f in self.layers]
        return max(w for w in windows if w is not None) if windows and None not in windows else None

    def describe(self) -> str:
        windows = sorted({f.window for f in self.layers if f.window is not None})
        parts = (
            [
                f"sliding window {', '.join(map(str, windows))} in {sum(f.window is not None for f in self.layers)}"
                f" of {len(self.layers)} layers"
            ]
            if windows
            else []
        )
        if any(f.softcap is not None for f in self.layers):
            parts.append("attention soft-capping")
        if any(f.sinks is not None for f in self.layers):
            parts.append("attention sinks")
        parts.append(f"rope {', '.join(sorted(self.rope_types))}")
        return "; ".join(parts)


def check_fidelity(model: Any) -> ModelFeatures:
    """The model's attention features, once the config checks and a two-token probe forward find nothing the
    engine lacks; else ModelLoadError naming the feature."""
    text = model.config.get_text_config()
    name = f"{text.model_type!r} model"
    for key, value in text.to_dict().items():
        if not value or not any(word in key for word in FEATURE_WORDS):
            continue
        if key in REFUSED_WHEN_SET:
            raise ModelLoadError(f"this {name} uses {REFUSED_WHEN_SET[key]} ({key}={value!r}), which the engine lacks")
        if key not in KNOWN:
            raise ModelLoadError(
                f"this {name} sets {key}={value!r}, an attention or position feature the engine does not implement"
            )
    unknown_layers = sorted(set(getattr(text, "layer_types", None) or ()) - set(LAYER_TYPES))
    if unknown_layers:
        raise ModelLoadError(f"this {name} has {', '.join(unknown_layers)} layers, which the engine lacks")
    rope_types = _rope_types(text)
    for rope in rope_types - set(ROPE_TYPES):
        raise ModelLoadError(f"this {name} uses {rope!r} rope scaling, which the engine does not implement")
    if "longrope" in rope_types and isinstance(text.rope_parameters.get("full_attention"), dict):
        raise ModelLoadError(f"this {name} uses longrope per layer type, which the engine does not implement")
    layers = _probe(model, text)
    return ModelFeatures(layers, frozenset(rope_types))


def _rope_types(text: Any) -> set[str]:
    params = getattr(text, "rope_parameters", None) or {}
    if all(isinstance(v, dict) for v in params.values()) and params:
        return {str(p.get("rope_type", "default")) for p in params.values()}
    return {str(params.get("rope_type", "default"))} if params else set()


def _probe(model: Any, text: Any) -> tuple[LayerFeatures, ...]:
    """One two-token forward with a recording attention function: what transformers passes each layer."""
    seen: dict[int, LayerFeatures] = {}
    refused: list[str] = []

    def record(
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is not None:
            # The engine masks causally itself; a mask built by the model means one of another shape.
            refused.append("an attention mask of its own")
        for arg, given in kwargs.items():
            if arg not in FEATURE_KWARGS and arg not in INERT_KWARGS and given not in (None, False):
                refused.append(f"attention argument {arg}={given!r}")
        try:
            features = LayerFeatures.from_kwargs(kwargs)
        except ValueError as exc:
            refused.append(str(exc))
            features = LayerFeatures()
        if features.sinks is not None and features.sinks.shape != (query.shape[1],):
            refused.append(f"attention sinks of shape {tuple(features.sinks.shape)} for {query.shape[1]} heads")
        seen[int(getattr(module, "layer_idx", -1))] = features
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None

    AttentionInterface.register(PROBE_NAME, record)
    device = next(model.parameters()).device
    with _attention(model, PROBE_NAME), torch.inference_mode():
        model(
            input_ids=torch.tensor([[1, 2]], device=device),
            position_ids=torch.tensor([[0, 1]], device=device),
            use_cache=False,
            logits_to_keep=1,
        )
    name = f"{text.model_type!r} model"
    if refused:
        raise ModelLoadError(f"this {name} passes {refused[0]}, which the engine's attention does not implement")
    layers = text.num_hidden_layers
    if sorted(seen) != list(range(layers)):
        raise ModelLoadError(
            f"this {name} has {layers} layers but {len(seen)} attend through transformers' attention interface "
            "(recurrent or state-space layers, or attention of its own), which the engine cannot page"
        )
    return tuple(seen[i] for i in range(layers))


@contextmanager
def _attention(model: Any, name: str) -> Iterator[None]:
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    saved = [(c, c._attn_implementation) for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield
    finally:
        for c, impl in saved:
            c._attn_implementation = impl
