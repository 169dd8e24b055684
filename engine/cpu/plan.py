"""The one CPU plan: torch's threads, malloc, attention, linear layers and forward, each decided once with its reason
from the engine config, the device, dtype and architecture, and the machine. No torch import: the doctor asks too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Generic, Literal, TypeVar

from engine.config import EngineConfig
from engine.cpu.allocator import keep_freed_memory
from engine.cpu.hardware import cpu_flags
from engine.cpu.kernel_build import ELEMENTS, NO_COMPILER, KernelBuildError, find_compiler

# The models engine.model.forward computes as transformers does (their module layout and arithmetic).
OWN_FORWARD_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
OWN_FORWARD_DTYPES = ("float32", "bfloat16")  # engine/cpu/csrc/layer_ops.c computes both
NOT_A_CPU = "not a CPU"

T = TypeVar("T", covariant=True)


class Malloc(StrEnum):
    KEEP_FREED = "keep freed blocks"  # engine.cpu.allocator
    DEFAULT = "default"


class Attention(StrEnum):
    COMPILED = "compiled"  # engine.cpu.decode_kernel
    TORCH = "torch's"  # engine.model.attention


class Linears(StrEnum):
    COMPACT = "compact"  # engine.cpu.packed_linear
    PREPACKED = "prepacked"  # engine.cpu.prepack
    SPLIT = "compact, then prepacked"  # engine.cpu.split_linear: a GGUF's blocks at small batches
    PLAIN = "plain"


class Forward(StrEnum):
    OWN = "own"  # engine.model.forward
    TRANSFORMERS = "transformers'"


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    choice: T
    reason: str
    fallback: bool = False  # a faster choice was wanted and this machine cannot make it (the doctor warns)


@dataclass(frozen=True, slots=True)
class Machine:
    """What the plan reads of the host."""

    flags: frozenset[str]
    cores: int
    compiler: str | None  # engine.cpu.kernel_build.find_compiler
    onednn_bf16: bool | None  # torch's oneDNN has a bf16 linear (engine.cpu.prepack); None: torch was not asked


def this_machine(onednn_bf16: bool | None = None) -> Machine:
    return Machine(cpu_flags(), os.cpu_count() or 2, find_compiler(), onednn_bf16)


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """What the engine does on this CPU. A choice that needs a build ("compiled, if it builds") is settled by the
    builder, which returns the plan with the outcome recorded (settled); nothing else re-tests device or dtype."""

    threads: Decision[int | None]  # None: torch's own count
    malloc: Decision[Malloc]
    attention: Decision[Attention]
    linears: Decision[Linears]
    forward: Decision[Forward]
    attention_required: bool  # decode_attention=compiled: a kernel that does not build stops the engine

    def settled(
        self,
        *,
        attention: Decision[Attention] | None = None,
        linears: Decision[Linears] | None = None,
        forward: Decision[Forward] | None = None,
    ) -> CpuPlan:
        """The plan with the builds' outcomes recorded: the choices that need a build are the only ones settled."""
        return replace(
            self,
            attention=attention or self.attention,
            linears=linears or self.linears,
            forward=forward or self.forward,
        )

    def unbuilt(self, what: Literal["attention", "linears", "forward"], exc: KernelBuildError) -> CpuPlan:
        """The plan where the build of what it chose failed: the slower choice, and why. Raises exc where the
        attention was required."""
        if what == "attention":
            if self.attention_required:
                raise exc
            why = f"slower: the compiled kernel does not build: {exc}"
            return self.settled(attention=Decision(Attention.TORCH, why, fallback=True))
        if what == "linears":
            why = f"slower: the packed kernel does not build: {exc}"
            kept = Linears.PREPACKED if self.linears.choice is Linears.SPLIT else Linears.PLAIN
            return self.settled(linears=Decision(kept, why, fallback=True))
        why = f"slower: its operations do not build: {exc}"
        return self.settled(forward=Decision(Forward.TRANSFORMERS, why, fallback=True))

    def lines(self) -> list[str]:
        """One line per decision, as the start-up log and the doctor print them."""
        return [f"cpu plan: {name} = {_shown(d.choice)} ({d.reason})" for name, d in self.decisions()]

    def decisions(self) -> list[tuple[str, Decision[object]]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if f.name != "attention_required"]

    def apply(self) -> None:
        """Set the process-wide choices, once, after the load (whose buffers are freed for good)."""
        import torch  # here alone: the doctor builds plans without torch

        if self.threads.choice is not None:
            torch.set_num_threads(self.threads.choice)
        if self.malloc.choice is Malloc.KEEP_FREED:
            keep_freed_memory()


