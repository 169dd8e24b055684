"""The engine's own forward for Llama-family models on a CPU (engine/model/forward.py): chosen where it applies and
nowhere else, its operations equal transformers' own in float32 and in bfloat16, and its logits those of
transformers' forward. (Greedy
equivalence with transformers' generate under preemption, chunking and prefix hits runs through it in
tests/engine/test_equivalence.py, for Llama and Qwen2.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from engine.cpu.kernel_build import KernelBuildError, LayerOps, build_layer_ops
from engine.cpu.plan import CpuPlan, Forward, cpu_plan, this_machine
from engine.model.attention import AttentionMetadata
from engine.model.forward import CpuForward, cpu_forward

try:
    OPS: LayerOps = build_layer_ops()
except KernelBuildError as exc:  # pragma: no cover - CI installs gcc (make sysdeps-test)
    pytest.skip(f"the layer operations do not build here: {exc}", allow_module_level=True)


def _core(model: str = "random:tiny", **options: object) -> EngineCore:
    config = EngineConfig(model=model, quantization="none", dtype="float32", device="cpu", num_kv_blocks=64)
    return EngineCore(EngineConfig(**{**{f: getattr(config, f) for f in config.__dataclass_fields__}, **options}))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-qwen2"])
def test_llama_and_qwen2_in_float32_and_bfloat16_take_the_engines_forward(model: str, dtype: str) -> None:
    core = _core(model, dtype=dtype)
    assert isinstance(core.forward, CpuForward) and core.runner.forward is core.forward
    assert _core(model, dtype=dtype, own_forward=False).forward is None


def test_other_dtypes_architectures_and_hosts_keep_transformers_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    core = _core()

    def plan(dtype: str = "float32", architecture: str = "LlamaForCausalLM") -> CpuPlan:
        return cpu_plan(EngineConfig(), "cpu", dtype, architecture, this_machine())

    half = plan("float16")
    assert cpu_forward(core.loaded.model, half) == (None, half)
    assert "for float32 or bfloat16 on a CPU, not float16" in half.forward.reason
    other = plan(architecture=type(nn.Linear(4, 4)).__name__)
    assert cpu_forward(nn.Linear(4, 4), other) == (None, other) and "not Linear" in other.forward.reason
    monkeypatch.setenv("CC", "/nonexistent/cc")
    forward, settled = cpu_forward(core.loaded.model, plan())
    assert forward is None and settled.forward.choice is Forward.TRANSFORMERS
    assert "its operations do not build" in settled.forward.reason


def test_a_model_of_another_activation_keeps_transformers_forward() -> None:
    core = _core()
    text = core.loaded.model.config.get_text_config()
    text.hidden_act = "gelu"
    try:
        forward, settled = cpu_forward(core.loaded.model, core.loaded.cpu_plan)
    finally:
        text.hidden_act = "silu"
    assert forward is None and settled.forward.reason == "the engine's own computes SiLU, not gelu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [8, 96, 100, 576, 960, 3000, 8192])  # below, at and past a cascade level; tails
def test_the_norm_is_transformers_rmsnorm_bit_for_bit(width: int, dtype: torch.dtype) -> None:
    """The sum of squares is added in torch's order (layer_ops.c's torch_row_sum), so the norm is torch's own."""
    g = torch.Generator().manual_seed(width)
    norm = LlamaRMSNorm(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(generator=g)
    norm = norm.to(dtype)
    h, residual = ((torch.randn(33, width, generator=g) * 3).to(dtype) for _ in range(2))
    expected_residual = residual + h
    with torch.inference_mode():
        expected = norm(expected_residual)
    add_rms_norm = OPS.add_rms_norm if dtype == torch.float32 else OPS.add_rms_norm_bf16
    out = torch.empty_like(h)
    add_rms_norm(h.data_ptr(), residual.data_ptr(), norm.weight.data_ptr(), 1e-5, 33, width, 0, out.data_ptr())
    assert torch.equal(residual, expected_residual)  # one rounding, as torch's add
    assert torch.equal(out, expected)
    first = torch.empty_like(h)
    add_rms_norm(h.data_ptr(), residual.data_ptr(), norm.weight.data_ptr(), 1e-5, 33, width, 1, first.data_ptr())
    assert torch.equal(residual, h)  # the first layer's residual is the embeddings themselves


def test_rotary_embedding_is_transformers_own_bit_for_bit_and_the_pool_gets_keys_and_values() -> None:
    g = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, dim, slots = 5, 4, 2, 16, 32
    q, k, v = (torch.randn(tokens, n * dim, generator=g) for n in (heads, kv_heads, kv_heads))
    angles = torch.rand(tokens, dim // 2, generator=g) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    q_ref, k_ref = apply_rotary_pos_emb(
        q.view(1, tokens, heads, dim).transpose(1, 2),
        k.view(1, tokens, kv_heads, dim).transpose(1, 2),
        cos[None],
        sin[None],
    )
    where = torch.tensor([3, 9, 0, 31, 17])
    k_cache, v_cache = torch.zeros(kv_heads, slots, dim), torch.zeros(kv_heads, slots, dim)
    failed = OPS.rope_and_store(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
        sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim, k_cache.data_ptr(), v_cache.data_ptr(), slots,
    )  # fmt: skip
    assert failed == 0
    assert torch.equal(q.view(tokens, heads, dim).transpose(0, 1), q_ref[0])
    assert torch.equal(k.view(tokens, kv_heads, dim).transpose(0, 1), k_ref[0])
    assert torch.equal(k_cache[:, where], k_ref[0]) and torch.equal(
        v_cache[:, where], v.view(tokens, kv_heads, dim).transpose(0, 1)
    )
    where[2] = slots  # outside the pool: refused, not written
    failed = OPS.rope_and_store(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
        sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim, k_cache.data_ptr(), v_cache.data_ptr(), slots,
    )  # fmt: skip
    assert failed == 2


def test_silu_times_up_follows_torch() -> None:
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(6, 43, generator=g) * 8, torch.randn(6, 43, generator=g)  # 43: 5 vectors and 3 more
    gate[0, 0], gate[0, 1], gate[1, 42] = -200.0, 200.0, -200.0  # e^200 overflows: SiLU is then 0 or the input
    expected = torch.nn.functional.silu(gate) * up
    OPS.silu_mul(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), 6, 43)
    torch.testing.assert_close(gate, expected, rtol=1e-6, atol=1e-7)
    assert gate[0, 0] == 0.0 and gate[0, 1] == 200.0 * up[0, 1] and gate[1, 42] == 0.0


