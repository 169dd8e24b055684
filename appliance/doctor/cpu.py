"""`appliance doctor`'s finding on the float32 CPU path: compact weights (engine.cpu.packed_linear) and the engine's
own forward (engine.model.forward), both built at each start with the host's C compiler. No torch import."""

from __future__ import annotations

from appliance.doctor.host import INFO, OK, WARN, Finding
from appliance.settings import Settings
from engine.cpu.kernel_build import KernelBuildError, build_layer_ops, build_packed_linear

NAME = "linear layers"


def float32_cpu_finding(settings: Settings, cuda: bool, dtype: str) -> Finding:
    """dtype: the compute dtype the engine will use (the doctor's compute check resolves `auto`)."""
    if settings.engine == "vllm":
        return Finding(INFO, NAME, "not the engine's: vLLM is the engine (APPLIANCE_ENGINE)")
    if cuda or dtype != "float32":
        where = "on CUDA" if cuda else f"in {dtype} (oneDNN's prepacked layers where the CPU has them)"
        return Finding(INFO, NAME, f"torch's {where}; compact weights and the engine's own forward are for float32")
    wanted = [
        what
        for what, on in (
            ("compact weights", settings.compact_weights),
            ("the engine's own forward", settings.own_forward),
        )
        if on
    ]
    if not wanted:
        return Finding(INFO, NAME, "float32 weights and transformers' forward, as APPLIANCE_COMPACT_WEIGHTS and "
                       "APPLIANCE_OWN_FORWARD say")  # fmt: skip
    try:
        seconds = build_packed_linear("q4")[1] + build_layer_ops().build_s
    except KernelBuildError as exc:
        return Finding(WARN, NAME, f"float32 weights and transformers' forward, slower: the kernels cannot be built "
                       f"({exc})")  # fmt: skip
    return Finding(
        OK,
        NAME,
        f"{' and '.join(wanted)} (Llama and Qwen2 models), built for this CPU at each start (here in {seconds:.1f} s)",
    )
