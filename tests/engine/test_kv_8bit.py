"""The 8-bit KV pool (engine.model.kv_cache): rows quantized within half a step, written alike by torch and by the
own forward's C write, read alike by every attention path (torch's prefill gather, the grouped decode path, the
compiled kernel), and twice the tokens of a 16-bit pool in the same bytes, its scales counted."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.cpu.decode_kernel import attention_kernel
from engine.cpu.kernel_build import KernelBuildError, build_layer_ops
from engine.cpu.plan import Attention, cpu_plan, this_machine
from engine.errors import ConfigError
from engine.model.attention import DecodeGroup, _decode_attention
from engine.model.kv_cache import (
    QMAX,
    allocate_kv_cache,
    bytes_per_block,
    dequantize,
    gather_blocks,
    gather_slots,
    quantize,
    rotate,
    rotate_queries,
    store,
)
from tests.engine.test_decode_kernel import compiled, decode_rows, paged_case, reference

EIGHT_BITS = [torch.int8, torch.float8_e4m3fn]
CPU = torch.device("cpu")


def rows(seed: int = 0) -> torch.Tensor:
    """[kv_heads, tokens, head_dim] keys with heads of very different sizes, an outlier and an all-zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 40, 64, generator=g) * torch.tensor([0.05, 1.0, 30.0]).view(3, 1, 1)
    x[1, 5, 7] = 400.0
    x[2, 9] = 0.0
    return x


@pytest.mark.parametrize("dtype", EIGHT_BITS, ids=["int8", "fp8"])
def test_a_row_comes_back_within_its_own_step(dtype: torch.dtype) -> None:
    x = rows()
    codes, scale = quantize(x, dtype)
    assert codes.dtype == dtype and scale.dtype == torch.bfloat16 and scale.shape == x.shape[:2]
    back = dequantize(codes, scale, torch.float32)
    step = scale.float().unsqueeze(-1)
    if dtype is torch.int8:
        assert (back - x).abs().le(step * 0.5 + 1e-12).all(), "int8: within half a step of the row's own scale"
    else:
        # e4m3 keeps 3 mantissa bits: within 1/16 relative, or half of its smallest subnormal step near zero.
        assert (back - x).abs().le(x.abs() / 16 + step * 2.0**-10).all()
    assert back[2, 9].eq(0).all(), "an all-zero row stays zero"
    assert back.abs().amax(-1).le(x.abs().amax(-1) * 1.01).all()
    assert x.abs().amax(-1).div(scale.float()).le(QMAX[dtype] * 1.004).all(), "the row's range is used whole"


@pytest.mark.parametrize("dtype", EIGHT_BITS, ids=["int8", "fp8"])
def test_writes_land_in_their_slots_and_every_gather_reads_them_back(dtype: torch.dtype) -> None:
    kv = allocate_kv_cache(6, 4, 1, 3, 64, dtype, CPU)
    assert kv.quantized and kv.key_scale[0].shape == (3, 24)
    x = rows()[:, :10]
    slots = torch.tensor([4, 5, 6, 7, 20, 21, 0, 1, 2, 3])  # blocks 1, 5 (half), 0
    store(kv.key[0], kv.key_scale[0], slots, x)
    codes, scale = quantize(x, dtype)
    expected = dequantize(codes, scale, torch.float32)
    assert torch.equal(gather_slots(kv.key[0], kv.key_scale[0], slots, torch.float32), expected)
    blocks = gather_blocks(kv.key[0], kv.key_scale[0], torch.tensor([1, 5, 0]), 4, torch.float32)
    assert torch.equal(blocks[:, :6], expected[:, :6]) and torch.equal(blocks[:, 8:], expected[:, 6:])
    assert blocks[:, 6:8].eq(0).all(), "a partly full block's unwritten slots read as zero"