def cpu_plan(config: EngineConfig, device: str, dtype: str, architecture: str | None, machine: Machine) -> CpuPlan:
    """device: the resolved device's type (cpu, cuda); dtype: the compute dtype's name (float32, bfloat16, ...);
    architecture: the model's class name, None where it is not known (the doctor). Raises KernelBuildError where
    decode_attention=compiled cannot be on this device."""
    if device != "cpu":
        if config.decode_attention == "compiled":
            raise KernelBuildError(f"the compiled attention is for CPUs, and the model is on {device}")
        return CpuPlan(
            Decision(None, NOT_A_CPU),
            Decision(Malloc.DEFAULT, NOT_A_CPU),
            Decision(Attention.TORCH, NOT_A_CPU),
            Decision(Linears.PLAIN, NOT_A_CPU),
            Decision(Forward.TRANSFORMERS, NOT_A_CPU),
            attention_required=False,
        )
    return CpuPlan(
        _threads(config, machine),
        # A step's temporaries are megabytes each, of changing sizes: glibc would fault them in again every step.
        Decision(Malloc.KEEP_FREED, "a step's large temporaries reused, not faulted in again; glibc only"),
        _attention(config, dtype, machine),
        _linears(config, dtype, machine),
        _forward(config, dtype, architecture, machine),
        attention_required=config.decode_attention == "compiled",
    )


def _threads(config: EngineConfig, machine: Machine) -> Decision[int | None]:
    if config.cpu_threads is not None:
        return Decision(config.cpu_threads, "as cpu_threads (APPLIANCE_CPU_THREADS) says")
    # torch's thread pool slows down several-fold, not by half, as soon as another process wants one of its
    # cores (measured: 39 -> 125 ms per step on 2 cores, 1 thread: 52 ms).
    count = max(1, machine.cores - 1)
    return Decision(count, f"one fewer than the {machine.cores} cores: a core is left to the web server")


def _attention(config: EngineConfig, dtype: str, machine: Machine) -> Decision[Attention]:
    if config.decode_attention == "torch":
        return Decision(Attention.TORCH, "as decode_attention (APPLIANCE_DECODE_ATTENTION) says")
    pool = config.kv_storage(dtype)
    if pool not in (dtype, "int8"):
        why = f"the compiled kernel reads a KV pool of the model's dtype or int8, not {pool} (APPLIANCE_KV_CACHE_DTYPE)"
        if config.decode_attention == "compiled":
            raise KernelBuildError(why)
        return Decision(Attention.TORCH, why)
    if config.decode_attention == "compiled":
        return Decision(Attention.COMPILED, "as decode_attention (APPLIANCE_DECODE_ATTENTION) says: compiled for this "
                        "CPU at start, or no start")  # fmt: skip
    if dtype not in ELEMENTS:
        return Decision(Attention.TORCH, f"the compiled kernel computes {' or '.join(ELEMENTS)}, not {dtype}")
    if machine.compiler is None:
        return Decision(Attention.TORCH, f"slower: {NO_COMPILER}", fallback=True)
    return Decision(Attention.COMPILED, "auto: compiled for this CPU and the model's shape at start, where it builds")


def _linears(config: EngineConfig, dtype: str, machine: Machine) -> Decision[Linears]:
    if dtype == "float32":
        if not config.compact_weights:
            return Decision(Linears.PLAIN, "as compact_weights (APPLIANCE_COMPACT_WEIGHTS) says")
        if machine.compiler is None:
            return Decision(Linears.PLAIN, f"slower: {NO_COMPILER}", fallback=True)
        return Decision(
            Linears.COMPACT, "float32 weights in the narrowest form that holds them exactly, where it builds"
        )
    if dtype == "bfloat16":
        if not config.prepack:
            return Decision(Linears.PLAIN, "as prepack says")
        if machine.onednn_bf16 is False:
            return Decision(Linears.PLAIN, "in bfloat16, and torch's oneDNN has no bf16 linear on this CPU")
        where = "" if machine.onednn_bf16 else ", where torch's oneDNN has a bf16 linear"
        prepacked = f"in bfloat16: weights laid out once for oneDNN{where}"
        if not config.compact_weights:
            return Decision(Linears.PREPACKED, f"{prepacked}; compact weights off (APPLIANCE_COMPACT_WEIGHTS)")
        if machine.compiler is None:
            return Decision(Linears.PREPACKED, f"{prepacked}; slower at small batches: {NO_COMPILER}", fallback=True)
        return Decision(
            Linears.SPLIT,
            f"{prepacked}, and a GGUF's blocks kept for the small batches where they measure faster at load, where "
            "the kernel builds",
        )
    return Decision(Linears.PLAIN, f"compact weights and prepacking are for float32 and bfloat16, not {dtype}")


def _forward(config: EngineConfig, dtype: str, architecture: str | None, machine: Machine) -> Decision[Forward]:
    served = " and ".join(OWN_FORWARD_ARCHITECTURES)
    if not config.own_forward:
        return Decision(Forward.TRANSFORMERS, "as own_forward (APPLIANCE_OWN_FORWARD) says")
    if architecture is not None and architecture not in OWN_FORWARD_ARCHITECTURES:
        return Decision(Forward.TRANSFORMERS, f"the engine's own is for {served}, not {architecture}")
    if dtype not in OWN_FORWARD_DTYPES:
        return Decision(Forward.TRANSFORMERS, f"the engine's own is for float32 or bfloat16 on a CPU, not {dtype}")
    if machine.compiler is None:
        return Decision(Forward.TRANSFORMERS, f"slower: {NO_COMPILER}", fallback=True)
    model = architecture or f"{served} models"
    return Decision(Forward.OWN, f"{model} in {dtype} on a CPU, where its operations build")


def _shown(choice: object) -> str:
    return "torch's own" if choice is None else str(choice)
