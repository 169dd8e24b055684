"""Linear layers whose weights oneDNN lays out once, at load, for this CPU's bf16 kernels.

torch's plain `F.linear` on a CPU hands oneDNN a weight in PyTorch's layout at every call; a weight reordered
once into oneDNN's own blocked layout (what torch.compile's inductor does on CPUs, and vLLM's CPU build) is read
faster. Measured on a 2-core AVX512-BF16 EPYC, one thread, the bundled model in bfloat16, ms per decode step at
batch 1/8/32/64: 50.5/64.1/112.6/186.1 plain, 41.6/47.9/102.8/160.7 prepacked (the 49,152-wide output layer alone:
9.0 -> 4.3 ms at 8 rows). The results are the same kernels' and are checked equal at load.

Only plain bf16 `nn.Linear` layers are replaced (bitsandbytes' quantized layers subclass it and stay as they
are); where torch has no oneDNN bf16 path the model is left untouched.
"""

from __future__ import annotations

import torch
from torch import nn

# The weight's layout is chosen for this many rows; any other count is still exact, and 8 measured best across
# the batch sizes above.
ROWS_HINT = 8


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W in oneDNN's layout; stands in for the nn.Linear it was made from."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.packed = nn.Buffer(torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT), persistent=False)
        self.bias = None if linear.bias is None else nn.Buffer(linear.bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_bf16() -> bool:
    """oneDNN's bf16 linear on this CPU (it needs AVX512-BF16 or AMX to be fast, and torch built with it); the CPU
    plan (engine.cpu.plan) decides from it whether bf16 layers are prepacked."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepack_linears(model: nn.Module) -> int:
    """Replace every plain bf16 nn.Linear under `model` by a PrepackedLinear that gives the same result on a
    probe input (else the layer stays as it was). Returns how many were replaced. A tied output layer gets its
    own packed copy; the embedding keeps the original."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child.weight.dtype != torch.bfloat16:
                continue
            packed = PrepackedLinear(child)
            if not _same(child, packed):
                continue
            setattr(parent, name, packed)
            replaced += 1
    return replaced


def _same(linear: nn.Linear, packed: PrepackedLinear) -> bool:
    probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.inference_mode():
        return bool(torch.equal(linear(probe), packed(probe)))
