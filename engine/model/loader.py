"""Model loading: turns EngineConfig.model into an eval-mode model, its tokenizer and the engine's sizes.

Sources: "default" (the bundled SmolLM2 GGUF), a .gguf file (engine.model.gguf_source), a Hugging Face model
directory, random:<preset> (seeded random weights of a preset's shape with the bundled tokenizer).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from engine.config import EngineConfig
from engine.cpu.hardware import auto_cpu_dtype, auto_quantization, cpu_flags, describe
from engine.cpu.packed_linear import pack_linears
from engine.cpu.plan import CpuPlan, Decision, Linears, cpu_plan, this_machine
from engine.cpu.prepack import onednn_bf16, prepack_linears
from engine.cpu.split_linear import SplitLinear, crossover, split_at
from engine.errors import ModelLoadError
from engine.model.bnb import LayerQuantizer, bnb_config
from engine.model.gguf_load import NATIVE_TYPES, quick_gguf_reads
from engine.model.gguf_source import converted_gguf, gguf_name, gguf_path, streamed_gguf
from engine.model.load_progress import Progress, bars_as_lines, step
from engine.model.model_cache import gguf_cache_dir, is_complete, staging_dir
from engine.model.presets import PRESETS, build_random_model, get_preset
from engine.model.sources import RANDOM_PREFIX, default_model_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(slots=True)
class LoadedModel:
    model: PreTrainedModel  # eval mode, on its device, requires_grad off
    tokenizer: PreTrainedTokenizerBase
    name: str  # the served name
    source_dir: Path  # config + tokenizer (+ safetensors unless built in memory); the tokenizer reloads here
    device: torch.device
    dtype: torch.dtype  # compute/activation dtype; the KV cache too, unless kv_cache_dtype says otherwise
    quantization: str
    weights_bytes: int  # parameters + buffers as loaded (quantized size when quantized)
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    cpu_plan: CpuPlan  # engine.cpu.plan: the linear layers' outcome recorded; the core settles the rest


def resolve_device(spec: str) -> torch.device:
    """ "auto" picks CUDA when present; an explicit CUDA device that is absent is an error, not a fallback."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ModelLoadError(f"device {spec!r} was asked for but this torch build sees no CUDA device")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ModelLoadError(f"device {spec!r} does not exist: {torch.cuda.device_count()} CUDA devices seen")
    return torch.device("cuda", index)


def resolve_dtype(spec: str, device: torch.device, flags: frozenset[str] | None = None) -> torch.dtype:
    if spec != "auto":
        return getattr(torch, spec)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    # Greedy-equality tests pin float32: bf16 rounds differently from a transformers fp32 reference run.
    return getattr(torch, auto_cpu_dtype(cpu_flags() if flags is None else flags))


def resolve_quantization(spec: str, device: torch.device, flags: frozenset[str] | None = None) -> str:
    if spec != "auto":
        return spec
    return auto_quantization(device.type, cpu_flags() if flags is None else flags)


