"""Runs one workload through a batching policy of our engine, or through transformers' continuous batching,
in real time (arrivals honoured), and measures what users would feel."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.engine.workload import BenchRequest
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.messages import RequestOutput
from engine.model.loader import LoadedModel
from engine.sampling_params import SamplingParams
from engine.sched.policy import Policy

Tick = Callable[[int], None]  # called with how many requests finished since the last call


@dataclass(slots=True)
class RequestTimes:
    arrival: float
    scheduled: float
    first_token: float
    finished: float
    output_tokens: int


@dataclass(slots=True)
class RunResult:
    name: str
    requests: list[RequestTimes]
    started: float
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, running, waiting) per step
    kv_usage: list[float] = field(default_factory=list)
    preemptions: int = 0

    def summary(self) -> dict[str, float | str]:
        reqs = self.requests
        end = max(r.finished for r in reqs)
        duration = end - self.started
        tokens = sum(r.output_tokens for r in reqs)
        tpot = [(r.finished - r.first_token) / (r.output_tokens - 1) for r in reqs if r.output_tokens > 1]
        return {
            "name": self.name,
            "requests": len(reqs),
            "output_tokens": tokens,
            "duration_s": duration,
            "output_tokens_per_s": tokens / duration,
            "requests_per_s": len(reqs) / duration,
            "ttft_p50_s": percentile([r.first_token - r.arrival for r in reqs], 50),
            "ttft_p95_s": percentile([r.first_token - r.arrival for r in reqs], 95),
            "queue_wait_p50_s": percentile([r.scheduled - r.arrival for r in reqs], 50),
            "queue_wait_p95_s": percentile([r.scheduled - r.arrival for r in reqs], 95),
            "per_token_latency_p50_s": percentile(tpot, 50),
            "mean_batch_occupancy": statistics.fmean(r for _, r, _ in self.timeline) if self.timeline else float("nan"),
            "kv_utilization": statistics.fmean(self.kv_usage) if self.kv_usage else float("nan"),
            "preemptions": self.preemptions,
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_engine(
    loaded: LoadedModel, config: EngineConfig, policy: Policy, workload: list[BenchRequest], tick: Tick
) -> RunResult:
    core = EngineCore(replace(config, policy=policy), loaded=loaded)
    core.warm_up()
    start = time.monotonic()
    result = RunResult(policy, [], start)
    pending = list(reversed(workload))
    next_id = 0
    while pending or core.has_work():
        now = time.monotonic()
        while pending and start + pending[-1].arrival <= now:
            req = pending.pop()
            params = SamplingParams(max_tokens=req.max_tokens, temperature=0.0, ignore_eos=True)
            core.add_request(f"b{next_id}", req.prompt_token_ids, params, arrival_time=start + req.arrival)
            next_id += 1
        if not core.has_work():
            time.sleep(max(0.0, start + pending[-1].arrival - now))
            continue
        outputs = core.step()
        sched = core.scheduler
        result.timeline.append((time.monotonic() - start, len(sched.running), len(sched.waiting)))
        result.kv_usage.append(core.blocks.usage)
        done = [o for o in outputs if o.finished]
        result.requests.extend(_times(o) for o in done)
        if done:
            tick(len(done))
    result.preemptions = core.scheduler.num_preemptions
    return result


def _times(out: RequestOutput) -> RequestTimes:
    t, u = out.timings, out.usage
    assert t is not None and u is not None and t.scheduled is not None
    assert t.first_token is not None and t.finished is not None
    return RequestTimes(t.arrival, t.scheduled, t.first_token, t.finished, u.completion_tokens)


def run_transformers_cb(
    loaded: LoadedModel, config: EngineConfig, num_blocks: int, workload: list[BenchRequest], tick: Tick
) -> RunResult:
    """The same workload through transformers' ContinuousBatchingManager on the same weights."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    model = loaded.model
    ours = model.config._attn_implementation
    model.config._attn_implementation = "sdpa"
    try:
        gen = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_tokens for r in workload), pad_token_id=0)
        cb = ContinuousBatchingConfig(
            page_size=config.block_size,
            num_blocks=num_blocks,
            max_batch_tokens=config.max_num_batched_tokens,
            max_requests_per_batch=config.max_num_seqs,
            auto_switch_to_flash=False,
            use_cuda_graph=False,
        )
        init = model.init_continuous_batching
        manager = init(generation_config=gen, continuous_batching_config=cb)  # type: ignore[operator]
        manager.start()
        try:
            return _drive_transformers(manager, workload, tick)
        finally:
            manager.stop(block=True)
            destroy = getattr(model, "destroy_cached_continuous_batching_manager", None)
            if destroy is not None:
                destroy()
    finally:
        model.config._attn_implementation = ours


def _drive_transformers(manager: object, workload: list[BenchRequest], tick: Tick) -> RunResult:
    start = time.perf_counter()
    result = RunResult("transformers-cb", [], start)
    arrivals: dict[str, float] = {}
    pending = list(reversed(list(enumerate(workload))))
    while len(result.requests) < len(workload):
        now = time.perf_counter()
        while pending and start + pending[-1][1].arrival <= now:
            i, req = pending.pop()
            rid = f"t{i}"
            arrivals[rid] = start + req.arrival
            manager.add_request(  # type: ignore[attr-defined]
                req.prompt_token_ids,
                request_id=rid,
                max_new_tokens=req.max_tokens,
                record_timestamps=True,
                eos_token_id=-1,
            )
        wait = 0.01 if not pending else max(0.0, min(0.01, start + pending[-1][1].arrival - now))
        out = manager.get_result(timeout=wait)  # type: ignore[attr-defined]
        if out is None or not out.is_finished():
            continue
        if out.error:
            raise RuntimeError(f"transformers CB failed request {out.request_id}: {out.error}")
        stamps = out.timestamps or [out.lifespan[1]]
        result.requests.append(
            RequestTimes(
                arrivals[out.request_id], out.lifespan[0], stamps[0], out.lifespan[1], len(out.generated_tokens)
            )
        )
        tick(1)
    return result


def measure_overhead(loaded: LoadedModel, config: EngineConfig, running: int = 64, steps: int = 30) -> dict[str, float]:
    """Engine time per decode step that is not the model forward, with `running` requests in the batch: the
    sampling kernel, and the bookkeeping (scheduling, building the batch, detokenizing, outputs)."""
    import engine.model.runner as runner_module

    core = EngineCore(
        replace(config, max_num_seqs=max(running, config.max_num_seqs), policy=Policy.CONTINUOUS), loaded=loaded
    )
    params = SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True)
    for i in range(running):
        core.add_request(f"o{i}", [100 + i, 200 + i, 300 + i, 400 + i], params)
    while len(core.scheduler.running) < running or any(r.num_computed_tokens == 0 for r in core.scheduler.running):
        core.step()
    spent = {"forward": 0.0, "sampling": 0.0}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    runner = core.runner  # the forward: the engine's own or the model's, whichever the runner calls
    sample = runner_module.sample
    runner._logits = timed("forward", runner._logits)  # type: ignore[method-assign]
    runner_module.sample = timed("sampling", sample)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            core.step()
        total = time.perf_counter() - t0
    finally:
        del runner._logits
        runner_module.sample = sample
    ms = 1000 / steps
    return {
        "running": running,
        "step_ms": total * ms,
        "forward_ms": spent["forward"] * ms,
        "overhead_ms": (total - spent["forward"]) * ms,
        "sampling_ms": spent["sampling"] * ms,
        "bookkeeping_ms": (total - spent["forward"] - spent["sampling"]) * ms,
    }
