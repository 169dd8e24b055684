"""A GGUF file loaded straight into the engine's form, one tensor at a time: no float32 copy of the whole model.

The file is memory-mapped (gguf's GGUFReader) and the model built on the meta device from the config transformers
derives from the GGUF's metadata. Each parameter is then made from its GGUF tensor alone, with transformers' own
tensor-name map and its reversal of llama.cpp's Q/K row permutation (applied to row indices, so to blocks as well as
to values). On a CPU in float32 a linear layer keeps the file's blocks where a form of engine.cpu.packed_linear
holds them exactly: Q4_1 -> q4, Q8_0 and Q4_0 -> q8, Q4_K -> q4f, Q6_K -> q8f. Every other type (Q5_K, F16, ...)
is dequantized a few rows at a time, then packed if some form holds it exactly, else kept as it is; so are all
weights on other devices and dtypes but one: on a CPU in bfloat16 a layer of those block types keeps its blocks
beside its bf16 weight (engine.cpu.split_linear, the weight laid out for oneDNN). Each packed chunk is checked
against gguf's own dequantization, which is what transformers' GGUF load computes. The pages of a tensor once read
are handed back to the kernel, so the process holds the final weights, one tensor's transient and little of the
file. In float32 the packed result is cached beside the config (its final form, never float32 whole), so later
starts skip the repacking.
"""

from __future__ import annotations

import functools
import json
import mmap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import gguf
import numpy as np
import numpy.typing as npt
import torch
from accelerate import init_empty_weights
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import Q4_K, dequantize
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    LlamaTensorProcessor,
    TensorProcessor,
    get_gguf_hf_weights_map,
    read_field,
)

from engine.cpu.kernel_build import build_packed_linear
from engine.cpu.packed_linear import PackedLinear, pack_blocks, pack_exactly
from engine.cpu.split_linear import SplitLinear

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from engine.model.bnb import LayerQuantizer

__all__ = ["GGUFStreamUnsupported", "Reader", "load_gguf", "quick_gguf_reads"]

Q = GGMLQuantizationType
NATIVE = {Q.Q4_1: "q4", Q.Q8_0: "q8", Q.Q4_0: "q8", Q.Q4_K: "q4f", Q.Q6_K: "q8f"}
NATIVE_TYPES = ", ".join(t.name for t in NATIVE)
# Processors that only rename and permute rows; the others (MoE splits, norm offsets) change values or shapes.
ROW_PROCESSORS = (TensorProcessor, LlamaTensorProcessor)
CACHE_NAME = "cpu-float32.safetensors"  # the weights in the engine's form on a CPU in float32
CACHE_FORMAT = "1"  # bumped when a packed form's layout changes: an older cache is then rebuilt from the GGUF
SAFETENSORS_TYPES = {torch.float32: "F32", torch.uint8: "U8", torch.float16: "F16", torch.bfloat16: "BF16"}
CHUNK_BYTES = 16 << 20  # float32 bytes of a chunk of rows; 64 MiB ones left more freed heap behind (1b: +460 MiB)


class GGUFStreamUnsupported(ValueError):
    """The file's architecture needs a transformers tensor processor that changes values; convert it whole."""


