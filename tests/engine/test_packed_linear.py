"""Linear layers with exactly packed weights (engine/cpu/packed_linear.py): every form widens back to the very float32
weights, products match torch's at every row count, and the engine gives the same greedy tokens with them as with
float32 weights and as transformers' generate."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from engine.cpu.kernel_build import KernelBuildError, build_packed_linear
from engine.cpu.packed_linear import PackedLinear, pack_blocks, pack_exactly, pack_linears
from tests.engine.test_equivalence import reference, run

try:
    build_packed_linear("q4")
except KernelBuildError as exc:  # pragma: no cover - CI installs gcc (make sysdeps-test)
    pytest.skip(f"the packed linear kernel does not build here: {exc}", allow_module_level=True)


def q4_values(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """Weights as a GGUF Q4_1 file holds them: d * q + m per 32 inputs, d and m float16, the block's smallest
    weight coded 0 and its largest 15 (as GGUF's quantizer codes them)."""
    g = torch.Generator().manual_seed(seed)
    shape = (out, inp // 32, 32)
    d = (torch.rand(shape[:2], generator=g) * 0.01).half().float()[..., None]
    m = (-torch.rand(shape[:2], generator=g) * 0.08).half().float()[..., None]
    q = torch.randint(0, 16, shape, generator=g).float()
    q[..., 3], q[..., 17] = 0.0, 15.0
    return (d * q + m).view(out, inp)


def q8_values(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """As GGUF's Q8_0: d * q, d float16 per 32 inputs, the largest magnitude coded +-127."""
    g = torch.Generator().manual_seed(seed)
    shape = (out, inp // 32, 32)
    d = (torch.rand(shape[:2], generator=g) * 0.001).half().float()[..., None]
    q = torch.randint(-127, 128, shape, generator=g).float()
    q[..., 5] = -127.0
    return (d * q).view(out, inp)


def bf16_values(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out, inp, generator=g) * 0.05).bfloat16().float()


FORMS: dict[str, Callable[[int, int, int], torch.Tensor]] = {"q4": q4_values, "q8": q8_values, "bf16": bf16_values}


def packed_layer(weight: torch.Tensor, bias: bool = False) -> PackedLinear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias:
            linear.bias.normal_()
    found = pack_exactly(linear.weight)
    assert found is not None
    form, packed = found
    return PackedLinear(linear, form, packed, build_packed_linear(form)[0])


@pytest.mark.parametrize("form", FORMS)
def test_each_form_widens_back_to_the_very_weights(form: str) -> None:
    # 50 outputs (a panel of 16 only partly filled), 576 inputs (three chunks of the kernel's K loop, one short):
    # multiplied by the identity, each output is one weight times 1 plus exact zeros, so any widening error shows.
    weight = FORMS[form](50, 576, 1)
    found = pack_exactly(weight)
    assert found is not None and found[0] == form
    with torch.inference_mode():
        assert torch.equal(packed_layer(weight)(torch.eye(576)), weight.T)


def test_the_narrowest_exact_form_is_chosen_and_other_weights_stay_plain() -> None:
    assert pack_exactly(q4_values(32, 64))[0] == "q4"  # type: ignore[index]
    assert pack_exactly(q8_values(32, 64))[0] == "q8"  # type: ignore[index]  # not q4: 255 codes per block
    assert pack_exactly(bf16_values(32, 64))[0] == "bf16"  # type: ignore[index]
    assert pack_exactly(torch.randn(32, 64)) is None  # float32 values no narrower form holds
    assert pack_exactly(q4_values(32, 64)[:, :40].contiguous()) is None  # inputs not a multiple of 32
    assert pack_exactly(bf16_values(32, 64).bfloat16()) is None  # only float32 weights are packed
    nearly = q4_values(32, 64)
    nearly[7, 9] += 1e-6  # one weight off the grid: the layer is not q4 (nor q8 or bf16)
    assert pack_exactly(nearly) is None


@pytest.mark.parametrize("form", FORMS)
def test_products_match_torch_at_every_row_count(form: str) -> None:
    weight = FORMS[form](40, 320, 2)
    layer = packed_layer(weight, bias=True)
    linear = nn.Linear(320, 40)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(layer.bias)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for rows in [*range(1, 14), 64, 301]:
            x = torch.randn(rows, 320, generator=g)
            torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)
        batched = torch.randn(2, 7, 320, generator=g)
        torch.testing.assert_close(layer(batched), linear(batched), rtol=1e-5, atol=1e-5)
        strided = torch.randn(320, 9, generator=g).T  # rows not contiguous
        torch.testing.assert_close(layer(strided), linear(strided), rtol=1e-5, atol=1e-5)
        assert layer(torch.randn(0, 320)).shape == (0, 40)


def test_threads_split_the_panels_without_changing_a_bit() -> None:
    layer = packed_layer(q4_values(200, 256, 4))
    x = torch.randn(37, 256, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            one = layer(x)
        torch.set_num_threads(3)
        with torch.inference_mode():
            assert torch.equal(layer(x), one)
    finally:
        torch.set_num_threads(threads)


def test_only_plain_float32_linears_are_replaced() -> None:
    class Quantized(nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 32), nn.Linear(32, 48), Quantized(48, 32))
    with torch.no_grad():
        model[0].weight.copy_(q4_values(32, 64))
        model[2].weight.copy_(bf16_values(48, 32))
    counts = pack_linears(model)
    assert counts == {"q4": 1, "bf16": 1, "plain": 1}
    assert [type(m).__name__ for m in model] == ["PackedLinear", "Linear", "PackedLinear", "Quantized"]


def test_without_a_compiler_the_layers_stay_plain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16))
    with torch.no_grad():
        model[0].weight.copy_(q4_values(32, 64))
        model[1].weight.copy_(q4_values(16, 32))
    with caplog.at_level(logging.INFO, logger="engine.cpu.packed_linear"):
        assert pack_linears(model) == {"plain": 2}
    assert [type(m).__name__ for m in model] == ["Linear", "Linear"]
    assert "torch's, as the packed kernel is unavailable" in caplog.text and "cc failed" in caplog.text


