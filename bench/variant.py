"""One way to name an engine set-up in every benchmark: `quantization/dtype[/off+...][@kv]` ('plain' turns
compact weights off, 'hf' runs transformers' forward; @int8, @fp8, ... the KV pool's element type), as an
EngineConfig in process or APPLIANCE_* settings for a server, and the options every in-process benchmark shares."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig

OFF_NAMES = {
    "plain": "no compact weights (float32: engine.cpu.packed_linear; bf16: a GGUF's blocks, engine.cpu.split_linear)",
    "hf": "transformers' forward",
}
# EngineConfig fields a benchmark may take from its command line, when its parser has them.
FROM_ARGS = (
    "model",
    "quantization",
    "dtype",
    "device",
    "cpu_threads",
    "max_num_seqs",
    "max_num_batched_tokens",
    "seed",
    "cache_dir",
)


@dataclass(frozen=True, slots=True)
class Variant:
    quantization: str = "auto"
    dtype: str = "auto"
    off: frozenset[str] = frozenset()
    kv_cache_dtype: str = "auto"

    @classmethod
    def parse(cls, text: str) -> Variant:
        text, _, kv = text.strip().partition("@")
        quantization, _, rest = text.partition("/")
        dtype, _, off = rest.partition("/")
        unknown = set(filter(None, off.split("+"))) - set(OFF_NAMES)
        if unknown:
            raise ValueError(f"unknown variant part {', '.join(sorted(unknown))}: choose from {', '.join(OFF_NAMES)}")
        return cls(quantization or "auto", dtype or "auto", frozenset(filter(None, off.split("+"))), kv or "auto")

    def config(self, **fields: Any) -> EngineConfig:
        return EngineConfig(
            quantization=self.quantization,  # type: ignore[arg-type]  # EngineConfig validates the names
            dtype=self.dtype,  # type: ignore[arg-type]
            compact_weights="plain" not in self.off,
            own_forward="hf" not in self.off,
            **({"kv_cache_dtype": self.kv_cache_dtype} | fields),
        )

    def settings(self) -> dict[str, str]:
        return {
            "APPLIANCE_QUANTIZATION": self.quantization,
            "APPLIANCE_DTYPE": self.dtype,
            "APPLIANCE_COMPACT_WEIGHTS": str("plain" not in self.off).lower(),
            "APPLIANCE_OWN_FORWARD": str("hf" not in self.off).lower(),
            "APPLIANCE_KV_CACHE_DTYPE": self.kv_cache_dtype,
        }


def variant_help() -> str:
    return (
        "quantization/dtype; a third part turns off what it names, joined by +: "
        + ", ".join(f"'{name}' ({what})" for name, what in OFF_NAMES.items())
        + "; @kv names the KV pool's element type (auto, bf16, fp16, int8, fp8)"
    )


def engine_config(args: argparse.Namespace, **fixed: Any) -> EngineConfig:
    """The EngineConfig of a benchmark's options (those of FROM_ARGS its parser has), with `fixed` over them."""
    fields = {name: getattr(args, name) for name in FROM_ARGS if getattr(args, name, None) is not None}
    return EngineConfig(**(fields | fixed))