Blocks = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def load_gguf(
    path: Path,
    config_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    compact: bool,
    attn: str | None,
    quantizer: LayerQuantizer | None = None,
) -> tuple[PreTrainedModel, Counter[str]]:
    """The model of `path` (its config and tokenizer already saved in config_dir), and how many linear layers took
    each packed form. compact: pack linear layers (a CPU in float32, or split ones in bfloat16; the kernel built).
    quantizer: bitsandbytes quantizes each linear layer's weight as it is read (never with compact)."""
    quick_gguf_reads()
    hf_config = AutoConfig.from_pretrained(config_dir)
    extra = {"attn_implementation": attn} if attn else {}
    with init_empty_weights():  # parameters on the meta device; buffers (rotary frequencies) real
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, **extra)
    if quantizer is not None:
        quantizer.prepare(model)
    cached = config_dir / CACHE_NAME
    cacheable = compact and dtype == torch.float32
    if cacheable and cached.is_file() and (counts := _from_cache(model, cached)) is not None:
        return _checked(model, path, counts, device)
    reader = Reader(path)
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=hf_config.to_dict())
    if type(processor) not in ROW_PROCESSORS:
        raise GGUFStreamUnsupported(f"{arch} GGUF tensors need {type(processor).__name__}")
    names = get_gguf_hf_weights_map(model, processor)
    tied_head = (
        compact and hf_config.get_text_config().tie_word_embeddings and model.get_output_embeddings() is not None
    )
    head_name = _module_name(model, model.get_output_embeddings()) if tied_head else None  # packed as well
    packed: list[tuple[str, str, torch.Tensor]] = []
    for tensor in reader.tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        rows = _row_order(processor, tensor)
        targets = [hf_name] + ([f"{head_name}.weight"] if head_name and hf_name.endswith("embed_tokens.weight") else [])
        for target in targets:
            module_name, attr = target.rsplit(".", 1)
            module = model.get_submodule(module_name)
            as_linear = compact and type(module) is nn.Linear and attr == "weight"
            if quantizer is not None and quantizer.takes(module, attr):
                quantizer.quantize(module, _row_chunks(tensor, rows))
                continue
            found = _packed(tensor, rows, dtype) if as_linear else None
            if found is not None and found[2] is not None:  # split: the blocks, and the weight in dtype
                setattr(module, attr, nn.Parameter(found[2], requires_grad=False))
            if found is None:
                values = _dequantized(tensor, rows, dtype, device).view(module.get_parameter(attr).shape)
                exact = pack_exactly(values) if as_linear else None
                if exact is None:
                    setattr(module, attr, nn.Parameter(values, requires_grad=False))
                    continue
                found = (*exact, None)
            packed.append((module_name, found[0], found[1]))
        _release(reader, tensor)
    counts = _replace(model, packed, dtype)
    if cacheable:
        _save_cache(model, cached)
    else:
        model.tie_weights()
    return _checked(model, path, counts, device)


class Reader(GGUFReader):
    """gguf's reader, its header parsed from a plain array view of the mapped file: gguf slices its np.memmap once
    per value (two slices per vocabulary string), and each memmap slice runs numpy's Python-level finalizer. The
    bundled model's 49,152-token vocabulary parsed in 1.87 s that way, 0.67 s this way; the tensors' data are the
    same pages either way."""

    _plain: np.ndarray | None = None

    def _get(
        self, offset: int, dtype: npt.DTypeLike, count: int = 1, override_order: Literal["I", "S", "<"] | None = None
    ) -> npt.NDArray[Any]:
        if self._plain is None:
            self._plain = self.data.view(np.ndarray)
        count = int(count)
        end = offset + np.dtype(dtype).itemsize * count
        array = self._plain[offset:end].view(dtype=dtype)[:count]
        return array.view(array.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


def quick_gguf_reads() -> None:
    """Once per process: transformers reads a GGUF through names it looks up in the gguf module at each call, and
    two of them are slow for no reason of the file's. get_gguf_hf_weights_map builds gguf's tensor-name map again
    for every module it recurses into (397 times for the bundled model), though the map depends only on the
    architecture and the layer count: built once per pair. GGUFReader: Reader. Neither changes what is read (the
    tests compare both with gguf's and transformers' own). Measured on the 2-core box, the bundled model: its
    first float32 load (config, tokenizer, packed weights) 27.1 s -> 8.2 s; each bfloat16 start 11.7 -> 4.8 s."""
    if gguf.GGUFReader is not Reader:
        gguf.get_tensor_name_map = functools.cache(gguf.get_tensor_name_map)
        gguf.GGUFReader = Reader  # type: ignore[misc]


def _checked(
    model: PreTrainedModel, path: Path, counts: Counter[str], device: torch.device
) -> tuple[PreTrainedModel, Counter[str]]:
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{path.name} holds no tensor for {', '.join(missing[:5])}")
    nn.Module.to(model, device)  # in place; transformers' own .to() is typed for dtypes only
    return model, counts


def _save_cache(model: nn.Module, cached: Path) -> None:
    """The weights as loaded (packed bytes, float32 rest) beside the config: a later start reads them in a second
    instead of repacking the GGUF. Written under another name and renamed, so a cut save leaves no cache."""
    tensors: dict[str, torch.Tensor] = {}
    forms: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear):
            forms[name] = module.form
            tensors[f"{name}.packed"] = module.packed
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias
    tensors |= {name: p.detach() for name, p in model.named_parameters()}
    partial = cached.with_suffix(".partial")
    _write_safetensors(partial, tensors, {"forms": json.dumps(forms), "format": CACHE_FORMAT})
    partial.replace(cached)


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """The safetensors layout written tensor by tensor: safetensors' own save_file builds the whole file in memory
    first, which would double the weights at the end of the load."""
    header: dict[str, object] = {"__metadata__": metadata}
    at = 0
    for name, t in tensors.items():
        header[name] = {
            "dtype": SAFETENSORS_TYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, at + t.nbytes],
        }
        at += t.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads its header to 8 bytes with spaces
    with path.open("wb") as file:
        file.write(len(text).to_bytes(8, "little") + text)
        for t in tensors.values():
            file.write(t.contiguous().view(torch.uint8).numpy().data)