def test_silu_is_as_close_to_the_exact_value_as_torchs_over_the_whole_range() -> None:
    x = torch.cat([torch.linspace(-100, 100, 400_001), torch.tensor([0.0, -0.0, 87.4, -87.4, 88.5, -88.5])])
    gate, up = x.clone().view(1, -1), torch.ones(1, x.numel())
    OPS.silu_mul(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), 1, x.numel())
    exact = x.double() / (1 + torch.exp(-x.double()))
    relative = (gate[0].double() - exact).abs() / exact.abs().clamp_min(1e-30)
    torchs = (torch.nn.functional.silu(x).double() - exact).abs() / exact.abs().clamp_min(1e-30)
    assert relative[exact.abs() > 1e-30].max() < 4e-7 and torchs[exact.abs() > 1e-30].max() < 4e-7  # ~3 ulps
    assert (gate[0].abs() <= 1e-30).equal(exact.abs() <= 1e-30)  # underflows where the exact value does


def test_bfloat16_rotary_embedding_is_transformers_own_bit_for_bit_and_the_pool_gets_keys_and_values() -> None:
    g = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads, dim, slots = 6, 9, 3, 64, 40
    q, k, v = ((torch.randn(tokens, n * dim, generator=g) * 2).bfloat16() for n in (heads, kv_heads, kv_heads))
    angles = torch.rand(tokens, dim // 2, generator=g) * 60
    cos, sin = (f(torch.cat([angles, angles], -1)).bfloat16() for f in (torch.cos, torch.sin))  # as rotary_emb gives
    q_ref, k_ref = apply_rotary_pos_emb(
        q.view(1, tokens, heads, dim).transpose(1, 2), k.view(1, tokens, kv_heads, dim).transpose(1, 2), cos[None],
        sin[None],
    )  # fmt: skip
    q2, k2 = q.clone(), k.clone()
    OPS.rope_bf16(q2.data_ptr(), q2.stride(0), k2.data_ptr(), k2.stride(0), cos.data_ptr(), sin.data_ptr(), tokens,
                  heads, kv_heads, dim)  # fmt: skip
    assert torch.equal(q2.view(tokens, heads, dim).transpose(0, 1), q_ref[0])
    assert torch.equal(k2.view(tokens, kv_heads, dim).transpose(0, 1), k_ref[0])
    where = torch.tensor([3, 9, 0, 39, 17, 5])
    k_cache, v_cache = (torch.zeros(kv_heads, slots, dim, dtype=torch.bfloat16) for _ in range(2))
    failed = OPS.rope_and_store_bf16(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
        sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim, k_cache.data_ptr(), v_cache.data_ptr(), slots,
    )  # fmt: skip
    assert failed == 0 and torch.equal(q, q2) and torch.equal(k, k2)
    assert torch.equal(k_cache[:, where], k_ref[0])
    assert torch.equal(v_cache[:, where], v.view(tokens, kv_heads, dim).transpose(0, 1))
    where[1] = -1
    failed = OPS.rope_and_store_bf16(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
        sin.data_ptr(), where.data_ptr(), tokens, heads, kv_heads, dim, k_cache.data_ptr(), v_cache.data_ptr(), slots,
    )  # fmt: skip
    assert failed == 2


def test_bfloat16_silu_times_up_is_torchs_but_for_rare_last_bits() -> None:
    """SiLU is rounded to bf16, then its product with up: torch's two roundings. The e^x differs from torch's in
    float32's last bits, which moves a bf16 result by one step only where it lies on a rounding boundary."""
    g = torch.Generator().manual_seed(4)
    gate, up = (torch.randn(64, 1539, generator=g) * 8).bfloat16(), torch.randn(64, 1539, generator=g).bfloat16()
    gate[0, 0], gate[0, 1], gate[1, 7] = -200.0, 200.0, float("nan")
    expected = torch.nn.functional.silu(gate) * up
    OPS.silu_mul_bf16(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), 64, 1539)
    assert gate[0, 0] == 0.0 and gate[0, 1] == expected[0, 1] and gate[1, 7].isnan()
    same = (gate == expected) | (gate.isnan() & expected.isnan())
    assert float(same.float().mean()) > 0.999
    steps = (gate.view(torch.int16).int() - expected.view(torch.int16).int()).abs()  # bf16 steps apart
    assert int(steps[~gate.isnan()].amax()) <= 1


