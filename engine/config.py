"""Engine configuration: validated once when built, frozen afterwards."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.errors import ConfigError
from engine.logs import LEVELS
from engine.sched.policy import Policy

# auto: nf4 on CUDA, none on a CPU (engine.cpu.hardware says why).
Quantization = Literal["auto", "none", "nf4", "fp4", "int8"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
# auto: the C kernel built at start on a CPU where it builds, else torch's; compiled: that kernel or no start.
DecodeAttention = Literal["auto", "compiled", "torch"]

QUANTIZATIONS: tuple[str, ...] = ("auto", "none", "nf4", "fp4", "int8")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
DECODE_ATTENTIONS: tuple[str, ...] = ("auto", "compiled", "torch")
# The KV pool's element type (engine.model.kv_cache): auto is the model's compute dtype, exact; int8 and fp8 (e4m3)
# are 8-bit with a scale per token and KV head, about twice the tokens in the same bytes.
KVCacheDType = Literal["auto", "bf16", "fp16", "int8", "fp8"]
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp16", "int8", "fp8")


def default_cache_dir() -> Path:
    """Where converted models live when nobody says: $XDG_DATA_HOME/llm-appliance/models, which is also where the
    appliance keeps them by default, so `python -m engine` and `appliance serve` convert the bundled model once."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llm-appliance" / "models"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs to know before it loads a model.

    model: "default" (bundled SmolLM2-135M-Instruct), a Hugging Face model directory, a .gguf file,
    or "random:<preset>" (seeded random weights of a real architecture).
    """

    model: str = "default"
    served_model_name: str | None = None
    quantization: Quantization = "auto"
    dtype: DType = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    kv_cache_dtype: KVCacheDType = "auto"
    gpu_memory_utilization: float = 0.90
    gpu_memory_cap_bytes: int | None = None  # never use more of the card than this (emulate a smaller card)
    max_model_len: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    max_queue: int = 1024
    policy: Policy = Policy.FAIR  # a name is parsed into the member once, here
    enable_prefix_caching: bool = True
    seed: int = 0
    cache_dir: str | None = None
    # On a CPU, engine.cpu.plan decides each of the next five from these settings and says why.
    cpu_threads: int | None = None  # torch threads on a CPU device; None: one fewer than the cores (at least 1)
    decode_attention: DecodeAttention = "auto"  # engine.cpu.decode_kernel
    prepack: bool = True  # bf16 linear layers on a CPU in oneDNN's layout (engine/cpu/prepack.py); off to compare
    # float32 linear layers on a CPU with their weights in the narrowest form that holds them exactly
    # (engine/cpu/packed_linear.py); off to compare
    compact_weights: bool = True
    # Llama-family models on a CPU in float32 or bfloat16: the engine's own forward (engine/model/forward.py); off:
    # transformers'
    own_forward: bool = True
    log_level: str = "info"  # the engine process logs on its own: it cannot see the server's logging set-up

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must name a model: 'default', a directory, a .gguf file or random:<preset>")
        _one_of("quantization", self.quantization, QUANTIZATIONS)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("policy", self.policy, tuple(Policy))
        object.__setattr__(self, "policy", Policy(self.policy))
        _one_of("decode_attention", self.decode_attention, DECODE_ATTENTIONS)
        _one_of("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        _at_least("block_size", self.block_size, 1)
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _at_least("max_queue", self.max_queue, 1)
        _at_least("kv_cache_bytes", self.kv_cache_bytes, 1)
        if self.gpu_memory_cap_bytes is not None:
            _at_least("gpu_memory_cap_bytes", self.gpu_memory_cap_bytes, 1)
        if self.cpu_threads is not None:
            _at_least("cpu_threads", self.cpu_threads, 1)
        _one_of("log_level", self.log_level, LEVELS)
        if self.num_kv_blocks is not None:
            _at_least("num_kv_blocks", self.num_kv_blocks, 1)
        if self.max_model_len is not None:
            _at_least("max_model_len", self.max_model_len, 1)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], not {self.gpu_memory_utilization}")

    def kv_storage(self, compute_dtype: str) -> str:
        """The KV pool's element type (a torch dtype's name) for a model computing in compute_dtype (float32,
        bfloat16, float16): kv_cache_dtype resolved. No torch here: the CPU plan asks too."""
        return {"auto": compute_dtype, "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}.get(
            self.kv_cache_dtype, "float8_e4m3fn"
        )

    @property
    def model_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


def _at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, not {value!r}")