def _from_cache(model: nn.Module, cached: Path) -> Counter[str] | None:
    with safe_open(cached, framework="pt") as file:
        if file.metadata().get("format") != CACHE_FORMAT:
            return None
        forms = json.loads(file.metadata()["forms"])
        tensors = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 - safe_open is no mapping
    for key, value in tensors.items():
        module_name, attr = key.rsplit(".", 1)
        if attr != "packed":  # a packed layer's bias goes on its nn.Linear first, which PackedLinear takes over
            setattr(model.get_submodule(module_name), attr, nn.Parameter(value, requires_grad=False))
    return _replace(model, [(name, form, tensors[f"{name}.packed"]) for name, form in forms.items()], torch.float32)


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def _row_order(processor: TensorProcessor, tensor: ReaderTensor) -> np.ndarray:
    """The file's row of each model row: transformers' own permutation, run on row numbers."""
    numbers = np.arange(tensor.data.shape[0])
    return np.asarray(processor.process(weights=numbers, name=tensor.name).weights)


def _chunks(tensor: ReaderTensor) -> int:
    columns = int(np.prod(tensor.shape[:-1])) if len(tensor.shape) > 1 else 1  # ggml lists the inner dim first
    return max(16, CHUNK_BYTES // (4 * columns) // 16 * 16)


def _row_chunks(tensor: ReaderTensor, rows: np.ndarray) -> Iterator[torch.Tensor]:
    """The tensor's rows in float32 on the CPU, a chunk at a time (a multiple of 16 rows), as gguf's dequantize
    computes them."""
    step = _chunks(tensor)
    for start in range(0, len(rows), step):
        raw = tensor.data[rows[start : start + step]]
        yield torch.from_numpy(np.ascontiguousarray(dequantize(raw, tensor.tensor_type)))


def _dequantized(tensor: ReaderTensor, rows: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The tensor in `dtype` on `device`, dequantized a chunk of rows at a time."""
    out: torch.Tensor | None = None
    start = 0
    for values in _row_chunks(tensor, rows):
        if out is None:
            out = torch.empty((len(rows), *values.shape[1:]), dtype=dtype, device=device)
        out[start : start + len(values)] = values.to(dtype)
        start += len(values)
    assert out is not None
    return out


def _packed(
    tensor: ReaderTensor, rows: np.ndarray, dtype: torch.dtype
) -> tuple[str, torch.Tensor, torch.Tensor | None] | None:
    """(form, packed bytes, the weight in dtype unless that is float32) straight from the tensor's blocks, or None
    where no form takes its type as it is."""
    form = NATIVE.get(tensor.tensor_type)
    if form is None or tensor.data.ndim != 2:
        return None
    out: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    step = _chunks(tensor)  # a multiple of 16 rows: a chunk's panels are the packed tensor's next panels
    for start in range(0, len(rows), step):
        raw = tensor.data[rows[start : start + step]]
        codes, scales, offsets = BLOCKS[tensor.tensor_type](raw)  # per block: row-major, so rows split evenly
        codes, scales = codes.reshape(len(raw), -1), scales.reshape(len(raw), -1)
        widened = codes.float().view(len(raw), scales.shape[1], -1) * scales[..., None]
        if offsets is not None:
            offsets = offsets.reshape(len(raw), -1)
            widened += offsets[..., None]
        values = widened.view(len(raw), -1)
        if not torch.equal(values, torch.from_numpy(dequantize(raw, tensor.tensor_type))):
            return None  # not what transformers computes from these bytes: dequantize instead
        chunk = pack_blocks(form, codes, scales, offsets)
        per_panel = chunk.numel() // -(-len(raw) // 16)
        if out is None:
            out = torch.empty(per_panel * -(-len(rows) // 16), dtype=torch.uint8)
        out[start // 16 * per_panel : start // 16 * per_panel + chunk.numel()] = chunk
        if dtype != torch.float32:
            if weight is None:
                weight = torch.empty(len(rows), values.shape[1], dtype=dtype)
            weight[start : start + len(raw)] = values  # rounded as transformers' load rounds it
    return None if out is None else (form, out, weight)


def _fp16(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).astype(np.float32))


def _q4_1(raw: np.ndarray) -> Blocks:
    b = raw.reshape(-1, 20)  # d, m (float16), 16 bytes: codes 0..15 in the low nibbles, 16..31 in the high
    codes = np.concatenate([b[:, 4:] & 15, b[:, 4:] >> 4], -1)
    return torch.from_numpy(codes), _fp16(b[:, 0:2]), _fp16(b[:, 2:4])


def _q8_0(raw: np.ndarray) -> Blocks:
    b = raw.reshape(-1, 34)  # d (float16), 32 int8 codes
    return torch.from_numpy(np.ascontiguousarray(b[:, 2:]).view(np.int8)), _fp16(b[:, 0:2]), None


def _q4_0(raw: np.ndarray) -> Blocks:
    b = raw.reshape(-1, 18)  # d (float16), 16 bytes of codes 0..15 as Q4_1's; w = d * (q - 8)
    codes = np.concatenate([b[:, 2:] & 15, b[:, 2:] >> 4], -1).astype(np.int8) - np.int8(8)
    return torch.from_numpy(codes), _fp16(b[:, 0:2]), None


def _q4_k(raw: np.ndarray) -> Blocks:
    """256 weights: d, dmin (float16), 12 bytes of eight 6-bit scales and mins, 128 bytes of codes, each 32 bytes
    holding one sub-block in the low nibbles and the next in the high. w = (d * sc) * q - (dmin * m)."""
    b = raw.reshape(-1, 144)
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    scales = _fp16(b[:, 0:2]) * torch.from_numpy(sc.astype(np.float32))
    mins = -(_fp16(b[:, 2:4]) * torch.from_numpy(m.astype(np.float32)))
    return torch.from_numpy(np.ascontiguousarray(qs & 15).reshape(-1, 256)), scales, mins


def _q6_k(raw: np.ndarray) -> Blocks:
    """256 weights: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (float16); 16-weight
    sub-blocks, w = (d * sc) * (q - 32)."""
    b = raw.reshape(-1, 210)
    low = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((low & 15).reshape(-1, 2, 4, 32) | ((high & 3).reshape(-1, 2, 4, 32) << 4)).astype(np.int8) - np.int8(32)
    scales = torch.from_numpy(np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32))
    return torch.from_numpy(q.reshape(-1, 256)), _fp16(b[:, 208:210]) * scales, None


BLOCKS: dict[int, Callable[[np.ndarray], Blocks]] = {
    Q.Q4_1: _q4_1,
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_K: _q4_k,
    Q.Q6_K: _q6_k,
}


def _replace(model: nn.Module, packed: list[tuple[str, str, torch.Tensor]], dtype: torch.dtype) -> Counter[str]:
    """Each named nn.Linear made a PackedLinear (float32) or a SplitLinear (bfloat16: its weight already set)."""
    split = dtype == torch.bfloat16
    kernels = {form: build_packed_linear(form, split)[0] for form in sorted({form for _, form, _ in packed})}
    layer = SplitLinear if split else PackedLinear
    counts: Counter[str] = Counter()
    for name, form, data in packed:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, layer(getattr(parent, child), form, data, kernels[form]))
        counts[form] += 1
    return counts


def _release(reader: GGUFReader, tensor: ReaderTensor) -> None:
    """Drop this tensor's file pages from the process: read once, they would otherwise stay in its RSS."""
    mapped = getattr(reader.data, "_mmap", None)  # numpy's memmap keeps its mmap.mmap here
    if mapped is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = tensor.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, start, tensor.data_offset + tensor.n_bytes - start)