@pytest.mark.parametrize(("dtype", "pool"), [("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "int8")])
@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-qwen2"])
def test_logits_are_transformers_forwards(model: str, dtype: str, pool: str) -> None:
    """One prompt's first token through both forwards of the same engine (each computing the whole prompt: no
    prefix cache) gives the same logits, with a pool of the model's dtype (written in C) or an int8 one."""
    core = _core(model, dtype=dtype, kv_cache_dtype=pool, enable_prefix_caching=False)
    prompt = list(range(30, 75))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=5)
    core.add_request("own", prompt, params)
    own = next(o for o in core.step() if o.request_id == "own")
    core.runner.forward = None
    core.add_request("hf", prompt, params)
    hf = next(o for o in core.step() if o.request_id == "hf")
    assert own.token_ids == hf.token_ids
    assert own.logprobs is not None and hf.logprobs is not None
    own_top, hf_top = own.logprobs[0].top, hf.logprobs[0].top
    assert [t for t, _, _ in own_top] == [t for t, _, _ in hf_top]
    for (_, _, a), (_, _, b) in zip(own_top, hf_top, strict=True):
        assert a == pytest.approx(b, abs=1e-4)  # float32: SiLU's e^x, not torch's own, differs in its last bits
    if dtype == "bfloat16":
        assert own_top == hf_top  # bit for bit: rounded to bf16, SiLU's last bits are gone here
    with pytest.raises(RuntimeError, match="outside the KV pool"):
        core.runner.forward = core.forward
        bad = torch.full((2,), core.kv.num_blocks * core.kv.block_size)
        meta = AttentionMetadata(bad, core.kv.key, core.kv.value)
        assert core.forward is not None
        core.forward(torch.tensor([5, 6]), torch.tensor([0, 1]), meta, torch.tensor([1]))
