"""The one CPU plan (engine/cpu/plan.py): each decision and its reason on the machines the engine meets, every
setting honoured, CUDA left alone, and a build's outcome recorded in the plan the engine logs."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from engine import EngineConfig
from engine.cpu.kernel_build import KernelBuildError
from engine.cpu.plan import Attention, CpuPlan, Forward, Linears, Machine, Malloc, cpu_plan

AVX2 = Machine(frozenset({"avx2"}), 2, "/usr/bin/cc", onednn_bf16=False)
AVX512_BF16 = Machine(frozenset({"avx2", "avx512f", "avx512_bf16"}), 8, "/usr/bin/cc", onednn_bf16=True)
NO_COMPILER = Machine(frozenset({"avx2"}), 2, None, onednn_bf16=False)
LLAMA = "LlamaForCausalLM"


def plan(
    machine: Machine = AVX2,
    dtype: str = "float32",
    device: str = "cpu",
    architecture: str | None = LLAMA,
    **settings: object,
) -> CpuPlan:
    return cpu_plan(EngineConfig(**settings), device, dtype, architecture, machine)  # type: ignore[arg-type]


def test_avx2_in_float32_compacts_the_weights_and_compiles_attention_and_the_forward() -> None:
    p = plan()
    assert (p.threads.choice, p.malloc.choice) == (1, Malloc.KEEP_FREED)
    assert "one fewer than the 2 cores" in p.threads.reason
    assert p.attention.choice is Attention.COMPILED and "auto: compiled for this CPU" in p.attention.reason
    assert p.linears.choice is Linears.COMPACT and "narrowest form" in p.linears.reason
    assert p.forward.choice is Forward.OWN and LLAMA in p.forward.reason
    assert not p.attention_required and not any(d.fallback for _, d in p.decisions())
    assert p.lines()[2] == f"cpu plan: attention = compiled ({p.attention.reason})"
    assert [line.split(" = ")[0] for line in p.lines()] == [
        f"cpu plan: {name}" for name in ("threads", "malloc", "attention", "linears", "forward")
    ]


def test_avx512_bf16_in_bfloat16_splits_the_layers_and_compiles_attention_with_the_engines_forward() -> None:
    p = plan(AVX512_BF16, "bfloat16")
    assert p.threads.choice == 7
    assert p.attention.choice is Attention.COMPILED
    assert p.linears.choice is Linears.SPLIT and p.linears.reason.startswith("in bfloat16")
    assert "a GGUF's blocks kept for the small batches where they measure faster at load" in p.linears.reason
    off = plan(AVX512_BF16, "bfloat16", compact_weights=False).linears
    assert off.choice is Linears.PREPACKED and "compact weights off (APPLIANCE_COMPACT_WEIGHTS)" in off.reason
    bare = plan(Machine(AVX512_BF16.flags, 8, None, onednn_bf16=True), "bfloat16").linears
    assert bare.choice is Linears.PREPACKED and bare.fallback
    assert "slower at small batches: no C compiler" in bare.reason
    unbuilt = p.unbuilt("linears", KernelBuildError("cc failed: boom")).linears
    assert unbuilt.choice is Linears.PREPACKED and unbuilt.fallback and "boom" in unbuilt.reason
    assert p.forward.choice is Forward.OWN and "in bfloat16 on a CPU" in p.forward.reason
    half = plan(AVX512_BF16, "float16")
    assert half.forward.choice is Forward.TRANSFORMERS
    assert half.forward.reason == "the engine's own is for float32 or bfloat16 on a CPU, not float16"


def test_bfloat16_where_torch_has_no_onednn_bf16_linear_stays_plain() -> None:
    p = plan(AVX2, "bfloat16")
    assert p.linears.choice is Linears.PLAIN and "no bf16 linear" in p.linears.reason
    unasked = plan(Machine(frozenset(), 2, "/usr/bin/cc", onednn_bf16=None), "bfloat16")  # the doctor's view
    assert (
        unasked.linears.choice is Linears.SPLIT and "where torch's oneDNN has a bf16 linear" in unasked.linears.reason
    )


def test_float16_on_a_cpu_takes_torch_attention_and_plain_layers() -> None:
    p = plan(dtype="float16")
    assert p.attention.choice is Attention.TORCH and "float32 or bfloat16, not float16" in p.attention.reason
    assert p.linears.choice is Linears.PLAIN and "not float16" in p.linears.reason
    assert p.forward.choice is Forward.TRANSFORMERS


def test_without_a_compiler_everything_compiled_falls_back_and_says_so() -> None:
    p = plan(NO_COMPILER)
    for decision, slower in (
        (p.attention, Attention.TORCH),
        (p.linears, Linears.PLAIN),
        (p.forward, Forward.TRANSFORMERS),
    ):
        assert decision.choice is slower and decision.fallback and "no C compiler" in decision.reason
    insisted = plan(NO_COMPILER, decode_attention="compiled")  # the build says no C compiler, and the engine stops
    assert insisted.attention.choice is Attention.COMPILED and insisted.attention_required


def test_on_cuda_every_decision_is_not_a_cpu() -> None:
    p = plan(AVX512_BF16, "bfloat16", device="cuda")
    assert p.threads.choice is None and p.malloc.choice is Malloc.DEFAULT
    assert (p.attention.choice, p.linears.choice, p.forward.choice) == (
        Attention.TORCH,
        Linears.PLAIN,
        Forward.TRANSFORMERS,
    )
    assert {d.reason for _, d in p.decisions()} == {"not a CPU"}
    assert p.lines()[0] == "cpu plan: threads = torch's own (not a CPU)"
    with pytest.raises(KernelBuildError, match="for CPUs, and the model is on cuda"):
        plan(device="cuda", decode_attention="compiled")


@pytest.mark.parametrize(
    ("setting", "name", "choice", "says"),
    [
        ({"cpu_threads": 3}, "threads", 3, "APPLIANCE_CPU_THREADS"),
        ({"decode_attention": "torch"}, "attention", Attention.TORCH, "APPLIANCE_DECODE_ATTENTION"),
        ({"decode_attention": "compiled"}, "attention", Attention.COMPILED, "APPLIANCE_DECODE_ATTENTION"),
        ({"compact_weights": False}, "linears", Linears.PLAIN, "APPLIANCE_COMPACT_WEIGHTS"),
        ({"own_forward": False}, "forward", Forward.TRANSFORMERS, "APPLIANCE_OWN_FORWARD"),
    ],
)
def test_each_setting_is_honoured_and_named(setting: dict[str, Any], name: str, choice: object, says: str) -> None:
    decision = getattr(plan(**setting), name)
    assert decision.choice == choice and says in decision.reason and not decision.fallback


def test_prepack_off_keeps_bf16_layers_plain() -> None:
    p = plan(AVX512_BF16, "bfloat16", prepack=False)
    assert p.linears.choice is Linears.PLAIN and p.linears.reason == "as prepack says"


def test_a_model_the_own_forward_does_not_serve_keeps_transformers() -> None:
    p = plan(architecture="GemmaForCausalLM")
    assert p.forward.choice is Forward.TRANSFORMERS
    assert p.forward.reason == "the engine's own is for LlamaForCausalLM and Qwen2ForCausalLM, not GemmaForCausalLM"
    assert p.linears.choice is Linears.COMPACT and p.attention.choice is Attention.COMPILED
    assert plan(architecture=None).forward.choice is Forward.OWN  # the doctor, which has not read the model


def test_a_failed_build_settles_the_slower_choice_unless_it_was_required() -> None:
    failed = KernelBuildError("cc failed: boom")
    p = plan().unbuilt("attention", failed).unbuilt("linears", failed).unbuilt("forward", failed)
    assert (p.attention.choice, p.linears.choice, p.forward.choice) == (
        Attention.TORCH,
        Linears.PLAIN,
        Forward.TRANSFORMERS,
    )
    assert all(d.fallback and "cc failed: boom" in d.reason for _, d in p.decisions()[2:])
    with pytest.raises(KernelBuildError, match="boom"):
        plan(decode_attention="compiled").unbuilt("attention", failed)


def test_the_plan_reads_no_torch() -> None:
    """The doctor builds the plan too, and must stay fast: in a child, as this process has torch already."""
    code = "import sys, engine.cpu.plan as p; p.this_machine(); raise SystemExit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_engine_logs_the_plan_it_settled(caplog: pytest.LogCaptureFixture) -> None:
    from engine.core import EngineCore

    config = EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", num_kv_blocks=16)
    with caplog.at_level(logging.INFO, logger="engine.core"):
        core = EngineCore(config)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpu plan: ")]
    assert lines == core.cpu_plan.lines() and len(lines) == 5
    assert core.cpu_plan.forward.choice is Forward.OWN and core.forward is not None
    # Random float32 weights: no compact form holds them, so the layers stay as they were, and the plan says so.
    assert core.cpu_plan.linears.choice is Linears.PLAIN and "no compact form" in core.cpu_plan.linears.reason
    assert core.runner.decode_kernel is not None, "the decode kernel was meant to build here (needs cc)"
    assert core.cpu_plan.attention.choice is Attention.COMPILED and "ready in" in core.cpu_plan.attention.reason
