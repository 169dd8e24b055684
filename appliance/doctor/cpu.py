"""`appliance doctor`'s findings on the CPU path: the engine's own CPU plan (engine.cpu.plan), made from the
settings, with the kernels it chooses built once here to show they build. No torch import."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Literal

from appliance.doctor.host import FAIL, INFO, OK, WARN, Finding
from appliance.settings import Settings
from appliance.wiring import engine_config
from engine.cpu.kernel_build import KernelBuildError, build_kernel, build_layer_ops, build_packed_linear
from engine.cpu.plan import Attention, CpuPlan, Decision, Forward, Linears, cpu_plan, this_machine

VLLM = "not the engine's: vLLM is the engine (APPLIANCE_ENGINE)"
# What the linear-layers finding leads with; a faster choice the doctor has just built is OK.
SUMMARY = {
    Linears.COMPACT: "compact weights",
    Linears.PREPACKED: "prepacked weights",
    Linears.SPLIT: "compact and prepacked weights",
    Forward.OWN: "the engine's own forward",
}
BUILT = {Attention.COMPILED, Linears.COMPACT, Linears.SPLIT, Forward.OWN}
Built = Literal["attention", "linears", "forward"]


class CpuFindings:
    """The plan as the engine would settle it on this machine, and the seconds its trial builds took."""

    def __init__(self, settings: Settings, cuda: bool, dtype: str) -> None:
        """dtype: the compute dtype the engine will use (the doctor's compute check resolves `auto`)."""
        self.vllm = settings.engine == "vllm"
        self.refused: KernelBuildError | None = None
        self.build_s = 0.0
        self.plan: CpuPlan | None = None
        try:
            plan = cpu_plan(engine_config(settings), "cuda" if cuda else "cpu", dtype, None, this_machine())
        except KernelBuildError as exc:  # decode_attention=compiled on CUDA
            self.refused = exc
        else:
            self.plan = self._built(plan, dtype)

    def plan_finding(self) -> Finding:
        if self.vllm or self.plan is None:
            return Finding(INFO, "cpu plan", VLLM if self.vllm else "no plan: see decode attention")
        level = INFO if self.plan.threads.choice is None else OK
        return Finding(level, "cpu plan", self._shown("threads", "malloc", built=False))

    def attention_finding(self) -> Finding:
        if self.refused is not None:
            return Finding(FAIL, "decode attention", f"APPLIANCE_DECODE_ATTENTION=compiled, but {self.refused}")
        if self.vllm or self.plan is None:
            return Finding(INFO, "decode attention", VLLM)
        return Finding(_level(self.plan.attention), "decode attention", self._shown("attention"))

    def linear_finding(self) -> Finding:
        if self.vllm or self.plan is None:
            return Finding(INFO, "linear layers", VLLM if self.vllm else "no plan: see decode attention")
        decisions = (self.plan.linears, self.plan.forward)
        levels = {_level(d) for d in decisions}
        level = WARN if WARN in levels else OK if OK in levels else INFO
        fast = [SUMMARY[d.choice] for d in decisions if d.choice in SUMMARY]
        summary = " and ".join(fast) or "plain weights and transformers' forward"
        return Finding(level, "linear layers", f"{summary}: {self._shown('linears', 'forward')}")

    def _built(self, plan: CpuPlan, dtype: str) -> CpuPlan:
        """The plan with the kernels it chose built here once (for a head size of 64, one head per KV head)."""
        builds: list[tuple[Built, StrEnum, Callable[[], float]]] = [
            ("attention", Attention.COMPILED, lambda: build_kernel(dtype, 64, 1, 1)[1]),
            ("linears", Linears.COMPACT, lambda: build_packed_linear("q4")[1]),
            ("linears", Linears.SPLIT, lambda: build_packed_linear("q4", round_bf16=True)[1]),
            ("forward", Forward.OWN, lambda: build_layer_ops().build_s),
        ]
        for what, choice, build in builds:
            if getattr(plan, what).choice is not choice:
                continue
            try:
                self.build_s += build()
            except KernelBuildError as exc:
                if what == "attention" and plan.attention_required:
                    self.refused = exc  # the engine would not start
                else:
                    plan = plan.unbuilt(what, exc)
        return plan

    def _shown(self, *names: str, built: bool = True) -> str:
        assert self.plan is not None
        lines = dict(zip([name for name, _ in self.plan.decisions()], self.plan.lines(), strict=True))
        shown = "; ".join(lines[name].removeprefix("cpu plan: ") for name in names)
        return shown + (f"; built here in {self.build_s:.1f} s" if built and self.build_s else "")


def _level(decision: Decision[object]) -> str:
    if decision.fallback:
        return WARN
    return OK if decision.choice in BUILT else INFO
