"""How much memory a model takes before it is loaded: its shape, then weights at the chosen quantization and KV
bytes per token. A Hugging Face directory's (and a random preset's) shape is the model transformers builds from its
config on the meta device (accelerate's init_empty_weights: no memory, any architecture), its parameters counted
from those tensors; a GGUF's is read from its header (no conversion), with Llama-shaped arithmetic. doctor,
`appliance models` and the console use them."""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from appliance.models.gguf_header import GGUFHeaderError, read_header
from appliance.settings import Settings
from engine import transformers_class
from engine.cpu.hardware import auto_cpu_dtype, auto_quantization, cpu_flags
from engine.model.sources import RANDOM_PREFIX, default_model_path
from web.system.models import Fit

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedTokenizerBase

# bitsandbytes 4-bit: half a byte per weight plus one float32 absmax per 64-weight block (no double quant);
# int8: one byte plus a float32 scale per row, negligible. Embeddings and lm_head are not quantized.
QUANTIZED_BYTES_PER_PARAM = {"nf4": 0.5 + 4 / 64, "fp4": 0.5 + 4 / 64, "int8": 1.0}
PRESET_VOCAB = 49152  # the random presets use the bundled model's tokenizer
CUDA_OVERHEAD_BYTES = 1 << 30  # CUDA context, allocator slack and one forward's activations, roughly
# A GGUF's linear weights on a CPU in float32 (engine/model/gguf_load.py): bytes per weight of the packed form each
# block type becomes (engine/cpu/packed_linear.py; per 512 weights, scales + codes): Q4_1 -> q4, Q8_0 and Q4_0 -> q8,
# Q4_K -> q4f, Q6_K -> q8f. Other types are dequantized to float32.
PACKED_BYTES_PER_WEIGHT = {3: (64 + 256) / 512, 8: (32 + 512) / 512, 2: (32 + 512) / 512, 12: 0.75, 14: 1.25}
# The tensor-by-tensor load's peak beyond its final weights: the GGUF's vocabulary parsed (config and tokenizer, then
# the reader), a chunk of rows in flight, and, for a type no form holds, its float32 tensor and the exact-packing
# search's temporaries (about three of it); with the process's own imports. `python -m bench.gguf_load --shape 1b`:
# peak 2,167 MiB for 1,268 MiB of weights (253 of it the imports).
STREAM_LOAD_BYTES = 1 << 30
FALLBACK_COPIES = 3
# bitsandbytes on a streamed GGUF (engine/model/bnb.py): each linear weight is dequantized whole on the host in the
# compute dtype, then quantized on the device; the rest goes to the device a chunk of rows at a time.