def test_the_own_forwards_c_write_gives_torchs_bytes() -> None:
    ops = build_layer_ops()
    g = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads, dim, num_slots = 6, 6, 2, 64, 32
    q, k, v = (torch.randn(tokens, n * dim, generator=g) * 3 for n in (heads, kv_heads, kv_heads))
    angles = torch.rand(tokens, dim // 2, generator=g) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    where = torch.tensor([3, 9, 0, 31, 17, 16])
    plain = [torch.zeros(kv_heads, num_slots, dim) for _ in range(2)]
    q8, k8 = q.clone(), k.clone()
    ops.rope_and_store(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                       cos.data_ptr(), sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim,
                       plain[0].data_ptr(), plain[1].data_ptr(), num_slots)  # fmt: skip
    kv = allocate_kv_cache(8, 4, 1, kv_heads, dim, torch.int8, CPU)
    failed = ops.rope_and_store_int8(
        q8.data_ptr(), q8.stride(0), k8.data_ptr(), k8.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
        sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim, kv.key[0].data_ptr(), kv.value[0].data_ptr(),
        kv.key_scale[0].data_ptr(), kv.value_scale[0].data_ptr(), num_slots,
    )  # fmt: skip
    assert failed == 0 and torch.equal(q8, q) and torch.equal(k8, k), "rotated as the float32 write rotates"
    pairs = ((kv.key[0], kv.key_scale[0], rotate(plain[0])), (kv.value[0], kv.value_scale[0], plain[1]))
    for cache, scale, written in pairs:  # keys rotated, values as they are
        codes, scales = quantize(written[:, where], torch.int8)
        assert torch.equal(cache[:, where], codes) and torch.equal(scale[:, where], scales)


def test_rotated_int8_keys_score_rotated_queries_as_the_plain_ones_and_lose_less() -> None:
    dtype = torch.int8
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(2, 50, 64, generator=g)
    keys[..., 3] *= 12  # one channel carrying most of the magnitude, as real keys have
    q = torch.randn(2, 5, 64, generator=g)
    assert torch.allclose(rotate(rotate(keys)) / 64, keys, atol=1e-5), "H H = D I"
    kv = allocate_kv_cache(13, 4, 1, 2, 64, dtype, CPU)
    slots = torch.arange(50)
    store(kv.key[0], kv.key_scale[0], slots, keys, keys=True)
    exact = q @ keys.transpose(-1, -2)
    rotated = rotate_queries(q) @ gather_slots(kv.key[0], kv.key_scale[0], slots, torch.float32).transpose(-1, -2)
    plain_codes, plain_scale = quantize(keys, dtype)
    plain = q @ dequantize(plain_codes, plain_scale, torch.float32).transpose(-1, -2)
    assert (rotated - exact).norm() < 0.6 * (plain - exact).norm(), "the rotation spreads the outlier channel"


def dequantized_pool(dtype: torch.dtype, lens: list[int], seed: int = 0) -> tuple:
    """paged_case's pool in 8 bits as the engine stores it (int8 keys rotated), and the keys and values it stands
    for, dequantized (and rotated back) to float32: the exact answer to compare with."""
    q, k_cache, v_cache, tables = paged_case(torch.float32, 9, 3, 64, lens, seed=seed)
    int8 = dtype is torch.int8
    (kc, ks), (vc, vs) = quantize(rotate(k_cache * 4) if int8 else k_cache * 4, dtype), quantize(v_cache, dtype)
    k_exact = dequantize(kc, ks, torch.float32)
    k_exact = rotate(k_exact) / 64 if int8 else k_exact  # H H = 64 I
    return q, (kc, vc, ks, vs), (k_exact, dequantize(vc, vs, torch.float32)), tables


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_compiled_kernel_reads_an_int8_pool(compute: torch.dtype) -> None:
    lens = [1, 15, 16, 17, 40, 100]
    q, (kc, vc, ks, vs), (k_exact, v_exact), tables = dequantized_pool(torch.int8, lens)
    kernel = compiled(compute, 64, 9, 3)
    with pytest.raises(ValueError, match="built for a"):
        out = torch.empty_like(q, dtype=compute)
        kernel(q.to(compute), kc, vc, decode_rows(tables, lens), 0.125, out, None, ks, vs)

    config = EngineConfig(decode_attention="compiled", kv_cache_dtype="int8")
    plan = cpu_plan(config, "cpu", str(compute).removeprefix("torch."), "LlamaForCausalLM", this_machine())
    int8_kernel, settled = attention_kernel(plan, compute, 64, 9, 3, torch.int8)
    assert int8_kernel is not None and "over an int8 pool" in settled.attention.reason
    out = torch.zeros(len(lens), 9, 64, dtype=compute)
    int8_kernel(q.to(compute), kc, vc, decode_rows(tables, lens), 64**-0.5, out, None, ks, vs)
    expected = reference(q.to(compute).float(), k_exact, v_exact, tables, lens, 16)
    tolerance = 1e-5 if compute is torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", EIGHT_BITS, ids=["int8", "fp8"])
def test_the_grouped_decode_path_reads_an_8bit_pool(dtype: torch.dtype) -> None:
    lens = [70, 33, 16, 2]
    q, (kc, vc, ks, vs), (k_exact, v_exact), tables = dequantized_pool(dtype, lens, seed=1)
    width = max(len(t) for t in tables)
    group = DecodeGroup.build(0, [t + [0] * (width - len(t)) for t in tables], lens, 16, CPU)
    # the decode path wants q [H, B, D], rotated for rotated keys (attend does it)
    qr = rotate_queries(q) if dtype is torch.int8 else q
    out = _decode_attention(qr.transpose(0, 1), kc, vc, group, 16, None, k_scale=ks, v_scale=vs)
    exact = _decode_attention(q.transpose(0, 1), k_exact, v_exact, group, 16, None)
    torch.testing.assert_close(out, exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), reference(q, k_exact, v_exact, tables, lens, 16), rtol=1e-4, atol=1e-4)


