"""The plain-words diagnosis beside the charts: is the appliance keeping up, and if not, is memory (the KV cache)
or compute the limit, with the levers an operator has for each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from web.console.live import EngineLabel
from web.console.samples import Bucket
from web.console.tenants import SeatHolder, holder_detail, holder_levers

KV_FULL = 0.90  # above this the scheduler is short of free blocks for new requests


@dataclass(frozen=True, slots=True)
class Diagnosis:
    verdict: str  # memory | compute | healthy | down
    headline: str
    details: list[str] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)


EIGHT_BIT_KV = ("int8", "fp8")
EIGHT_BIT_LEVER = (
    "an 8-bit KV cache (APPLIANCE_KV_CACHE_DTYPE=int8, or fp8; vLLM takes fp8): about twice the tokens in the "
    "same memory, at a small cost in fidelity (see the README)"
)


def memory_levers(kind: str, kv_cache_dtype: str | None = None) -> list[str]:
    """kv_cache_dtype: the embedded engine's pool (None: not known); an 8-bit one is named where it is off."""
    more = (
        "more VRAM: a GPU with more memory, or raise APPLIANCE_GPU_MEMORY_UTILIZATION if other programs leave room"
        if kind == "VRAM"
        else "more RAM for the KV pool (APPLIANCE_KV_CACHE_BYTES), or a GPU"
    )
    eight_bit = [EIGHT_BIT_LEVER] if kv_cache_dtype is not None and kv_cache_dtype not in EIGHT_BIT_KV else []
    return [
        *eight_bit,
        "a smaller quantization (APPLIANCE_QUANTIZATION=nf4 or fp4) leaves more memory for KV blocks",
        "shorter contexts (APPLIANCE_MAX_MODEL_LEN): long conversations hold many blocks each",
        "lower max_tokens caps on the API keys, so each reply holds fewer blocks for less time",
        more,
    ]


COMPUTE_LEVERS = [
    "if running sits at APPLIANCE_MAX_NUM_SEQS, raise it: KV has room for more seats",
    "a faster GPU, or a smaller model, to shorten each step",
    "lower max_tokens caps, so seats free up sooner",
]


def _window_detail(window: Sequence[Bucket], label: str) -> tuple[str | None, bool]:
    """A sentence about waiting in the chart window, and whether that waiting happened with KV full."""
    waited = [b for b in window if b.waiting > 0]
    if not window or not waited:
        return (f"Nothing waited in the {label}." if window else None), False
    full = [b for b in waited if b.kv_usage >= KV_FULL]
    share = len(waited) / len(window)
    cause = "with the KV cache full" if len(full) * 2 >= len(waited) else "while the KV cache had room"
    return f"In the {label} requests waited in {share:.0%} of the samples, mostly {cause}.", bool(full)


def diagnose(
    state: EngineLabel,
    reason: str,
    waiting: int,
    kv_usage: float | None,
    memory_kind: str,
    window: Sequence[Bucket],
    window_label: str,
    holder: SeatHolder | None = None,
    kv_cache_dtype: str | None = None,
) -> Diagnosis:
    """`holder`: the key holding most seats while other keys wait, named first when anything waits;
    `kv_cache_dtype`: the pool's element type (EngineStats'), for the 8-bit KV lever where it is off."""
    if state in (EngineLabel.DOWN, EngineLabel.LOADING, EngineLabel.DRAINING):
        return Diagnosis("down", f"The engine is {state}.", [reason])
    detail, waited_full = _window_detail(window, window_label)
    details = [detail] if detail else []
    who, who_levers = ([holder_detail(holder)], holder_levers(holder)) if holder and waiting > 0 else ([], [])
    kv = kv_usage or 0.0
    if waiting > 0 and kv >= KV_FULL:
        return Diagnosis(
            "memory",
            f"Memory is the limit: {waiting} request(s) wait while the KV cache is {kv:.0%} full.",
            [*who, "The batch cannot take more requests until running ones finish and free their KV blocks.", *details],
            [*who_levers, *memory_levers(memory_kind, kv_cache_dtype)],
        )
    if waiting > 0:
        return Diagnosis(
            "compute",
            f"Compute bound: {waiting} request(s) wait although the KV cache has room ({kv:.0%} used).",
            [
                *who,
                "The batch is as large as the scheduler allows; each step takes as long as the hardware needs.",
                *details,
            ],
            [*who_levers, *COMPUTE_LEVERS],
        )
    return Diagnosis(
        "healthy",
        "Healthy: no request is waiting for a seat.",
        details,
        memory_levers(memory_kind, kv_cache_dtype) if waited_full else [],
    )
