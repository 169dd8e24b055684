"""What this machine computes fast, read from the CPU's flags, and the `auto` quantization and dtype that follow.

No torch import: `appliance doctor` asks the same questions before anything heavy is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# bitsandbytes' fast 4-bit CPU kernel, and native bf16 dot products for torch's matmuls (oneDNN).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's flags (x86 Linux); empty where /proc/cpuinfo is missing or names none."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    return parse_flags(text.splitlines())


def parse_flags(lines: Iterable[str]) -> frozenset[str]:
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return any(flag in flags for flag in BF16_FLAGS)


def auto_quantization(device_type: str, flags: frozenset[str]) -> str:
    """nf4 on CUDA; none on a CPU, with or without AVX512-BF16.

    Without AVX512-BF16 bitsandbytes' 4-bit kernel is several times slower than plain matmuls (53 against 207 tok/s
    in the engine benchmark). With it, nf4 was the faster choice until the bf16 linear layers were prepacked in
    oneDNN's layout (engine.cpu.prepack): now nf4 only wins at small batches. `python -m bench.engine.steps --variants
    none/bfloat16,nf4/bfloat16 --batches 1,16,64,128`, 2-core AVX512-BF16 EPYC, one thread, ms per decode step:
    none 47.1/78.5/170.7/337.8, nf4 39.2/74.2/217.1/437.4; served, 128 chats at 6/s (`python -m
    bench.served`): none 145.5 output tok/s, nf4 127.8. `flags` stays in the signature: the choice is
    the CPU's to make, and may be again."""
    return "nf4" if device_type == "cuda" else "none"


def auto_cpu_dtype(flags: frozenset[str]) -> str:
    """bfloat16 where the CPU multiplies it natively, else float32 (emulated bf16 is slower than fp32).

    Measured with `python -m bench.engine.steps` on a 2-core AVX512-BF16 EPYC, one thread, 64-token contexts,
    ms per decode step at batch 1/16/64: fp32 56/128/312, bf16 54/77/175; nf4 with fp32 compute 40/89/229,
    with bf16 compute 35/69/198."""
    return "bfloat16" if has_native_bf16(flags) else "float32"


def describe(flags: frozenset[str]) -> str:
    """The flags behind the auto choices, for logs and the doctor."""
    wanted = [flag for flag in ("avx2", "avx512f", *BF16_FLAGS) if flag in flags]
    return ", ".join(wanted) if wanted else "none of avx2, avx512f, avx512_bf16, amx_bf16"
