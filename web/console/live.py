"""The live panel's numbers from the engine's in-memory stats snapshot: engine state, the memory headroom split,
KV use, queue and latency percentiles, throughput from counter deltas between polls."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from engine import EngineState, EngineStats
from web.generation.gate import EngineGate
from web.system.metrics import percentile

THROUGHPUT_WINDOW_S = 10.0


@dataclass(slots=True)
class ThroughputMeter:
    """Generated tokens per second over the last few polls, from the engine's monotonic token counter."""

    clock: Callable[[], float] = time.monotonic
    window_s: float = THROUGHPUT_WINDOW_S
    _points: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, generated_total: int) -> float | None:
        now = self.clock()
        points = self._points
        if points and generated_total < points[-1][1]:  # the engine restarted: its counters began again
            points.clear()
        while points and now - points[0][0] > 3 * self.window_s:  # nobody polled for a while: start afresh
            points.popleft()
        points.append((now, generated_total))
        while len(points) > 2 and now - points[1][0] >= self.window_s:
            points.popleft()
        (t0, n0), (t1, n1) = points[0], points[-1]
        return (n1 - n0) / (t1 - t0) if t1 - t0 >= 0.5 else None


class EngineLabel(StrEnum):
    """The engine as the console shows it (down also while restarting after a crash: the reason says so)."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class EngineView:
    label: EngineLabel
    reason: str
    model: str | None
    restarts: int = 0  # engine restarts after a crash since the server started
    last_exit: str | None = None  # why the engine last died, once it has


def engine_state(gate: EngineGate) -> EngineView:
    ready, reason = gate.readiness()
    state = gate.client.state
    if gate.draining or gate.switch_draining or state == EngineState.STOPPING:
        label = EngineLabel.DRAINING
    elif ready:
        label = EngineLabel.READY
    elif state in (EngineState.LOADING, EngineState.STOPPED) and gate.start_error is None and not gate.crashed:
        label = EngineLabel.LOADING
    else:
        label = EngineLabel.DOWN
    restarts = gate.client.restarts
    return EngineView(label, reason, gate.model_name, restarts, gate.client.last_error if restarts else None)


@dataclass(frozen=True, slots=True)
class Segment:
    key: str
    label: str
    bytes: int
    start: float  # fraction of the total where the segment begins
    width: float  # fraction of the total


def _tokens_per_s(s: EngineStats, meter: ThroughputMeter | None) -> float | None:
    """The meter's rate, but 0 while the engine has nothing to do: the meter averages over ~10 s, and a burst
    that just ended would otherwise show a falling rate on an idle engine."""
    if meter is None:
        return None
    rate = meter.observe(s.generation_tokens_total)
    return 0.0 if s.running == 0 and s.waiting == 0 else rate


def memory_segments(s: EngineStats) -> list[Segment]:
    """The device memory split: weights, KV in use, the KV pool's unused rest, other use, free."""
    total = max(s.device_memory_total, 1)
    kv_used = int(s.kv_pool_bytes * s.kv_usage)
    free = max(min(s.device_memory_free, total), 0)
    other = max(total - free - s.weights_bytes - s.kv_pool_bytes, 0)
    kv = "KV" if s.kv_cache_dtype == "auto" else f"KV ({s.kv_cache_dtype})"  # an 8-bit pool holds ~2x the tokens
    parts = [
        ("weights", "model weights", s.weights_bytes),
        ("kv-used", f"{kv} in use", kv_used),
        ("kv-pool", f"{kv} pool, unused", s.kv_pool_bytes - kv_used),
        ("other", "other use", other),
        ("free", "free", free),
    ]
    segments, start = [], 0.0
    for key, label, size in parts:
        width = min(size / total, max(1.0 - start, 0.0))
        segments.append(Segment(key, label, size, start, width))
        start += width
    return segments


@dataclass(frozen=True, slots=True)
class LiveView:
    stats: EngineStats | None
    memory_kind: str
    segments: list[Segment]
    kv_usage: float | None
    queue_wait_p50: float | None
    queue_wait_p95: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    tokens_per_s: float | None
    prefix_hit_rate: float | None
    in_flight: int


def live_view(stats: EngineStats | None, in_flight: int, meter: ThroughputMeter | None = None) -> LiveView:
    """`meter` is given by the one partial that owns throughput, so each poll counts once."""
    s = stats
    if s is None:
        return LiveView(None, "memory", [], None, None, None, None, None, None, None, in_flight)
    return LiveView(
        stats=s,
        memory_kind=s.memory_kind,
        segments=memory_segments(s),
        kv_usage=s.kv_usage,
        queue_wait_p50=percentile(s.recent_queue_wait, 0.5),
        queue_wait_p95=percentile(s.recent_queue_wait, 0.95),
        ttft_p50=percentile(s.recent_ttft, 0.5),
        ttft_p95=percentile(s.recent_ttft, 0.95),
        tokens_per_s=_tokens_per_s(s, meter),
        prefix_hit_rate=s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else None,
        in_flight=in_flight,
    )