@dataclass(frozen=True, slots=True)
class Shape:
    params: int
    linear_params: int  # in the Linear layers bitsandbytes quantizes (all but the output head)
    layers: int
    kv_heads: int
    head_dim: int
    context: int
    cpu_float32_bytes: int | None = None  # a GGUF's weights as the engine keeps them on a CPU in float32
    largest_fallback: int = 0  # a GGUF's largest linear weight no packed form holds, as float32 bytes
    largest_linear: int = 0  # a GGUF's largest linear weight bitsandbytes quantizes, in weights
    cpu_blocks_bytes: int = 0  # a GGUF's linear weights in the blocks the packed kernel multiplies: kept on a CPU in
    # bfloat16 beside the bf16 weights (engine/cpu/split_linear.py), unless the load measures them never faster

    def weights_bytes(self, quantization: str, dtype_bytes: int) -> int:
        per_param = QUANTIZED_BYTES_PER_PARAM.get(quantization, dtype_bytes)
        return int(self.linear_params * per_param + (self.params - self.linear_params) * dtype_bytes)

    def kv_bytes_per_token(self, dtype_bytes: int, kv_cache_dtype: str = "auto") -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x bytes, in the pool's element type
        (APPLIANCE_KV_CACHE_DTYPE; auto: the model's dtype_bytes); in 8 bits each row's bf16 scale too, as the
        engine's pool holds them (engine.model.kv_cache)."""
        row = {
            "int8": self.head_dim + 2,
            "fp8": self.head_dim + 2,
            "bf16": 2 * self.head_dim,
            "fp16": 2 * self.head_dim,
        }
        return 2 * self.layers * self.kv_heads * row.get(kv_cache_dtype, self.head_dim * dtype_bytes)


def model_shape(model: str) -> Shape:
    """Raises ValueError (unknown form or unreadable file) or engine.ModelLoadError (default not installed)."""
    if model.startswith(RANDOM_PREFIX):
        from engine.model.presets import get_preset  # torch and transformers: seconds, only when asked

        vocabulary = cast("PreTrainedTokenizerBase", _PresetVocabulary())  # all hf_config reads of a tokenizer
        return _from_config(get_preset(model.removeprefix(RANDOM_PREFIX)).hf_config(vocabulary))
    path = default_model_path() if model == "default" else Path(model).expanduser()
    if path.is_dir():
        return hf_directory_shape(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _from_gguf(path)
    raise ValueError(f"{model} is not a model directory, a .gguf file or random:<preset>")


def hf_directory_shape(path: Path) -> Shape:
    """Raises ValueError when config.json is missing or names no causal LM transformers knows."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} holds no config.json: not a Hugging Face model directory")
    try:
        config = transformers_class("AutoConfig").from_pretrained(path)
    except (ValueError, OSError, KeyError) as exc:  # bad JSON, no model_type, an unknown one
        raise ValueError(f"{path / 'config.json'}: {exc}") from None
    return _from_config(config)


class _PresetVocabulary:
    """What a preset's config asks of a tokenizer: its size (the bundled one's) and no special ids."""

    bos_token_id = eos_token_id = pad_token_id = None

    def __len__(self) -> int:
        return PRESET_VOCAB


def _from_config(config: PreTrainedConfig) -> Shape:
    import torch
    from accelerate import init_empty_weights

    try:
        with init_empty_weights():
            model = transformers_class("AutoModelForCausalLM").from_config(config)
    except ValueError as exc:  # not a causal LM ("Unrecognized configuration class")
        raise ValueError(f"{config.model_type!r} is not a causal LM transformers can build: {exc}") from None
    head = model.get_output_embeddings()
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    linear = {
        id(p): p.numel()
        for module in model.modules()
        if isinstance(module, torch.nn.Linear) and module is not head
        for p in module.parameters()
        if id(p) not in head_ids
    }
    text = config.get_text_config()
    heads = text.num_attention_heads
    return Shape(
        params=sum(p.numel() for p in model.parameters()),  # tied weights are one parameter, counted once
        linear_params=sum(linear.values()),
        layers=text.num_hidden_layers,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        context=getattr(text, "max_position_embeddings", None) or 2048,
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
    head_dim = int(key_length) if key_length is not None else hidden // heads
    layers, kv_heads = int(field(f"{arch}.block_count")), int(field(f"{arch}.attention.head_count_kv"))
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    linear = layers * (attention + 3 * hidden * int(field(f"{arch}.feed_forward_length")))
    tied = "output.weight" not in header.tensor_names
    embeddings = header.array_lengths.get("tokenizer.ggml.tokens", 0) * hidden * (1 if tied else 2)
    compact, fallback, largest, blocks = 0, 0, 0, 0
    for name, (kind, dims) in header.tensors.items():
        count = math.prod(dims)
        if name.startswith("blk.") and len(dims) == 2:
            largest = max(largest, count)
        packed = PACKED_BYTES_PER_WEIGHT.get(kind) if len(dims) == 2 else None
        if name == "token_embd.weight":  # the embedding stays float32; a tied head is packed from it
            compact += 4 * count + (int((packed or 4) * count) if tied else 0)
            blocks += int(packed * count) if tied and packed else 0
        elif packed is None:
            compact += 4 * count
            fallback = max(fallback, 4 * count if len(dims) == 2 else 0)
        else:
            compact += int(packed * count)
            blocks += int(packed * count)
    return Shape(
        params=linear + embeddings,
        linear_params=linear,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        context=int(field(f"{arch}.context_length")),
        cpu_float32_bytes=compact,
        largest_fallback=fallback,
        largest_linear=largest,
        cpu_blocks_bytes=blocks,
    )


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    weights: int
    kv_per_token: int
    context: int  # tokens one full-length sequence holds
    overhead: int
    load_peak: int  # host memory while the weights load: for a GGUF, more than the weights it leaves (on a GPU: RAM
    # the load passes through, not the weights)

    @property
    def minimum(self) -> int:
        """Weights, KV for one sequence at full context, and the runtime's own share."""
        return self.weights + self.kv_per_token * self.context + self.overhead


def memory_need(
    shape: Shape,
    quantization: str,
    dtype_bytes: int,
    max_model_len: int | None,
    gpu: bool,
    kv_cache_dtype: str = "auto",
) -> MemoryNeed:
    context = min(shape.context, max_model_len) if max_model_len else shape.context
    weights = shape.weights_bytes(quantization, dtype_bytes)
    peak = 0 if gpu else weights  # from_pretrained puts a directory's weights on a GPU directly
    if shape.cpu_float32_bytes is not None and quantization == "none":
        if not gpu and dtype_bytes == 4:
            weights = shape.cpu_float32_bytes
        elif not gpu:  # 16 bits: the blocks counted as kept beside them (they are where the CPU has oneDNN's bf16)
            weights += shape.cpu_blocks_bytes
        peak = (0 if gpu else weights) + STREAM_LOAD_BYTES + FALLBACK_COPIES * shape.largest_fallback
    elif shape.cpu_float32_bytes is not None and gpu:  # bitsandbytes quantizes it as it streams
        peak = STREAM_LOAD_BYTES + shape.largest_linear * dtype_bytes
    elif shape.cpu_float32_bytes is not None:  # on a CPU the plan then searches a packed form for the 16-bit rest
        peak = weights + STREAM_LOAD_BYTES + FALLBACK_COPIES * 4 * (shape.params - shape.linear_params)
    return MemoryNeed(
        weights=weights,
        kv_per_token=shape.kv_bytes_per_token(dtype_bytes, kv_cache_dtype),
        context=context,
        overhead=CUDA_OVERHEAD_BYTES if gpu else 0,
        load_peak=peak,
    )


CHAT_TOKENS = 2048  # the chat length fit is counted in, unless the context is shorter
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class Machine:
    """The memory a model would be served in, and the precision the settings resolve to on it."""

    gpu: bool
    available: int  # free VRAM (within the cap), or available RAM
    quantization: str
    dtype: str
    ram: int | None = None  # available RAM beside a GPU, which the load passes through (None: not asked)


def machine(settings: Settings) -> Machine:
    """nvidia-smi, not torch, asks the GPU: a CUDA context in this process would cost VRAM and seconds."""
    import psutil

    free = None if settings.device == "cpu" else _free_vram(settings.device)
    device = "cpu" if free is None else "cuda"
    flags = cpu_flags()
    quantization = auto_quantization(device, flags) if settings.quantization == "auto" else settings.quantization
    dtype = ("bfloat16" if free is not None else auto_cpu_dtype(flags)) if settings.dtype == "auto" else settings.dtype
    if free is None:
        return Machine(False, psutil.virtual_memory().available, quantization, dtype)
    cap = settings.gpu_memory_cap_bytes
    ram = psutil.virtual_memory().available
    return Machine(True, min(free, cap) if cap else free, quantization, dtype, ram)


def _free_vram(device: str) -> int | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    index = device.partition(":")[2] or "0"
    try:
        done = subprocess.run(
            [smi, "-i", index, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return int(float(done.stdout.strip().splitlines()[0])) << 20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def fit(shape: Shape, settings: Settings, on: Machine, reclaim: int = 0) -> Fit:
    """Weights + KV for as many CHAT_TOKENS-token chats as the KV memory holds: on a GPU what is left of the
    usable free VRAM (APPLIANCE_GPU_MEMORY_UTILIZATION) after weights and CUDA's share, on a CPU the fixed pool
    (APPLIANCE_KV_CACHE_BYTES), which must fit in available RAM beside the weights. `reclaim`: bytes a switch
    frees first (the served model's)."""
    kv_dtype = settings.kv_cache_dtype
    need = memory_need(shape, on.quantization, DTYPE_BYTES[on.dtype], settings.max_model_len, on.gpu, kv_dtype)
    chat_tokens = min(CHAT_TOKENS, need.context)
    kv_per_chat = need.kv_per_token * chat_tokens
    available = on.available + reclaim
    if on.gpu:
        kv_budget = int(available * settings.gpu_memory_utilization) - need.weights - need.overhead
        room = on.ram is None or need.load_peak <= on.ram
    else:
        kv_budget = settings.kv_cache_bytes
        room = max(need.weights + kv_budget, need.load_peak) <= available
    chats = max(kv_budget, 0) // kv_per_chat if kv_per_chat else 0
    return Fit(
        fits=room and chats >= 1,
        memory="VRAM" if on.gpu else "RAM",
        available=available,
        weights=need.weights,
        kv_per_chat=kv_per_chat,
        chats=chats,
        chat_tokens=chat_tokens,
        precision=f"{on.quantization}, {on.dtype}" + ("" if kv_dtype == "auto" else f", KV {kv_dtype}"),
        load_peak=need.load_peak if not (on.gpu and room) else 0,
    )