def load_model(
    config: EngineConfig, progress: Progress | None = None, attn_implementation: str | None = None
) -> LoadedModel:
    """Load config.model ready to serve. Every failure is a ModelLoadError that says what was tried."""
    report = progress or (lambda _message: None)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if "auto" in (config.dtype, config.quantization):
        config = replace(config, quantization=resolve_quantization(config.quantization, device))  # type: ignore[arg-type]
        hardware = "CUDA" if device.type == "cuda" else f"CPU flags: {describe(cpu_flags())}"
        chosen = f"quantization {config.quantization}, compute dtype {str(dtype).removeprefix('torch.')}"
        report(f"auto choices on {device}: {chosen} ({hardware})")
    streamed: Counter[str] = Counter()  # linear layers packed from a GGUF's own blocks, by form
    gguf = gguf_path(config.model)
    tokenizer: PreTrainedTokenizerBase | None = None
    if config.model.startswith(RANDOM_PREFIX):
        name = config.model
        model, source_dir, tokenizer = _random_model(config, device, dtype, attn_implementation, report)
    elif gguf is not None:
        name = gguf_name(gguf)
        model, source_dir, streamed = _gguf_model(gguf, config, device, dtype, attn_implementation, report)
    else:
        source_dir, name = _checkpoint_dir(config.model, config.model_cache_dir, report)
        model = _from_pretrained(source_dir, config.quantization, device, dtype, attn_implementation, report)
    if tokenizer is None:
        report("loading tokenizer …")
        with step(f"loading the tokenizer from {source_dir}"):
            tokenizer = AutoTokenizer.from_pretrained(source_dir)
    model.eval()
    model.requires_grad_(False)
    plan = cpu_plan(config, device.type, _name(dtype), type(model).__name__, this_machine(onednn_bf16()))
    if plan.linears.choice in (Linears.PREPACKED, Linears.SPLIT):
        with step("laying out the linear layers for oneDNN"):
            report(f"prepacked {prepack_linears(model)} bf16 linear layers for oneDNN")
    if plan.linears.choice is Linears.SPLIT:
        with step("timing the linear layers' compact blocks against oneDNN's layout"):
            plan = _split(plan, model, streamed, report)
    if plan.linears.choice is Linears.COMPACT:
        with step("packing the linear layers' weights"):
            plan = _compacted(plan, streamed + pack_linears(model), report)
    with step(f"reading the shape of {name}"):
        text = model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        max_len = text.max_position_embeddings
    if config.max_model_len is not None:
        max_len = min(max_len, config.max_model_len)
    tensors = chain(model.parameters(), model.buffers())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=config.served_model_name or name,
        source_dir=source_dir,
        device=device,
        dtype=dtype,
        quantization=config.quantization,
        weights_bytes=sum(t.numel() * t.element_size() for t in tensors),
        max_model_len=max_len,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        num_layers=text.num_hidden_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        cpu_plan=plan,
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _compacted(plan: CpuPlan, counts: Counter[str], report: Progress) -> CpuPlan:
    """The plan with the compact weights' outcome: the forms the layers took, or plain where none took one."""
    forms = ", ".join(f"{form} {n}" for form, n in sorted(counts.items())) or "no linear layers"
    report(f"linear layers' weights, by the form that holds them exactly: {forms}")
    if set(counts) <= {"plain"}:
        why = "no compact form holds their weights exactly, or the packed kernel does not build (the log says which)"
        return plan.settled(linears=Decision(Linears.PLAIN, why))
    return plan.settled(linears=Decision(Linears.COMPACT, f"{plan.linears.reason}: {forms}"))


def _split(plan: CpuPlan, model: nn.Module, counts: Counter[str], report: Progress) -> CpuPlan:
    """The plan with the split layers' outcome: up to how many rows the blocks are multiplied (measured here), or
    prepacked alone where no layer kept blocks or they were never the faster."""
    layers = [m for m in model.modules() if isinstance(m, SplitLinear)]
    prepacked = "in bfloat16, weights laid out once for oneDNN"
    if not layers:
        why = (
            f"{prepacked}: no layer kept blocks the compact kernel multiplies (a GGUF's {NATIVE_TYPES}), or the "
            "kernel does not build (the log says which)"
        )
        return plan.settled(linears=Decision(Linears.PREPACKED, why))
    found = crossover(layers, plan.threads.choice)
    split_at(layers, found.rows)
    report(f"{found.summary()}: the blocks up to {found.rows} rows")
    if found.rows == 0:
        why = f"{prepacked}: a GGUF's blocks were never the faster ({found.summary()})"
        return plan.settled(linears=Decision(Linears.PREPACKED, why))
    forms = ", ".join(f"{form} {n}" for form, n in sorted(counts.items()))
    why = f"a GGUF's blocks ({forms}) up to {found.rows} rows, oneDNN's layout above ({found.summary()})"
    return plan.settled(linears=Decision(Linears.SPLIT, why))


def _gguf_model(
    gguf: Path, config: EngineConfig, device: torch.device, dtype: torch.dtype, attn: str | None, report: Progress
) -> tuple[PreTrainedModel, Path, Counter[str]]:
    """A GGUF tensor by tensor, its blocks packed where the CPU plan packs linear layers, or quantized by
    bitsandbytes as they are read; converted whole where the streamed load cannot take the file."""
    linears = cpu_plan(config, device.type, _name(dtype), None, this_machine(onednn_bf16())).linears
    compact = linears.choice in (Linears.COMPACT, Linears.SPLIT)
    quantizer = None if config.quantization == "none" else LayerQuantizer(config.quantization, dtype, device)
    loaded = streamed_gguf(
        gguf, config.model_cache_dir, device, dtype, compact and quantizer is None, attn, quantizer, report
    )
    if loaded is not None:
        return loaded
    source_dir = converted_gguf(gguf, config.model_cache_dir, report)
    model = _from_pretrained(source_dir, config.quantization, device, dtype, attn, report)
    return model, source_dir, Counter()


