"""Linear layers of a model served in bfloat16 whose weights came as a GGUF's blocks: compact at small batches,
oneDNN's prepacked layout above.

In bfloat16 a decode step at a small batch streams every weight from memory (the bundled model: 270 MB of bf16 per
token), while the file's blocks hold the same values in a third of the bytes. Each layer keeps both: the blocks,
multiplied by engine/cpu/csrc/packed_linear.c built with -DROUND_BF16 (each weight rounded to the very bf16 value
the plain layer would hold, the activations bf16, the products exact in float32, the sum rounded to bf16 once, as
oneDNN's bf16 layers do: only the order of the float32 sums differs), and oneDNN's layout (engine.cpu.prepack), whose
AMX or AVX512-BF16 kernels win once a step has rows enough. Where one overtakes the other depends on the CPU, so it
is measured at load (`crossover`) on the model's own layer shapes, and the CPU plan says what it found.

Measured at load on a 2-core Intel Xeon with AMX, one thread, the bundled model's 211 layers, ms at
1/2/4/8/16/32/64 rows: the blocks on AMX tiles 26.5/26.5/26.9/27.2/28.8/33.2/47.6, oneDNN's layout
38.6/37.3/38.4/38.6/38.8/43.2/50.9 (the blocks with vdpbf16ps alone, no tiles: 28.4/31.5/35.8/48.7/70.5/114.9 at
1 to 32 rows; rounded float32 weights and float32 multiply-adds: 34.3/35.0/37.6/43.3/64.9/103.4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from engine.cpu.packed_linear import run_packed
from engine.cpu.prepack import PrepackedLinear

__all__ = ["Crossover", "SplitLinear", "crossover", "split_at"]

# Row counts timed at load, in turn until the compact kernel is no longer the faster.
CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64)
REPEATS = 2  # best of, per path and row count


class SplitLinear(nn.Module):
    """y = x W^T + b in bfloat16, W both as compact blocks and in oneDNN's layout; stands in for the nn.Linear (bf16
    weight) it was made from. Rows up to `compact_rows` take the blocks (split_at sets it; 0: never)."""

    def __init__(self, linear: nn.Linear, form: str, packed: torch.Tensor, kernel: Callable[..., int]) -> None:
        """kernel: packed_linear_bf16 built for `form` (engine.cpu.kernel_build.build_packed_linear)."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.form = form
        laid_out = PrepackedLinear(linear)  # its weight and bias, called here without a module call between
        self.laid_out = nn.Buffer(laid_out.packed, persistent=False)
        self.bias = None if laid_out.bias is None else nn.Buffer(laid_out.bias, persistent=False)
        self.blocks: torch.Tensor | None = nn.Buffer(packed, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()  # bf16: exact in float32
        self.bias_f32 = None if bias is None else nn.Buffer(bias, persistent=False)
        self._kernel = kernel
        self.compact_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        small = self.blocks is not None and rows.shape[0] <= self.compact_rows
        y = self.compact(rows) if small else self.prepacked(rows)
        return y.view(*x.shape[:-1], self.out_features)

    def prepacked(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [m, in] in bfloat16 times the weight in oneDNN's layout (engine.cpu.prepack): [m, out]."""
        return torch.ops.mkldnn._linear_pointwise(rows, self.laid_out, self.bias, "none", [], "")

    def compact(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [m, in] in bfloat16 times the blocks: [m, out] in bfloat16."""
        assert self.blocks is not None
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.bfloat16)
        run_packed(self._kernel, rows, self.blocks, self.bias_f32, y)
        return y

    def extra_repr(self) -> str:
        form = "none" if self.blocks is None else f"{self.form} up to {self.compact_rows} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, compact={form}"


@dataclass(frozen=True, slots=True)
class Crossover:
    """rows: the most rows at which the blocks were the faster, and at every count below (0: at none); timings:
    (rows, blocks ms, prepacked ms) of all the model's split layers, per count timed."""

    rows: int
    timings: tuple[tuple[int, float, float], ...]

    def summary(self) -> str:
        shown = ", ".join(f"{r} row{'s' * (r > 1)} {c:.1f} vs {p:.1f} ms" for r, c, p in self.timings)
        return f"blocks against oneDNN's layout, measured at load: {shown}"


def crossover(layers: Sequence[SplitLinear], threads: int | None = None) -> Crossover:
    """Times every layer in turn, as a step runs them (each weight then comes from memory, not from a cache that
    a single layer timed alone would fit in), for each path at each of CALIBRATION_ROWS under `threads` torch
    threads (None: the current count), until the blocks stop being the faster."""
    compact = [layer for layer in layers if layer.blocks is not None]
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    timings: list[tuple[int, float, float]] = []
    rows = 0
    try:
        with torch.inference_mode():
            for count in CALIBRATION_ROWS:
                g = torch.Generator().manual_seed(count)
                inputs = {n: torch.randn(count, n, generator=g).bfloat16() for n in {m.in_features for m in compact}}
                blocks = _best([(m.compact, inputs[m.in_features]) for m in compact])
                laid_out = _best([(m.prepacked, inputs[m.in_features]) for m in compact])
                timings.append((count, blocks * 1e3, laid_out * 1e3))
                if blocks >= laid_out:
                    break
                rows = count
    finally:
        torch.set_num_threads(saved)
    return Crossover(rows, tuple(timings))


def split_at(layers: Sequence[SplitLinear], rows: int) -> None:
    """Rows up to `rows` take the blocks in every layer; at 0 the blocks are dropped (their memory freed)."""
    for layer in layers:
        layer.compact_rows = rows
        if rows == 0:
            layer.blocks = None


def _best(calls: list[tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]]) -> float:
    """The best of REPEATS passes over all the calls, after one that warms them (scratch, caches)."""
    best = float("inf")
    for repeat in range(REPEATS + 1):
        start = time.perf_counter()
        for layer, x in calls:
            layer(x)
        if repeat:
            best = min(best, time.perf_counter() - start)
    return best
