"""A GGUF file as a model source: its readable name, its load tensor by tensor (engine.model.gguf_load) with only
its config and tokenizer cached (bitsandbytes quantizing each linear layer as it is read, where configured), and
the whole-file conversion into a float32 safetensors directory that vLLM and the files the streamed load cannot
take still use."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from engine.cpu.kernel_build import KernelBuildError, build_packed_linear
from engine.errors import ModelLoadError
from engine.model.gguf_load import GGUFStreamUnsupported, load_gguf, quick_gguf_reads
from engine.model.load_progress import Progress, bars_as_lines, heartbeat, step
from engine.model.model_cache import gguf_cache_dir, is_complete, staging_dir
from engine.model.sources import default_model_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from engine.model.bnb import LayerQuantizer

# A quantization tag ending a GGUF stem ("model.Q4_1", "model-Q4_K_M", "model.f16") is not part of its name.
_QUANT_TAG = re.compile(r"[.-](?:I?Q\d\w*|B?F16|F32)$", re.IGNORECASE)


def gguf_path(spec: str) -> Path | None:
    """The GGUF file APPLIANCE_MODEL names ("default" is the bundled one), None where it names something else."""
    path = default_model_path() if spec == "default" else Path(spec).expanduser()
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None


def gguf_name(gguf: Path) -> str:
    return _QUANT_TAG.sub("", gguf.stem)


def streamed_gguf(
    gguf: Path,
    cache_root: Path,
    device: torch.device,
    dtype: torch.dtype,
    compact: bool,
    attn: str | None,
    quantizer: LayerQuantizer | None,
    report: Progress,
) -> tuple[PreTrainedModel, Path, Counter[str]] | None:
    """The GGUF loaded tensor by tensor, the directory of its cached config and tokenizer (in gguf-config/, a
    folder vLLM and the benchmarks do not take for a converted model) and the packed forms its linear layers took;
    None where the file needs the whole conversion (converted_gguf). compact: the CPU plan packs linear layers."""
    config_dir = gguf_cache_dir(gguf, cache_root / "gguf-config")
    quick_gguf_reads()
    if not is_complete(config_dir):
        report(f"reading the config and tokenizer from the GGUF (once, into {config_dir}) …")
        with (
            step(f"reading {gguf}'s metadata"),
            staging_dir(config_dir) as staging,
            heartbeat(report, "reading the GGUF's config and tokenizer"),
        ):
            AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
    try:
        compact = compact and bool(build_packed_linear("q4", round_bf16=dtype == torch.bfloat16))
    except KernelBuildError as exc:
        report(f"linear layers stay torch's: the packed kernel is unavailable ({exc})")
        compact = False
    report(f"loading {gguf.name} tensor by tensor …")
    try:
        with step(f"loading {gguf}"), heartbeat(report, "loading the GGUF's tensors"):
            model, forms = load_gguf(gguf, config_dir, device, dtype, compact, attn, quantizer)
    except ModelLoadError as exc:
        if not isinstance(exc.__cause__, GGUFStreamUnsupported):
            raise
        report(f"{exc.__cause__}: converting the whole file instead")
        return None
    return model, config_dir, forms


def converted_gguf(gguf: Path, cache_root: Path, report: Progress) -> Path:
    """The GGUF converted whole, once, into a float32 safetensors directory under cache_root."""
    target = gguf_cache_dir(gguf, cache_root)
    if is_complete(target):
        return target
    report(f"converting GGUF to safetensors (once, into {target}) …")
    quick_gguf_reads()
    with step(f"converting {gguf} to safetensors"), staging_dir(target) as staging, bars_as_lines(report):
        # Parsing the GGUF's metadata (its vocabulary) alone takes seconds, and both steps do it: hence heartbeats.
        with heartbeat(report, "converting the weights from the GGUF"):
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            # The weights are dequantized now, but the GGUF quantizer marker would make save_pretrained refuse
            # ("quantized with gguf and is not serializable").
            model.hf_quantizer = None  # type: ignore[assignment]
            del model.config.quantization_config
            model.save_pretrained(staging, safe_serialization=True)
            del model
        with heartbeat(report, "converting the tokenizer from the GGUF"):
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
    return target
