"""Linear layers whose float32 weights are kept in the narrowest form that holds every value exactly.

A model converted from a GGUF file (the bundled one among them) has weights that are 4- or 8-bit codes times
per-block scales; a model published in bfloat16 has weights whose lower 16 bits are zero. Loaded in float32 they
take 2 to 6 times the bytes they carry, and a CPU decode step at a small batch spends its time streaming them from
memory. Each layer's weight is packed here in the first form that reproduces all of its float32 values bit for
bit (q4: d * q + m per 32 weights, as GGUF's Q4_1; q8: d * q, as Q8_0; bf16), checked at load, and multiplied by
engine/cpu/csrc/packed_linear.c, which widens it in registers: the same float32 multiply-adds, fewer bytes.
A layer no form holds exactly stays as it was.

Measured on a 2-core AVX2 EPYC, one thread, the bundled model's 211 layers (96 MB packed against 538 MB), ms per
step of all the linear layers at 1/8/32/128/512 rows: torch's float32 linear 54.5/91.4/227.3/600.2/2,223 ms,
packed 31.5/42.9/165.2/509.4/2,067 ms (`python -m bench.engine.steps` measures whole steps).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from engine.cpu.kernel_build import KernelBuildError, build_packed_linear

__all__ = ["FORMS", "PackedLinear", "pack_blocks", "pack_exactly", "pack_linears", "run_packed"]

log = logging.getLogger("engine.cpu.packed_linear")

PANEL = 16  # output features per panel (the kernel's register tile is 16 wide)
BLOCK = 32  # weights sharing one scale (and offset), along the input features
# Scales per BLOCK inputs, their element type, and whether an offset follows (engine/cpu/csrc/packed_linear.c).
FORMS = {"q4": (1, torch.float16, True), "q8": (1, torch.float16, False), "q4f": (1, torch.float32, True)}
FORMS["q8f"] = (2, torch.float32, False)


class PackedLinear(nn.Module):
    """y = x W^T + b in float32 with W packed (pack_exactly); stands in for the nn.Linear it was made from."""

    def __init__(self, linear: nn.Linear, form: str, packed: torch.Tensor, kernel: Callable[..., int]) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.form = form
        self.packed = nn.Buffer(packed, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.bias = None if bias is None else nn.Buffer(bias, persistent=False)
        self._kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32, device=rows.device)
        run_packed(self._kernel, rows, self.packed, self.bias, y)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, form={self.form}"


def run_packed(
    kernel: Callable[..., int], rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor
) -> None:
    """y [m, out] = rows [m, in] (unit stride along a row) times the packed weight (+ bias, float32), by a kernel of
    engine/cpu/csrc/packed_linear.c, on torch's thread count."""
    failed = kernel(
        rows.data_ptr(),
        rows.stride(0),
        packed.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
        y.stride(0),
        rows.shape[0],
        y.shape[1],
        rows.shape[1],
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("the packed linear layer could not allocate its scratch")


def pack_exactly(weight: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """(form, packed bytes) of the first form that holds every value of a float32 [out, in] weight exactly, or
    None. The input width must be a multiple of 32; outputs are padded with zero rows to a multiple of 16."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % BLOCK:
        return None
    w = weight.detach().cpu()
    for form, pack in (("q4", _pack_q4), ("q8", _pack_q8), ("bf16", _pack_bf16)):
        packed = pack(w)
        if packed is not None:
            return form, packed
    return None


def pack_linears(model: nn.Module) -> Counter[str]:
    """Replace every float32 nn.Linear on a CPU under `model` whose weight some form holds exactly by a
    PackedLinear. Returns how many layers took each form ('plain' for those left as they were). Where the
    kernel does not build (no C compiler), nothing is replaced and the log says why."""
    found: list[tuple[nn.Module, str, nn.Linear, tuple[str, torch.Tensor] | None]] = []
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                found.append((parent, name, child, pack_exactly(child.weight)))
    kernels: dict[str, Callable[..., int]] = {}
    try:
        for form in sorted({packed[0] for *_, packed in found if packed is not None}):
            kernels[form], seconds = build_packed_linear(form)
            log.debug("packed linear kernel (%s) ready in %.1f s", form, seconds)
    except KernelBuildError as exc:
        log.info("linear layers: torch's, as the packed kernel is unavailable: %s", exc)
        return Counter({"plain": len(found)})
    counts: Counter[str] = Counter()
    for parent, name, child, packed in found:
        if packed is None:
            counts["plain"] += 1
            continue
        form, data = packed
        setattr(parent, name, PackedLinear(child, form, data, kernels[form]))
        counts[form] += 1
    return counts


def _rows_padded(w: torch.Tensor) -> torch.Tensor:
    extra = -w.shape[0] % PANEL
    return torch.cat([w, w.new_zeros(extra, w.shape[1])]) if extra else w


def pack_blocks(
    form: str, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None = None
) -> torch.Tensor:
    """A weight given as its blocks, packed in `form` (FORMS): w = scale * code (+ offset) per block along the
    inputs. codes [out, in]: uint8 0..15 (q4, q4f) or int8; scales [out, in / 32 * per block]; offsets like scales
    (q4, q4f). Values must be exact in the form's scale type; outputs are padded with zero rows to a multiple of 16."""
    per_block, scale_type, with_offset = FORMS[form]
    blocks = codes.shape[1] // BLOCK
    panels = (codes.shape[0] + PANEL - 1) // PANEL
    parts = [_scale_bytes(scales, scale_type, per_block)]
    if with_offset:
        assert offsets is not None
        parts.append(_scale_bytes(offsets, scale_type, per_block))
    q = _rows_padded(codes).view(panels, PANEL, blocks, BLOCK).permute(0, 2, 3, 1)  # [panels, blocks, k, 16]
    if codes.dtype == torch.int8:
        parts.append(q.contiguous().view(torch.uint8).view(panels, blocks, BLOCK * PANEL))
    else:
        parts.append((q[..., :8] | (q[..., 8:] << 4)).contiguous().view(panels, blocks, BLOCK * PANEL // 2))
    return torch.cat(parts, -1).contiguous().view(-1)


def _scale_bytes(values: torch.Tensor, scale_type: torch.dtype, per_block: int) -> torch.Tensor:
    """[outputs, blocks * per_block] -> [panels, blocks, per_block * 16 scales as bytes], panel-major."""
    padded = _rows_padded(values.to(scale_type))
    blocks = padded.shape[1] // per_block
    by_panel = padded.view(-1, PANEL, blocks, per_block).permute(0, 2, 3, 1).contiguous()
    return by_panel.view(torch.uint8).view(by_panel.shape[0], blocks, -1)


def _pack_q4(w: torch.Tensor) -> torch.Tensor | None:
    """w = d * q + m with q in 0..15 and d, m float16 per 32 inputs (GGUF's Q4_1: d * q is exact, so the sum is
    rounded once, as the kernel's fused multiply-add rounds it). The smallest weight of a block is m (its code
    is 0); d is (largest - m) / 15 rounded to float16, or a neighbour of it where the largest was rounded."""
    blocks = w.shape[1] // BLOCK
    wb = _rows_padded(w).view(-1, blocks, BLOCK)
    low, high = wb.amin(-1), wb.amax(-1)
    if not torch.equal(low.half().float(), low):
        return None
    guess = ((high - low) / 15).half()
    codes = torch.zeros(wb.shape, dtype=torch.uint8)
    scale = torch.zeros_like(low)
    found = torch.zeros(low.shape, dtype=torch.bool)
    for step in (0, 1, -1, 2, -2):
        d = (guess.view(torch.int16) + step).view(torch.float16).float()
        usable = torch.isfinite(d) & (d >= 0) & ~found
        q = torch.round((wb - low[..., None]) / torch.where(d > 0, d, 1.0)[..., None]).clamp_(0, 15)
        q = torch.where((d > 0)[..., None], q, 0.0)
        exact = usable & (d[..., None] * q + low[..., None] == wb).all(-1)
        codes[exact] = q[exact].to(torch.uint8)
        scale[exact] = d[exact]
        found |= exact
        if bool(found.all()):
            break
    else:
        return None
    return pack_blocks("q4", codes.view(-1, blocks * BLOCK), scale, low)


def _pack_q8(w: torch.Tensor) -> torch.Tensor | None:
    """w = d * q with q in -127..127 and d float16 per 32 inputs (GGUF's Q8_0; exact products). The largest
    magnitude of a block has code +-127, so d is it / 127."""
    blocks = w.shape[1] // BLOCK
    wb = _rows_padded(w).view(-1, blocks, BLOCK)
    d = wb.abs().amax(-1) / 127
    if not torch.equal(d.half().float(), d):
        return None
    q = torch.round(wb / torch.where(d > 0, d, 1.0)[..., None])
    if float(q.abs().max()) > 127 or not torch.equal(d[..., None] * q, wb):
        return None
    return pack_blocks("q8", q.to(torch.int8).view(-1, blocks * BLOCK), d)


def _pack_bf16(w: torch.Tensor) -> torch.Tensor | None:
    """w whose every value is a bfloat16 (a model published in bf16, loaded in float32)."""
    narrow = w.bfloat16()
    if not torch.equal(narrow.float(), w):
        return None
    panels = _rows_padded(narrow).view(-1, PANEL, w.shape[1]).permute(0, 2, 1).contiguous()
    return panels.view(torch.uint8).view(-1)