def test_the_same_bytes_hold_twice_the_tokens_of_a_16bit_pool() -> None:
    # SmolLM2-135M (30 layers, 3 KV heads of 64) and Llama-3.1-8B (32 layers, 8 KV heads of 128).
    for layers, kv_heads, dim in ((30, 3, 64), (32, 8, 128)):
        budget = 1 << 30
        sixteen = budget // bytes_per_block(layers, kv_heads, dim, 16, torch.bfloat16)
        for dtype in EIGHT_BITS:
            eight = budget // bytes_per_block(layers, kv_heads, dim, 16, dtype)
            assert eight / sixteen >= 1.9, f"{dtype} at head size {dim}: {eight / sixteen:.3f}x"
            assert bytes_per_block(layers, kv_heads, dim, 16, dtype) == 2 * layers * 16 * kv_heads * (dim + 2)
        full = budget // bytes_per_block(layers, kv_heads, dim, 16, torch.float32)
        assert budget // bytes_per_block(layers, kv_heads, dim, 16, torch.int8) / full >= 3.8


def test_the_setting_is_checked_once_and_the_plan_says_which_attention_reads_the_pool() -> None:
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, bf16, fp16, int8, fp8"):
        EngineConfig(kv_cache_dtype="int4")  # type: ignore[arg-type]
    assert EngineConfig().kv_storage("bfloat16") == "bfloat16", "auto: the model's dtype, exact"
    assert EngineConfig(kv_cache_dtype="fp8").kv_storage("float32") == "float8_e4m3fn"
    machine = this_machine()
    int8 = cpu_plan(EngineConfig(kv_cache_dtype="int8"), "cpu", "float32", "LlamaForCausalLM", machine)
    fp8 = cpu_plan(EngineConfig(kv_cache_dtype="fp8"), "cpu", "float32", "LlamaForCausalLM", machine)
    if machine.compiler is not None:
        assert int8.attention.choice is Attention.COMPILED
    assert fp8.attention.choice is Attention.TORCH and "not float8_e4m3fn" in fp8.attention.reason
    with pytest.raises(KernelBuildError, match="not float8_e4m3fn"):
        cpu_plan(EngineConfig(kv_cache_dtype="fp8", decode_attention="compiled"), "cpu", "float32", None, machine)
