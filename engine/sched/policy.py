"""Who waits: the batching policies, parsed from their names once (EngineConfig) and compared as members after."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """fair: continuous batching, tenants admitted by their fair-share counters (engine.sched.fair); fcfs:
    continuous batching in arrival order ("continuous" is the benchmark's name for it); static and sequential: the
    baselines the engine benchmark compares against."""

    FAIR = "fair"
    FCFS = "fcfs"
    CONTINUOUS = "continuous"
    STATIC = "static"
    SEQUENTIAL = "sequential"

    @property
    def continuous(self) -> bool:
        """Seats refilled at every step (fair, fcfs), rather than a batch admitted whole or one at a time."""
        return self in (Policy.FAIR, Policy.FCFS, Policy.CONTINUOUS)
