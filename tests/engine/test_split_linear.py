"""bfloat16 linear layers that keep a GGUF's blocks beside oneDNN's layout (engine/cpu/split_linear.py): the bf16
kernel multiplies the very bf16 weights a plain layer holds (each output the exact sum rounded once, but for the
order of its float32 sums), rows up to the measured crossover take the blocks and larger ones oneDNN's layout. (A
GGUF served this way against transformers' bf16 load: tests/engine/test_gguf_load.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.cpu.kernel_build import KernelBuildError, build_packed_linear
from engine.cpu.packed_linear import pack_blocks
from engine.cpu.prepack import onednn_bf16
from engine.cpu.split_linear import CALIBRATION_ROWS, SplitLinear, crossover, split_at

try:
    build_packed_linear("q4", round_bf16=True)
except KernelBuildError as exc:  # pragma: no cover - CI installs gcc (make sysdeps-test)
    pytest.skip(f"the packed linear kernel does not build here: {exc}", allow_module_level=True)

FORMS = ("q4", "q8", "q4f", "q8f")
needs_onednn = pytest.mark.skipif(not onednn_bf16(), reason="this CPU's torch has no oneDNN bf16 linear")


def blocks(form: str, out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weight, packed bytes) of random blocks in `form`, as engine/model/gguf_load.py packs a GGUF's."""
    g = torch.Generator().manual_seed(seed)
    per = 16 if form == "q8f" else 32
    if form in ("q4", "q4f"):
        codes = torch.randint(0, 16, (out, inp), generator=g, dtype=torch.uint8)
    else:
        codes = torch.randint(-127 if form == "q8" else -32, 128 if form == "q8" else 32, (out, inp), generator=g,
                              dtype=torch.int8)  # fmt: skip
    scales = (torch.rand(out, inp // per, generator=g) * 0.01).half().float()
    offsets = -(torch.rand(out, inp // per, generator=g) * 0.08).half().float() if form in ("q4", "q4f") else None
    if form in ("q4f", "q8f"):  # GGUF's k-quants: float32 products of float16 scales, not float16 themselves
        scales = scales * 53
        offsets = None if offsets is None else offsets * 37
    weight = codes.float().view(out, -1, per) * scales[..., None]
    if offsets is not None:
        weight += offsets[..., None]
    return weight.view(out, inp), pack_blocks(form, codes, scales, offsets)


def multiply(
    form: str, packed: torch.Tensor, x: torch.Tensor, out: int, bias: torch.Tensor | None, threads: int = 1
) -> torch.Tensor:
    kernel = build_packed_linear(form, round_bf16=True)[0]
    y = torch.full((x.shape[0], out), float("nan"), dtype=torch.bfloat16)
    failed = kernel(x.data_ptr(), x.stride(0), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                    y.data_ptr(), y.stride(0), x.shape[0], out, x.shape[1], threads)  # fmt: skip
    assert failed == 0
    return y


def rounded_once(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """y is a float32 sum of x's rows times weight's, in any order, rounded to bf16 once: within a bf16 step of the
    exact sum, plus what k float32 additions may lose where the terms cancel (|error| <= k 2^-24 sum |terms|)."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.double().abs().T + (0 if bias is None else bias.double().abs())
    bound = exact.abs() * 2**-7 + magnitude * x.shape[1] * 2**-23
    return bool(((y.double() - exact).abs() <= bound).all())


@pytest.mark.parametrize("form", FORMS)
def test_the_bf16_kernel_multiplies_the_weights_rounded_to_bf16_and_rounds_each_sum_once(form: str) -> None:
    # 50 outputs (a partial panel), 576 inputs (three chunks of the kernel's K loop, one short).
    weight, packed = blocks(form, 50, 576, seed=1)
    held = weight.bfloat16()  # what a plain bf16 layer holds: torch's cast of the same float32 values
    # Times the identity, each output is one weight times 1 plus exact zeros: the widened weights are torch's cast.
    assert torch.equal(multiply(form, packed, torch.eye(576).bfloat16(), 50, None), held.T)
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(50, generator=g).bfloat16().float()
    for rows in [*range(1, 18), 64, 97, 200]:  # AMX takes 16 rows a tile, 96 a pass
        x = (torch.randn(rows, 576, generator=g) * 3).bfloat16()
        y = multiply(form, packed, x, 50, bias)
        assert torch.equal(multiply(form, packed, x, 50, bias, threads=2), y)  # the threads split the panels
        assert rounded_once(y, x, held, bias), rows
        exact = (x.double() @ held.double().T + bias.double()).bfloat16()  # the exact sum, rounded once
        assert float((y == exact).float().mean()) > 0.98, rows  # the order of the sums moves a few
        torch_own = nn.functional.linear(x, held, bias.bfloat16())  # oneDNN's or torch's own bf16 kernel
        assert float((y == torch_own).float().mean()) > 0.98, rows


@needs_onednn
def test_rows_up_to_the_crossover_take_the_blocks_and_more_take_onednns_layout() -> None:
    weight, packed = blocks("q4", 50, 576)
    linear = nn.Linear(576, 50, bias=True).bfloat16()
    with torch.no_grad():
        linear.weight.copy_(weight.bfloat16())
    layer = SplitLinear(linear, "q4", packed, build_packed_linear("q4", round_bf16=True)[0])
    assert layer.compact_rows == 0 and layer.blocks is not None
    split_at([layer], 4)
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for shape in [(1, 576), (4, 576), (2, 2, 576), (5, 576), (9, 576)]:
            x = torch.randn(*shape, generator=g).bfloat16()
            rows = x.reshape(-1, 576)
            blocks_took = rows.shape[0] <= 4
            expected = layer.compact(rows) if blocks_took else layer.prepacked(rows)
            assert torch.equal(layer(x), expected.view(*shape[:-1], 50)), shape
            assert rounded_once(layer.compact(rows), rows, weight.bfloat16(), linear.bias.detach())
        split_at([layer], 0)
        assert layer.blocks is None  # never the faster: the blocks' memory goes back
        x = torch.randn(1, 576, generator=g).bfloat16()
        assert torch.equal(layer(x), layer.prepacked(x))


@needs_onednn
def test_the_crossover_is_timed_until_the_blocks_stop_being_the_faster() -> None:
    kernel = build_packed_linear("q4", round_bf16=True)[0]
    layers = []
    for seed, (out, inp) in enumerate([(256, 512), (512, 256), (2048, 512)]):
        weight, packed = blocks("q4", out, inp, seed)
        linear = nn.Linear(inp, out, bias=False).bfloat16()
        with torch.no_grad():
            linear.weight.copy_(weight.bfloat16())
        layers.append(SplitLinear(linear, "q4", packed, kernel))
    threads = torch.get_num_threads()
    found = crossover(layers, threads=1)
    assert torch.get_num_threads() == threads  # put back
    counts = [rows for rows, _, _ in found.timings]
    assert counts == list(CALIBRATION_ROWS[: len(counts)])
    assert all(blocks < laid_out for rows, blocks, laid_out in found.timings if rows <= found.rows)
    assert found.rows in (0, *counts)
    if len(counts) < len(CALIBRATION_ROWS):  # stopped where the blocks were no longer the faster
        assert found.timings[-1][1] >= found.timings[-1][2]
    assert found.summary().startswith("blocks against oneDNN's layout, measured at load: 1 row ")
