"""`python -m engine.bench.fair_overhead`: the scheduler's cost per step (schedule + update, no model) under fair
and fcfs with R running and W waiting requests of T tenants, and the cost of one stats snapshot's tenant part."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from engine.block_manager import BlockManager
from engine.messages import QUEUE_SNAPSHOT
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerLimits
from engine.tenant import Tenant


def measure(policy: str, running: int, waiting: int, tenants: int, steps: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    limits = SchedulerLimits(running, 4096, waiting + running + 64, 4096, policy)
    sched = Scheduler(limits, BlockManager(64 * (running + waiting), 16, enable_prefix_caching=False))
    people = [Tenant(f"key-{i}", weight=rng.choice([0.5, 1.0, 2.0])) for i in range(tenants)]
    next_id = 0

    def refill() -> None:
        nonlocal next_id
        while len(sched.waiting) < waiting:
            prompt = [rng.randrange(100, 30000) for _ in range(rng.randint(8, 64))]
            params = SamplingParams(max_tokens=rng.randint(4, 128), ignore_eos=True)
            sched.add_request(Request(f"r{next_id}", prompt, params, time.monotonic(), tenant=rng.choice(people)))
            next_id += 1

    refill()
    times = []
    for step in range(steps + 50):  # the first steps fill the batch
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        assert step < 50 or len(out.scheduled) == running, "the batch is not full: raise the waiting count"
        sampled = {s.request.request_id: 100 for s in out.scheduled if s.samples}  # the runner's part
        t2 = time.perf_counter()
        sched.update(out, sampled)
        t3 = time.perf_counter()
        if step >= 50:
            times.append((t1 - t0) + (t3 - t2))
        refill()
    t0 = time.perf_counter()
    for _ in range(20):
        sched.book.snapshot(time.monotonic())
        [r.request_id for r in sched.waiting.ordered(QUEUE_SNAPSHOT)]
    snapshot = (time.perf_counter() - t0) / 20
    ms = sorted(t * 1000 for t in times)
    return {
        "mean_ms": statistics.fmean(ms),
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[int(len(ms) * 0.99)],
        "snapshot_ms": snapshot * 1000,
        "preemptions": sched.num_preemptions,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.fair_overhead", description=__doc__)
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--waiting", type=int, default=1000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"{args.running} running, {args.waiting} waiting, {args.tenants} tenants, {args.steps} steps")
    results = {}
    for policy in ("fcfs", "fair"):
        r = results[policy] = measure(policy, args.running, args.waiting, args.tenants, args.steps, args.seed)
        print(
            f"{policy:>5}: schedule+update {r['mean_ms']:.3f} ms per step (p50 {r['p50_ms']:.3f}, p99 "
            f"{r['p99_ms']:.3f}); stats snapshot (tenants + queue of {QUEUE_SNAPSHOT}) {r['snapshot_ms']:.3f} ms; "
            f"{r['preemptions']} preemptions"
        )
    extra = results["fair"]["mean_ms"] - results["fcfs"]["mean_ms"]
    print(f"fair costs {extra:+.3f} ms per step over fcfs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
