"""The diagnosis where the gateway routes to remote backends, read per backend: which one is down (its circuit
open, its health check failing), which model has every backend serving it short of KV memory, and which backend
has requests waiting, and why."""

from __future__ import annotations

from collections.abc import Sequence

from web.backends.status import BackendState, BackendStatus
from web.console.diagnosis import COMPUTE_LEVERS, KV_FULL, Diagnosis, memory_levers

MORE_BACKENDS = "another server serving the model, added to APPLIANCE_BACKENDS, takes a share of its requests"
REMOTE_COMPUTE = "on that server: more seats (vLLM: --max-num-seqs) while its KV has room, or a faster GPU"
REMOTE_MEMORY = (
    "more KV memory on that server (vLLM: a higher --gpu-memory-utilization, a shorter --max-model-len, "
    "a quantized model)"
)


def has_remotes(statuses: Sequence[BackendStatus]) -> bool:
    return any(s.kind == "remote" for s in statuses)


def trouble(s: BackendStatus) -> str | None:
    """What keeps a backend from taking requests, in a sentence; None while it is up."""
    last = f" (last error: {s.last_error})" if s.last_error else ""
    if s.state == BackendState.CIRCUIT_OPEN:
        return f"Backend {s.name} is down: circuit open after {s.errors} errors{last}."
    if s.state == BackendState.DOWN:
        return f"Backend {s.name} is down: {s.last_error or 'it does not answer its health check'}."
    if s.state == BackendState.DRAINING:
        return f"Backend {s.name} is draining: it takes no new requests."
    if s.state == BackendState.LOADING:
        return f"Backend {s.name} is loading its model."
    if s.reason is not None:
        return f"Backend {s.name} is up but serves {'less than it lists' if s.models else 'nothing'}: {s.reason}."
    return None


def _kv(s: BackendStatus) -> float:
    return s.kv_usage or 0.0


def _full_model(up: Sequence[BackendStatus]) -> str | None:
    """A model every backend serving it is above KV_FULL for: the router has nowhere roomy to send it."""
    models = dict.fromkeys(m for s in up for m in s.models)
    for model in models:
        if all(_kv(s) >= KV_FULL for s in up if model in s.models):
            return model
    return None


def _memory_levers(s: BackendStatus, memory_kind: str) -> list[str]:
    return memory_levers(memory_kind) if s.kind == "embedded" else [REMOTE_MEMORY]


def diagnose_backends(statuses: Sequence[BackendStatus], memory_kind: str) -> Diagnosis:
    """`memory_kind`: the embedded engine's (VRAM or RAM), for its own memory levers."""
    troubles = [t for t in map(trouble, statuses) if t is not None]
    up = [s for s in statuses if s.state == BackendState.UP]
    if not up:
        return Diagnosis(
            "down",
            "No backend is up: requests are answered 503 until one is.",
            troubles,
            ["check each server (and its address in APPLIANCE_BACKENDS): the console shows its last error"],
        )
    full = _full_model(up)
    if full is not None:
        serving = [s for s in up if full in s.models]
        names = ", ".join(f"{s.name} {_kv(s):.0%}" for s in serving)
        return Diagnosis(
            "memory",
            f"All backends for model {full} are above {KV_FULL:.0%} KV ({names}): its requests wait for memory.",
            troubles,
            [MORE_BACKENDS, *dict.fromkeys(lever for s in serving for lever in _memory_levers(s, memory_kind))],
        )
    waiting = [s for s in up if (s.waiting or 0) > 0]
    if waiting:
        s = max(waiting, key=lambda b: b.waiting or 0)
        if _kv(s) >= KV_FULL:
            return Diagnosis(
                "memory",
                f"Backend {s.name} is saturated: {s.waiting} request(s) wait while its KV cache is {_kv(s):.0%} full.",
                ["New requests go to backends with room; those queued there wait for its memory.", *troubles],
                [MORE_BACKENDS, *_memory_levers(s, memory_kind)],
            )
        return Diagnosis(
            "compute",
            f"Backend {s.name} is compute bound: {s.waiting} request(s) wait although its KV cache has room "
            f"({_kv(s):.0%} used).",
            troubles,
            [MORE_BACKENDS, *(COMPUTE_LEVERS if s.kind == "embedded" else [REMOTE_COMPUTE])],
        )
    if troubles:
        return Diagnosis(
            "down",
            troubles[0],
            [*troubles[1:], f"{len(up)} backend(s) up take the requests meanwhile."],
            ["check the server: the Backends page shows its last error"],
        )
    return Diagnosis("healthy", f"Healthy: {len(up)} backend(s) up, no request is waiting for a seat.")