def _checkpoint_dir(spec: str, cache_root: Path, report: Progress) -> tuple[Path, str]:
    """The safetensors directory to load for `spec` (a GGUF is converted first) and its readable name."""
    path = default_model_path() if spec == "default" else Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return converted_gguf(path, cache_root, report), gguf_name(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a directory but holds no config.json: not a Hugging Face model")
        return path, path.resolve().name
    known = ", ".join(RANDOM_PREFIX + key for key in PRESETS)
    what = "is not a .gguf file" if path.exists() else "does not exist"
    raise ModelLoadError(
        f"model {spec!r} {what}; expected 'default', a .gguf file, "
        f"a Hugging Face model directory (config.json + safetensors) or one of {known}"
    )


def _from_pretrained(
    source_dir: Path,
    quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
    report: Progress,
) -> PreTrainedModel:
    with step(f"reading {source_dir / 'config.json'}"):
        hf_config = AutoConfig.from_pretrained(source_dir)
    if hf_config.is_encoder_decoder or hf_config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"{source_dir} holds a {hf_config.model_type!r} model; only decoder-only causal LMs can be served"
        )
    # device_map puts the weights straight onto the device (no CPU copy first); bitsandbytes requires it.
    kwargs: dict[str, Any] = {"dtype": dtype, "device_map": {"": device}}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    how = "without quantization"
    if quantization != "none":
        kwargs["quantization_config"] = bnb_config(quantization, dtype)
        how = f"quantized to {quantization} by bitsandbytes"
    report(f"loading weights {how} …")
    with step(f"loading {source_dir} {how} on {device}"), bars_as_lines(report):
        return AutoModelForCausalLM.from_pretrained(source_dir, **kwargs)


def _random_model(
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
    report: Progress,
) -> tuple[PreTrainedModel, Path, PreTrainedTokenizerBase]:
    """Seeded random weights with the default model's tokenizer (returned too: the folder's).

    Unquantized, the model is built in memory; random-<preset>/ then holds only config + tokenizer.
    bitsandbytes quantizes only in from_pretrained, so a quantized one is first saved, once, to
    random-<preset>-seed<seed>/.
    """
    preset_name = config.model.removeprefix(RANDOM_PREFIX)
    preset = get_preset(preset_name)
    cache_root = config.model_cache_dir
    base_dir = random_model_dir(preset_name, cache_root, report)
    with step(f"reading the tokenizer in {base_dir}"):
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
    hf_config = preset.hf_config(tokenizer)
    if config.quantization == "none":
        report(f"building random {preset_name} weights (seed {config.seed}) …")
        with step(f"building {config.model} on {device}"):
            model = build_random_model(hf_config, config.seed, device, dtype, attn_implementation)
        return model, base_dir, tokenizer
    weights_dir = cache_root / f"random-{preset_name}-seed{config.seed}"
    if not is_complete(weights_dir):
        report(f"building random {preset_name} weights (seed {config.seed}) to quantize …")
        with step(f"writing {weights_dir}"), staging_dir(weights_dir) as staging:
            model = build_random_model(hf_config, config.seed, device, dtype, None)
            model.save_pretrained(staging, safe_serialization=True)
            del model
            tokenizer.save_pretrained(staging)
    model = _from_pretrained(weights_dir, config.quantization, device, dtype, attn_implementation, report)
    return model, weights_dir, tokenizer


def random_model_dir(preset_name: str, cache_root: Path, report: Progress | None = None) -> Path:
    """random-<preset>/ under cache_root: the preset's config and the default model's tokenizer, written once.

    Copying this folder to another machine lets it build the random model without the bundled GGUF."""
    preset = get_preset(preset_name)
    base_dir = cache_root / f"random-{preset_name}"
    if not is_complete(base_dir):
        if report is not None:
            report("saving the default tokenizer for the random model …")
        with step(f"writing {base_dir}"), staging_dir(base_dir) as staging:
            tokenizer = _default_tokenizer(cache_root)
            preset.hf_config(tokenizer).save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    return base_dir


def _default_tokenizer(cache_root: Path) -> PreTrainedTokenizerBase:
    try:
        gguf = default_model_path()
    except ModelLoadError:
        # Without the bundled package (a bare GPU test machine), any random-<preset>/ folder carried over holds
        # the same tokenizer.
        for folder in sorted(cache_root.glob("random-*")):
            if is_complete(folder) and (folder / "tokenizer.json").is_file():
                return AutoTokenizer.from_pretrained(folder)
        raise
    converted = gguf_cache_dir(gguf, cache_root)
    if is_complete(converted):
        return AutoTokenizer.from_pretrained(converted)
    # Reading just the tokenizer from the GGUF takes ~3 s; a full conversion would take ~15 s.
    quick_gguf_reads()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every id that ends a turn: generation_config may list several (e.g. <|eot_id|> and <|end_of_text|>)."""
    generation_eos = getattr(model.generation_config, "eos_token_id", None)
    candidates = [
        *(generation_eos if isinstance(generation_eos, list) else [generation_eos]),
        tokenizer.eos_token_id,
    ]
    return tuple(dict.fromkeys(token_id for token_id in candidates if isinstance(token_id, int)))
