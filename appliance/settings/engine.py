"""The engine's settings: which engine serves (the embedded one or a supervised vLLM), which model, and how it
batches, caches and computes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from appliance.settings.field import PREFIX, SettingsError, at_least_one, setting

ENGINES = ("embedded", "vllm")
# vLLM quantizes at load only through bitsandbytes' 4-bit NF4 (on CUDA); on a CPU it serves unquantized weights.
VLLM_QUANTIZATIONS = ("auto", "none", "nf4")
# vLLM's --kv-cache-dtype: auto (the model's dtype) or fp8 (e4m3 on CUDA); it has no int8 KV cache.
VLLM_KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class EngineSettings:
    engine: str = setting(
        "embedded",
        "Engine: embedded (the appliance's own), or vllm (a local vLLM OpenAI server it starts and supervises; "
        "install.sh --engine vllm makes its venv).",
    )
    vllm_python: str | None = setting(
        None,
        "The vLLM venv's python, for APPLIANCE_ENGINE=vllm.",
        default_doc="the install's PREFIX/vllm-venv, or data/peers/vllm in a checkout (make vllm-env)",
    )
    model: str = setting(
        "default",
        "Model: default (bundled SmolLM2-135M-Instruct), a HF directory, a .gguf or random:<preset>.",
    )
    served_model_name: str | None = setting(None, "Model name the API answers to (default: the model's own name).")
    embedding_model: str = setting(
        "default",
        "Embedding model of /v1/embeddings and /api/embed, in its own process beside the chat model: default "
        "(bundled all-MiniLM-L6-v2), a sentence-transformers or HF encoder directory, or none (those routes "
        "answer 404). One that fails to start is logged; the chat model serves on.",
    )
    quantization: str = setting("auto", "Weight quantization: auto (nf4 on CUDA, none on a CPU), none, nf4, fp4, int8.")
    dtype: str = setting(
        "auto",
        "Compute dtype: auto (bfloat16 on CUDA and on CPUs with native bf16 matmuls, else float32), float32, "
        "bfloat16 or float16.",
    )
    device: str = setting("auto", "Device: auto, cpu, cuda or cuda:N.")
    max_num_seqs: int = setting(128, "Most requests decoded together in one batch.")
    max_num_batched_tokens: int = setting(512, "Most tokens (prefill + decode) computed in one engine step.")
    max_queue: int = setting(1024, "Most requests waiting for a seat; beyond it requests get 503 + Retry-After.")
    policy: str = setting(
        "fair", "Who waits: fair (per-key fair share, interactive before batch) or fcfs (arrival order)."
    )
    kv_cache_bytes: int = setting(1 << 30, "KV-cache pool size in bytes on CPU (GPU sizes it by utilization).")
    kv_cache_dtype: str = setting(
        "auto",
        "KV-cache element type: auto (the compute dtype, exact), bf16, fp16, or 8-bit: int8 or fp8 (e4m3), each "
        "with a scale per token and KV head: about twice the tokens (chats) in the same memory, at a small "
        "cost in fidelity. APPLIANCE_ENGINE=vllm takes auto or fp8 (--kv-cache-dtype).",
    )
    num_kv_blocks: int | None = setting(None, "Exact number of KV blocks (overrides the byte/utilization sizing).")
    gpu_memory_utilization: float = setting(0.90, "Fraction of GPU memory the engine may use (weights + KV).")
    gpu_memory_cap_bytes: int | None = setting(
        None, "Most GPU memory the engine may use, in bytes (emulate a smaller card on a bigger one)."
    )
    cpu_threads: int | None = setting(None, "Torch threads on a CPU-only machine (default: cores - 1, min 1).")
    decode_attention: str = setting(
        "auto",
        "Decode attention: auto (on a CPU, a kernel built at start with the host's C compiler, else torch's), "
        "compiled (that kernel, or no start) or torch.",
    )
    compact_weights: bool = setting(
        True,
        "On a CPU in float32: keep each linear layer's weights in the narrowest form that holds them exactly "
        "(the 4- and 8-bit blocks of a GGUF, bfloat16) and widen them in registers; false keeps float32.",
    )
    own_forward: bool = setting(
        True,
        "On a CPU in float32 or bfloat16, Llama and Qwen2 models run the engine's own forward (the same arithmetic as "
        "transformers' in a few calls per layer); false runs transformers' modules.",
    )
    max_model_len: int | None = setting(None, "Cap on prompt + completion tokens (default: the model's context).")

    @property
    def vllm_interpreter(self) -> Path:
        """The set APPLIANCE_VLLM_PYTHON, else the first default that exists (else the install's)."""
        if self.vllm_python:
            return Path(self.vllm_python).expanduser()
        candidates = default_vllm_pythons()
        return next((p for p in candidates if p.is_file()), candidates[0])


def default_vllm_pythons() -> list[Path]:
    """install.sh puts the vLLM venv beside the appliance's (PREFIX/venv, PREFIX/vllm-venv); a checkout's
    `make vllm-env` puts it under data/peers/."""
    installed = Path(sys.prefix).parent / "vllm-venv" / "bin" / "python"
    checkout = Path(__file__).resolve().parents[2] / "data" / "peers" / "vllm" / "bin" / "python"
    return [installed, checkout]


def check_engine_sizes(s: EngineSettings) -> None:
    at_least_one(s, "max_num_seqs", "max_num_batched_tokens", "max_queue", "kv_cache_bytes")
    if not s.embedding_model:
        raise SettingsError(f"{PREFIX}EMBEDDING_MODEL must be default, a model directory or none")
    if s.served_model_name is not None and not s.served_model_name.strip():
        raise SettingsError(f"{PREFIX}SERVED_MODEL_NAME must not be blank")


def check_engine_choice(s: EngineSettings) -> None:
    if s.engine not in ENGINES:
        raise SettingsError(f"{PREFIX}ENGINE must be {' or '.join(ENGINES)}, not {s.engine!r}")
    if s.engine == "vllm":
        _check_vllm(s)


def _check_vllm(s: EngineSettings) -> None:
    python = s.vllm_interpreter
    if not python.is_file():
        how = (
            f"{PREFIX}VLLM_PYTHON={s.vllm_python}"
            if s.vllm_python
            else "no vLLM venv at " + " or ".join(str(p) for p in default_vllm_pythons())
        )
        raise SettingsError(
            f"{PREFIX}ENGINE=vllm needs vLLM's python, and {how} does not exist: make it with "
            f"install.sh --engine vllm (or make vllm-env in a checkout), or point {PREFIX}VLLM_PYTHON at one"
        )
    if s.quantization not in VLLM_QUANTIZATIONS:
        raise SettingsError(
            f"{PREFIX}QUANTIZATION={s.quantization} is not for {PREFIX}ENGINE=vllm: it takes "
            f"{', '.join(VLLM_QUANTIZATIONS)} (nf4 is bitsandbytes on CUDA)"
        )
    if s.model.startswith("random:"):
        raise SettingsError(f"{PREFIX}ENGINE=vllm serves a real model, not {s.model}")
    if s.kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
        raise SettingsError(
            f"{PREFIX}KV_CACHE_DTYPE={s.kv_cache_dtype} is not for {PREFIX}ENGINE=vllm: vLLM has no int8 KV cache, "
            f"and keeps a 16-bit one in the model's dtype; it takes {' or '.join(VLLM_KV_CACHE_DTYPES)} "
            "(--kv-cache-dtype)"
        )