def _on_the_q4_grid(model: nn.Module) -> None:
    """Round every linear weight of a random model to the Q4_1 values a GGUF of it would hold."""
    with torch.no_grad():
        for module in model.modules():
            if type(module) is nn.Linear and module.in_features % 32 == 0:
                w = module.weight.view(module.out_features, -1, 32)
                low, high = w.amin(-1, keepdim=True).half().float(), w.amax(-1, keepdim=True)
                d = ((high - low) / 15).half().float()
                q = torch.round((w - low) / torch.where(d > 0, d, 1.0)).clamp(0, 15)
                module.weight.copy_((d * q + low).view_as(module.weight))


def test_the_engine_gives_float32_weights_greedy_tokens_with_packed_ones() -> None:
    config = EngineConfig(
        model="random:tiny", quantization="none", dtype="float32", device="cpu", compact_weights=False, num_kv_blocks=64
    )
    core = EngineCore(config)
    _on_the_q4_grid(core.loaded.model)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (3, 17, 40, 90)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    requests = [(f"r{i}", p, params) for i, p in enumerate(prompts)]
    expected = {rid: reference(core, prompt, 20, ignore_eos=True) for rid, prompt, _ in requests}
    assert run(core, iter([requests])) == expected  # float32 weights

    counts = pack_linears(core.loaded.model)
    assert counts["q4"] > 0 and set(counts) <= {"q4", "plain"}
    requests = [(f"p{i}", p, params) for i, p in enumerate(prompts)]
    got = run(core, iter([requests[:2], requests[2:]]))
    assert got == {"p" + rid[1:]: tokens for rid, tokens in expected.items()}


@pytest.mark.parametrize("form", ["q4f", "q8f"])
def test_float32_scale_forms_multiply_their_blocks_as_torch_does(form: str) -> None:
    """q4f (GGUF's Q4_K: d * sc and dmin * m exact in float32, not float16) and q8f (Q6_K: a scale per 16
    weights) from their blocks, as engine/model/gguf_load.py packs them: torch's products on the widened weights
    (summed in another order), 50 outputs (a partial panel) by 576 inputs."""
    g = torch.Generator().manual_seed(3)
    out, inp = 50, 576
    if form == "q4f":
        codes = torch.randint(0, 16, (out, inp), generator=g, dtype=torch.uint8)
        scales = (torch.rand(out, inp // 32, generator=g) * 0.01).half().float() * 53
        offsets = -(torch.rand(out, inp // 32, generator=g) * 0.01).half().float() * 37
        weight = (codes.float().view(out, -1, 32) * scales[..., None] + offsets[..., None]).view(out, inp)
    else:
        codes = torch.randint(-32, 32, (out, inp), generator=g, dtype=torch.int8)
        scales = (torch.rand(out, inp // 16, generator=g) * 0.001).half().float() * -101
        offsets = None
        weight = (codes.float().view(out, -1, 16) * scales[..., None]).view(out, inp)
    linear = nn.Linear(inp, out, bias=True)
    layer = PackedLinear(linear, form, pack_blocks(form, codes, scales, offsets), build_packed_linear(form)[0])
    x = torch.randn(7, inp, generator=g)
    torch.testing.assert_close(layer(x), x @ weight.T + linear.bias, rtol=1e-4, atol=1e-4)
